package gateway

import (
	"bytes"
	"errors"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmgate/llmgate/internal/sim"
)

// TestPassThroughRoutes: moderations, images, audio, files and batches
// reach the provider through the official SDK, authenticated, with their
// usage recorded when the answer carries it.
func TestPassThroughRoutes(t *testing.T) {
	h := newHarness(t, harnessConfig{sim: sim.Config{Models: []string{"gpt-4.1", "gpt-4.1-mini", "gpt-image-1", "gpt-4o-transcribe", "omni-moderation-latest"}},
		edit: func(o *Options, h *harness) {
			route := o.Route
			o.Route = func(m string) ([]string, bool) {
				if strings.HasPrefix(m, "gpt-image") || strings.HasSuffix(m, "transcribe") {
					return []string{"sim/gpt-4.1"}, true // the sim deployment stands for them
				}
				return route(m)
			}
		}})
	client := h.client(tenantKey)
	ctx := t.Context()

	if _, err := client.Moderations.New(ctx, openai.ModerationNewParams{Input: openai.ModerationNewParamsInputUnion{OfString: openai.String("hi")}}); err != nil {
		t.Fatalf("moderation: %v", err)
	}
	img, err := client.Images.Generate(ctx, openai.ImageGenerateParams{Model: "gpt-image-1", Prompt: "a token bucket"})
	if err != nil || len(img.Data) != 1 || img.Usage.InputTokens == 0 {
		t.Fatalf("image: %v %+v", err, img)
	}
	tr, err := client.Audio.Transcriptions.New(ctx, openai.AudioTranscriptionNewParams{Model: "gpt-4o-transcribe",
		File: openai.File(bytes.NewReader(bytes.Repeat([]byte{1, 2, 3}, 500)), "a.wav", "audio/wav")})
	if err != nil || tr.Text == "" {
		t.Fatalf("transcription: %v %+v", err, tr)
	}
	f, err := client.Files.New(ctx, openai.FileNewParams{File: openai.File(strings.NewReader(`{"custom_id":"1"}`+"\n"), "in.jsonl", "application/jsonl"), Purpose: openai.FilePurposeBatch})
	if err != nil || !strings.HasPrefix(f.ID, "file-") {
		t.Fatalf("file: %v %+v", err, f)
	}
	if got, err := client.Files.Get(ctx, f.ID); err != nil || got.ID != f.ID {
		t.Fatalf("get file: %v %+v", err, got)
	}
	b, err := client.Batches.New(ctx, openai.BatchNewParams{InputFileID: f.ID, Endpoint: openai.BatchNewParamsEndpointV1ChatCompletions, CompletionWindow: openai.BatchNewParamsCompletionWindow24h})
	if err != nil || b.InputFileID != f.ID {
		t.Fatalf("batch: %v %+v", err, b)
	}

	// Unauthenticated: refused before the provider.
	bad := openai.NewClient(option.WithBaseURL(h.url+"/v1/"), option.WithAPIKey("sk-wrong"), option.WithMaxRetries(0))
	_, err = bad.Files.Get(ctx, f.ID)
	var apiErr *openai.Error
	if !errors.As(err, &apiErr) || apiErr.StatusCode != http.StatusUnauthorized {
		t.Fatalf("a wrong key: %v", err)
	}
	// Unknown routes: 404 in OpenAI's shape unless configured otherwise.
	resp := h.post("/v1/vector_stores", tenantKey, `{}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || !strings.Contains(string(body), `"code":"unknown_url"`) {
		t.Fatalf("unknown route: %d %s", resp.StatusCode, body)
	}

	if err := h.gw.Close(ctx); err != nil {
		t.Fatal(err)
	}
	rows, err := h.budgets.Usage(ctx, "team-a", time.Now().UTC().Format("2006-01"))
	if err != nil {
		t.Fatal(err)
	}
	var requests, prompt int64
	for _, r := range rows {
		requests, prompt = requests+r.Requests, prompt+r.PromptTokens
	}
	// Moderation, image, transcription (the files and batch are not model routes).
	if requests != 3 || prompt < img.Usage.InputTokens {
		t.Fatalf("usage rows %+v: want 3 requests with the image's %d input tokens", rows, img.Usage.InputTokens)
	}
}

// TestUnknownRoutesPassed: with PassThrough.Unknown, an unknown /v1/ route
// goes to the default deployment (here the simulator's own 404).
func TestUnknownRoutesPassed(t *testing.T) {
	h := newHarness(t, harnessConfig{edit: func(o *Options, _ *harness) { o.PassThrough.Unknown = true }})
	resp := h.post("/v1/vector_stores", tenantKey, `{}`)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound || resp.Header.Get("X-Llmgate-Deployment") == "" || !strings.Contains(string(body), "Invalid URL (POST /v1/vector_stores)") {
		t.Fatalf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
	if resp := h.post("/healthz2", tenantKey, `{}`); resp.StatusCode != http.StatusNotFound || resp.Header.Get("X-Llmgate-Deployment") != "" {
		t.Fatalf("a route outside /v1/ was passed: %d", resp.StatusCode)
	}
}

func TestRequestModel(t *testing.T) {
	var buf bytes.Buffer
	mw := multipart.NewWriter(&buf)
	fw, _ := mw.CreateFormFile("file", "a.wav")
	_, _ = fw.Write([]byte("audio"))
	_ = mw.WriteField("model", "whisper-1")
	_ = mw.Close()
	if m := requestModel(mw.FormDataContentType(), buf.Bytes()); m != "whisper-1" {
		t.Fatalf("multipart model %q", m)
	}
	if m := requestModel("application/json", []byte(`{"model":"gpt-image-1"}`)); m != "gpt-image-1" {
		t.Fatalf("JSON model %q", m)
	}
	for _, tc := range [][2]string{{"multipart/form-data", "x"}, {"multipart/form-data; boundary=zz", "--zz\r\nbroken"}, {"", "not json"}} {
		if m := requestModel(tc[0], []byte(tc[1])); m != "" {
			t.Errorf("%q: model %q", tc, m)
		}
	}
}

func FuzzRequestModel(f *testing.F) {
	f.Add("multipart/form-data; boundary=b", []byte("--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--b--\r\n"))
	f.Add("application/json", []byte(`{"model":"m"}`))
	f.Fuzz(func(t *testing.T, ct string, body []byte) {
		if m := requestModel(ct, body); len(m) > maxModelBytes {
			t.Fatalf("model of %d bytes", len(m))
		}
	})
}

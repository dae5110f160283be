package app

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/testutil"
)

func TestMockHelp(t *testing.T) {
	for _, args := range [][]string{{"mock", "--help"}, {"help", "mock"}} {
		code, stdout, stderr := runApp(t, nil, args...)
		if code != 0 || stderr != "" || !strings.Contains(stdout, "--error-rate F") || !strings.Contains(stdout, "llmgate mock [flags]") {
			t.Fatalf("%q: exit %d, stdout %q, stderr %q", args, code, stdout, stderr)
		}
	}
	if _, stdout, _ := runApp(t, nil, "help"); !strings.Contains(stdout, "\n  mock ") {
		t.Fatalf("help does not list mock:\n%s", stdout)
	}
}

func TestMockBadArguments(t *testing.T) {
	for _, tc := range []struct {
		args []string
		code int
		want string
	}{
		{[]string{"--error-rate", "2"}, 2, "llmgate mock: --error-rate is 2; it is a fraction between 0 and 1"},
		{[]string{"--rpm", "-5", "--drop-rate", "-1"}, 2, "--rpm is -5"},
		{[]string{"--rpm", "many"}, 2, "invalid value \"many\" for flag --rpm"},
		{[]string{"--ttft", "soon"}, 2, "want a duration such as 500ms"},
		{[]string{"--frobnicate"}, 2, "--frobnicate"},
		{[]string{"extra"}, 2, `unexpected argument "extra"`},
		{[]string{"--api-keys-env", "LLMGATE_TEST_NO_SUCH_VAR"}, 2, "--api-keys-env LLMGATE_TEST_NO_SUCH_VAR: the variable is empty or unset"},
		{[]string{"--listen", "256.1.1.1:80"}, 1, "llmgate mock: cannot listen on 256.1.1.1:80"},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			code, stdout, stderr := runApp(t, nil, append([]string{"mock"}, tc.args...)...)
			line := oneLine(t, stderr)
			if code != tc.code || stdout != "" || !strings.Contains(line, tc.want) {
				t.Fatalf("exit %d, stdout %q, stderr %q; want exit %d and %q", code, stdout, stderr, tc.code, tc.want)
			}
		})
	}
}

var listeningRE = regexp.MustCompile(`listening on (http://[0-9.:]+) `)

func TestMockServesUntilCancelled(t *testing.T) {
	errOut := testutil.NewBuffer()
	a := &App{Stdout: io.Discard, Stderr: errOut, Getenv: func(k string) string {
		return map[string]string{"MOCK_KEYS": "sk-one, sk-two"}[k]
	}}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan int, 1)
	go func() {
		done <- a.runMock(ctx, []string{"--listen", "127.0.0.1:0", "--rpm", "1", "--api-keys-env", "MOCK_KEYS", "--models", "m1"})
	}()
	errOut.WaitFor(t, "listening on", 10*time.Second)
	m := listeningRE.FindStringSubmatch(errOut.String())
	if m == nil {
		t.Fatalf("no address in %q", errOut.String())
	}
	post := func(key string) int {
		req, _ := http.NewRequestWithContext(t.Context(), "POST", m[1]+"/v1/chat/completions",
			strings.NewReader(`{"model":"m1","messages":[{"role":"user","content":"hi"}]}`))
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		_, _ = io.Copy(io.Discard, resp.Body)
		return resp.StatusCode
	}
	if got := []int{post("sk-two"), post("sk-two"), post("sk-bad")}; got[0] != 200 || got[1] != 429 || got[2] != 401 {
		t.Fatalf("statuses %v, want [200 429 401]", got)
	}
	resp, err := http.Get(m[1] + "/stats")
	if err != nil {
		t.Fatal(err)
	}
	var st struct {
		Total struct {
			Calls       int64 `json:"calls"`
			RateLimited int64 `json:"rate_limited"`
		} `json:"total"`
	}
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || st.Total.Calls != 1 || st.Total.RateLimited != 1 {
		t.Fatalf("stats %+v (%v)", st, err)
	}
	cancel()
	select {
	case code := <-done:
		if code != 0 || !strings.Contains(errOut.String(), "served 1 calls, sent 1 429s") {
			t.Fatalf("exit %d, stderr %q", code, errOut.String())
		}
	case <-time.After(runTimeout):
		t.Fatalf("mock did not stop; stderr %q", errOut.String())
	}
}

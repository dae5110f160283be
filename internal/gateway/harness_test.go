package gateway

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/llmgate/llmgate/budget"
	budgetmemory "github.com/llmgate/llmgate/budget/memory"
	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/dedup"
	dedupmemory "github.com/llmgate/llmgate/dedup/memory"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
)

// Keys the tests use. The provider key must never show up in logs.
const (
	providerKey = "sk-provider-secret-0123456789"
	tenantKey   = "sk-team-a-secret"
	batchKey    = "sk-batch-secret"
	adminToken  = "admin-secret-token"
)

func sha(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// harness is a gateway on the memory stores in front of a simulated
// provider, both on loopback HTTP servers.
type harness struct {
	t       *testing.T
	sim     *sim.Server
	simURL  string
	gw      *Gateway
	url     string
	logs    *testutil.Buffer
	up      *provider.Client
	teamA   *Tenant
	batch   *Tenant
	budgets *budget.Manager
}

type harnessConfig struct {
	sim      sim.Config
	provider provider.Config
	// edit changes the gateway options before New.
	edit func(o *Options, h *harness)
	// hideLimits drops the simulator's x-ratelimit-* headers from every
	// answer, 429s included, as providers that do not advertise their
	// quota do: the gateway then learns it only from a 429's message.
	hideLimits bool
}

// hideRateHeaders drops the x-ratelimit-* headers of every answer of next.
func hideRateHeaders(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		next.ServeHTTP(&headerHider{ResponseWriter: w}, r)
	})
}

type headerHider struct {
	http.ResponseWriter
	wrote bool
}

func (w *headerHider) WriteHeader(code int) {
	if !w.wrote {
		w.wrote = true
		for k := range w.Header() {
			if strings.HasPrefix(k, "X-Ratelimit-") {
				w.Header().Del(k)
			}
		}
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *headerHider) Write(b []byte) (int, error) {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(b)
}

func (w *headerHider) Flush() {
	if !w.wrote {
		w.WriteHeader(http.StatusOK)
	}
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *headerHider) Unwrap() http.ResponseWriter { return w.ResponseWriter }

var simModels = []string{"gpt-4.1", "gpt-4.1-mini", "text-embedding-3-small"}

// memoryBudgets returns a budget manager on a fresh memory backend.
func memoryBudgets(tb testing.TB) *budget.Manager {
	tb.Helper()
	bb, err := budgetmemory.Open(budgetmemory.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	bm, err := budget.New(bb, budget.Config{})
	if err != nil {
		tb.Fatal(err)
	}
	return bm
}

func newHarness(t *testing.T, hc harnessConfig) *harness {
	t.Helper()
	h := &harness{t: t, logs: testutil.NewBuffer()}
	if hc.sim.APIKeys == nil {
		hc.sim.APIKeys = []string{providerKey}
	}
	if hc.sim.Models == nil {
		hc.sim.Models = []string{"gpt-4.1", "gpt-4.1-mini"}
	}
	s, err := sim.New(hc.sim)
	if err != nil {
		t.Fatal(err)
	}
	h.sim = s
	var simHandler http.Handler = s.Handler()
	if hc.hideLimits {
		simHandler = hideRateHeaders(simHandler)
	}
	simSrv := httptest.NewServer(simHandler)
	t.Cleanup(simSrv.Close)
	h.simURL = simSrv.URL + "/v1"

	log := slog.New(slog.NewTextHandler(h.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	var gw *Gateway
	pc := hc.provider
	pc.Logger = log
	if pc.BackoffBase == 0 {
		pc.BackoffBase = time.Millisecond
		pc.BackoffMax = 20 * time.Millisecond
	}
	pc.Feedback = func(t *provider.Target, f provider.Feedback) { gw.Feedback(t, f) }
	up, err := provider.New(pc)
	if err != nil {
		t.Fatal(err)
	}
	h.up = up
	bm := memoryBudgets(t)
	h.budgets = bm
	h.teamA = &Tenant{Name: "team-a"}
	h.batch = &Tenant{Name: "batch-jobs", Priority: ratelimit.Batch}
	opt := Options{
		Route: func(model string) ([]string, bool) {
			switch model {
			case "fast":
				return []string{"sim/gpt-4.1-mini"}, true
			case "gpt-4.1", "gpt-4.1-mini", "text-embedding-3-small":
				return []string{"sim/" + model}, true
			}
			return nil, false
		},
		Limiter:          ratelimit.New(rlmemory.New(clock.Real{})),
		Budgets:          bm,
		Upstream:         up,
		Tenants:          map[string]*Tenant{sha(tenantKey): h.teamA, sha(batchKey): h.batch},
		Logger:           log,
		AdminTokenSHA256: sha(adminToken),
		Dedup: DedupOptions{
			Group:         dedup.New(dedupmemory.New(clock.Real{}), dedup.Options{LeaseTTL: time.Second}),
			Deterministic: true,
		},
		Cache: CacheOptions{Store: respcache.NewMemory(64<<20, clock.Real{})},
	}
	for _, m := range simModels {
		opt.Deployments = append(opt.Deployments, Deployment{
			Name: "sim/" + m, Provider: "sim", Model: m,
			Target: provider.Target{Name: "sim/" + m, BaseURL: h.simURL, APIKey: providerKey},
		})
		opt.Models = append(opt.Models, Model{ID: m, OwnedBy: "sim"})
	}
	opt.Models = append(opt.Models, Model{ID: "fast", OwnedBy: "llmgate"})
	if hc.edit != nil {
		hc.edit(&opt, h)
	}
	gw, err = New(opt)
	if err != nil {
		t.Fatal(err)
	}
	h.gw = gw
	url, stop := serveGateway(gw.Handler())
	t.Cleanup(func() {
		stop()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := gw.Close(ctx); err != nil {
			t.Errorf("gateway close: %v", err)
		}
		if strings.Contains(h.logs.String(), providerKey) || strings.Contains(h.logs.String(), tenantKey) {
			t.Errorf("a key appeared in the logs:\n%s", h.logs.String())
		}
	})
	h.url = url
	return h
}

// serveGateway serves h on a loopback port with net/http's server, as
// llmgate serve does, and returns its URL and how to stop it.
func serveGateway(h http.Handler) (string, func()) {
	srv := httptest.NewServer(h)
	return srv.URL, srv.Close
}

// client returns an official SDK client for the gateway with key.
func (h *harness) client(key string) openai.Client {
	return openai.NewClient(
		option.WithBaseURL(h.url+"/v1/"),
		option.WithAPIKey(key),
		option.WithMaxRetries(0),
	)
}

// post sends a raw request to the gateway.
func (h *harness) post(path, key, body string, hdr ...string) *http.Response {
	h.t.Helper()
	req, err := http.NewRequestWithContext(h.t.Context(), http.MethodPost, h.url+path, strings.NewReader(body))
	if err != nil {
		h.t.Fatal(err)
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	return resp
}

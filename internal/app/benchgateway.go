package app

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"time"

	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/gateway"
	"github.com/llmgate/llmgate/internal/gatewaybench"
	"github.com/llmgate/llmgate/internal/sim"
)

const (
	// benchProviderKeyEnv is the variable, private to the benchmark's
	// getenv, that holds the upstream key the gateway sends to the
	// simulated provider (which accepts any key).
	benchProviderKeyEnv = "LLMGATE_BENCH_PROVIDER_KEY"
	// benchLimit is the RPM and TPM of the benchmark's deployments and
	// tenant: far above anything a benchmark reaches, so that every
	// request is admitted, yet the limits are checked and settled as in
	// production.
	benchLimit = 1 << 40
	// benchCloseTimeout bounds the wait for usage still being recorded
	// when a benchmark gateway is released.
	benchCloseTimeout = 30 * time.Second
)

// benchGateway is a gateway handler that lets the benchmark wait for the
// usage its requests are still recording in the background.
type benchGateway struct {
	http.Handler
	gw *gateway.Gateway
}

// Drain waits until every request answered so far has been recorded.
func (b benchGateway) Drain(ctx context.Context) error { return b.gw.Close(ctx) }

var _ gatewaybench.Drainer = benchGateway{}

// benchConfig is the configuration of a benchmark gateway: the built-in
// defaults, store, one OpenAI-type provider at upstreamBaseURL serving the
// simulator's models, and one tenant with a key, so that authentication,
// admission and accounting all run.
func benchConfig(store, upstreamBaseURL, stateDir string, getenv func(string) string) (*config.Config, error) {
	models := append(append([]string(nil), sim.DefaultModels...), sim.DefaultEmbeddingModels...)
	cfg := &config.Config{
		Store:    store,
		StateDir: stateDir,
		MaxWait:  config.DefaultMaxWait,
		Log:      config.Log{Level: "warn"},
		Providers: []config.Provider{{
			Name:      "sim",
			Type:      config.TypeOpenAI,
			BaseURL:   upstreamBaseURL,
			APIKeyEnv: benchProviderKeyEnv,
			Models:    models,
			Limits:    config.Limits{RPM: benchLimit, TPM: benchLimit},
		}},
		Tenants: []config.Tenant{{
			Name:         "bench",
			APIKeySHA256: config.HashKey(gatewaybench.TenantKey),
			Limits:       config.Limits{RPM: benchLimit, TPM: benchLimit},
		}},
		Source: "llmgate bench gateway",
	}
	cfg.SetDefaults(getenv)
	if err := cfg.Validate(getenv); err != nil {
		return nil, err
	}
	return cfg, nil
}

// benchGatewayFactory builds the llmgate variants of `llmgate bench
// gateway` with the wiring `llmgate serve` uses (startServer). Warnings and
// errors are logged to a.Stderr.
func (a *App) benchGatewayFactory(ctx context.Context, variant, store, upstreamBaseURL string) (http.Handler, func(), error) {
	// The memory store persists budgets and usage: in a directory of
	// its own, removed afterwards.
	dir, err := os.MkdirTemp("", "llmgate-bench-state-")
	if err != nil {
		return nil, nil, fmt.Errorf("state directory: %w", err)
	}
	getenv := func(k string) string {
		if k == benchProviderKeyEnv {
			return "sk-llmgate-bench-upstream"
		}
		return ""
	}
	cfg, err := benchConfig(store, upstreamBaseURL, dir, getenv)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	if variant == gatewaybench.VariantRedisStrict {
		off := false
		cfg.RateLimit.LocalQuota = &off
	}
	b := &App{Stdin: a.Stdin, Stdout: a.Stdout, Stderr: a.Stderr, Getenv: getenv, Environ: func() []string { return nil }}
	// The secrets are redacted as in llmgate serve: that costs a scan of
	// every answer.
	secrets, err := configSecrets(cfg, getenv)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	s, err := b.startServer(cfg, newLogger(a.Stderr, cfg.Log, secrets), secrets)
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, nil, err
	}
	release := func() {
		cctx, cancel := context.WithTimeout(context.Background(), benchCloseTimeout)
		defer cancel()
		if err := s.gw.Close(cctx); err != nil {
			slog.New(slog.NewTextHandler(a.Stderr, nil)).Warn("benchmark gateway: some usage was not recorded before exit", "err", err)
		}
		s.close()
		_ = os.RemoveAll(dir)
	}
	return benchGateway{Handler: s.gw.Handler(), gw: s.gw}, release, nil
}

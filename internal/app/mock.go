package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/llmgate/llmgate/internal/sim"
)

// exitFailure is a run-time failure that is not a usage error (the
// address cannot be listened on).
const exitFailure = 1

// mockGrace is how long in-flight requests may finish after SIGINT/SIGTERM
// before their connections are cut.
const mockGrace = 5 * time.Second

const mockUsageText = `Usage:
  llmgate mock [flags]

Runs the built-in simulated OpenAI-compatible provider: chat and legacy
completions and the Responses API (JSON and SSE streaming), embeddings and
models, Anthropic's Messages API and Azure OpenAI's deployment paths, with
deterministic answers, configurable latency, RPM/TPM/concurrency limits
answered with OpenAI's 429s, and fault injection. GET /stats reports what it served. It stops on SIGINT or
SIGTERM, letting requests in flight finish for up to 5s. See docs/mock.md.

Flags:
  --listen ADDR            address to listen on (default 127.0.0.1:8090)
  --rpm N                  requests per minute per API key and model (default 0 = unlimited)
  --tpm N                  tokens per minute per API key and model; a request costs
                           its prompt estimate plus max_tokens (default 0 = unlimited)
  --concurrency N          requests in flight per API key (default 0 = unlimited)
  --itpm N, --otpm N       input and output tokens per minute per API key and model
                           on /v1/messages, as Anthropic limits (default 0 = unlimited)
  --ttft D                 time to first token, e.g. 300ms (default 0)
  --token-delay D          delay between completion tokens, e.g. 20ms (default 0)
  --jitter F               scale each delay by a random factor in [1-F, 1+F] (default 0)
  --error-rate F           fraction of requests answered 500 or 503 (default 0)
  --drop-rate F            fraction of streams whose connection is cut halfway (default 0)
  --models LIST            comma-separated chat models (default gpt-4.1,gpt-4.1-mini,gpt-4o-mini)
  --embedding-models LIST  comma-separated embedding models (default text-embedding-3-small)
  --dimensions N           embedding length when the request sets none (default 1536)
  --api-keys-env NAME      accept only the comma-separated keys in environment
                           variable NAME (default: any key, or none)
  --seed N                 seed of fault injection and jitter (default 0 = random)
`

// mockConfig is the parsed command line of llmgate mock.
type mockConfig struct {
	listen string
	sim    sim.Config
}

// parseMockArgs parses args after 'mock'; getenv reads --api-keys-env.
func parseMockArgs(args []string, getenv func(string) string) (mockConfig, error) {
	c := mockConfig{listen: "127.0.0.1:8090"}
	var models, embModels, keysEnv string
	fs := flag.NewFlagSet("llmgate mock", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	fs.StringVar(&c.listen, "listen", c.listen, "")
	fs.Int64Var(&c.sim.RPM, "rpm", 0, "")
	fs.Int64Var(&c.sim.TPM, "tpm", 0, "")
	fs.Int64Var(&c.sim.Concurrency, "concurrency", 0, "")
	fs.Int64Var(&c.sim.ITPM, "itpm", 0, "")
	fs.Int64Var(&c.sim.OTPM, "otpm", 0, "")
	fs.Var(durationFlag{&c.sim.TTFT}, "ttft", "")
	fs.Var(durationFlag{&c.sim.TokenDelay}, "token-delay", "")
	fs.Float64Var(&c.sim.Jitter, "jitter", 0, "")
	fs.Float64Var(&c.sim.ErrorRate, "error-rate", 0, "")
	fs.Float64Var(&c.sim.DropRate, "drop-rate", 0, "")
	fs.StringVar(&models, "models", "", "")
	fs.StringVar(&embModels, "embedding-models", "", "")
	fs.IntVar(&c.sim.EmbeddingDimensions, "dimensions", 0, "")
	fs.StringVar(&keysEnv, "api-keys-env", "", "")
	fs.Uint64Var(&c.sim.Seed, "seed", 0, "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return c, errHelp
		}
		return c, fmt.Errorf("%s; see 'llmgate mock --help'", twoDashes(err.Error()))
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected argument %q; llmgate mock takes only flags", fs.Arg(0))
	}
	c.sim.Models = splitList(models)
	c.sim.EmbeddingModels = splitList(embModels)
	if keysEnv != "" {
		c.sim.APIKeys = splitList(getenv(keysEnv))
		if len(c.sim.APIKeys) == 0 {
			return c, fmt.Errorf("--api-keys-env %s: the variable is empty or unset; put the accepted keys in it, comma-separated", keysEnv)
		}
	}
	if err := c.sim.Validate(); err != nil {
		// One line per problem, in the flags' words.
		msg := strings.ReplaceAll(err.Error(), "\n", "; ")
		for field, flagName := range map[string]string{
			"sim: RPM": "--rpm", "sim: TPM": "--tpm", "sim: Concurrency": "--concurrency", "sim: TTFT": "--ttft",
			"sim: TokenDelay": "--token-delay", "sim: Jitter": "--jitter", "sim: ErrorRate": "--error-rate",
			"sim: DropRate": "--drop-rate", "sim: EmbeddingDimensions": "--dimensions", "sim: ITPM": "--itpm",
		} {
			msg = strings.ReplaceAll(msg, field+" is", flagName+" is")
		}
		return c, errors.New(strings.ReplaceAll(msg, "sim: ", ""))
	}
	return c, nil
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func (a *App) mock(args []string) int {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	return a.runMock(ctx, args)
}

// runMock serves the simulated provider until ctx ends.
func (a *App) runMock(ctx context.Context, args []string) int {
	c, err := parseMockArgs(args, a.Getenv)
	if errors.Is(err, errHelp) {
		fmt.Fprint(a.Stdout, mockUsageText)
		return exitOK
	}
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate mock: %v\n", err)
		return exitUsage
	}
	s, err := sim.New(c.sim)
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate mock: %v\n", err)
		return exitUsage
	}
	ln, err := net.Listen("tcp", c.listen)
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate mock: cannot listen on %s: %v\n", c.listen, err)
		return exitFailure
	}
	base, cancelBase := context.WithCancel(context.Background())
	defer cancelBase()
	srv := &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: 10 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return base },
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(a.Stderr, "llmgate mock: listening on http://%s (OpenAI base URL http://%s/v1)\n", ln.Addr(), ln.Addr())

	select {
	case err := <-served:
		fmt.Fprintf(a.Stderr, "llmgate mock: %v\n", err)
		return exitFailure
	case <-ctx.Done():
	}
	fmt.Fprintln(a.Stderr, "llmgate mock: shutting down")
	sctx, cancel := context.WithTimeout(context.Background(), mockGrace)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		cancelBase() // stop the handlers still sleeping, then cut their connections
		_ = srv.Close()
	}
	<-served
	t := s.Stats().Total
	fmt.Fprintf(a.Stderr, "llmgate mock: served %d calls, sent %d 429s, injected %d errors, dropped %d streams, counted %d prompt and %d completion tokens\n",
		t.Calls, t.RateLimited, t.ErrorsInjected, t.StreamsDropped, t.PromptTokens, t.CompletionTokens)
	return exitOK
}

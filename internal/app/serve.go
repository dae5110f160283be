package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/connlimit"
	"github.com/llmgate/llmgate/internal/redact"
	"github.com/llmgate/llmgate/internal/storeurl"
)

// settleWait bounds the last step of a shutdown: waiting for the requests
// cut at the end of the grace to end, and for every request's settle and
// usage record (each settle's store calls are bounded by as much).
const settleWait = 10 * time.Second

const serveUsageText = `Usage:
  llmgate serve [--config FILE] [--listen ADDR]

Runs the OpenAI-compatible gateway. Point any OpenAI SDK's base URL at
http://ADDR/v1. Without --config, and with no OPENAI_API_KEY in the
environment, it starts on the embedded default: the memory store and the
built-in simulated provider. On SIGINT or SIGTERM, /readyz fails for
server.drain_delay (5s) while requests are still served, then the listener
closes and requests in flight have server.shutdown_grace (30s) to finish;
those still running are cut and charged what they used. A second signal
skips what is left of both waits. See docs/gateway.md and docs/config.md.

Flags:
  --config FILE   YAML configuration (default: none, the embedded default)
  --listen ADDR   address to listen on (overrides the file and LLMGATE_LISTEN)
`

const checkConfigUsageText = `Usage:
  llmgate check-config FILE

Loads FILE the way 'llmgate serve --config FILE' would, reports every
problem, and explains what the gateway would do: deployments and their
limits, aliases, tenants and budgets. Exit status 0 when the file is valid,
2 when it is not. Secrets are never printed.
`

func (a *App) checkConfig(args []string) int {
	if len(args) == 1 && isHelp(args[0]) {
		fmt.Fprint(a.Stdout, checkConfigUsageText)
		return exitOK
	}
	if len(args) != 1 {
		fmt.Fprint(a.Stderr, checkConfigUsageText)
		return exitUsage
	}
	cfg, err := config.Load(args[0], a.Getenv)
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate check-config: %v\n", err)
		return exitUsage
	}
	cfg.Explain(a.Stdout, a.Getenv, checkStore(cfg)...)
	return exitOK
}

// checkStore connects to cfg's Redis stores, if any, and returns what
// check-config should warn about them: that they cannot be reached from
// here, or what their settings lack (redisWarnings, cacheRedisWarnings).
func checkStore(cfg *config.Config) []string {
	var w []string
	if !storeurl.IsMemory(cfg.Store) {
		w = append(w, checkRedis("store", cfg.Store, func(ctx context.Context, c rueidis.Client) ([]string, error) {
			return redisWarnings(ctx, c, cfg)
		})...)
	}
	if !cfg.CacheSharesStore() && !storeurl.IsMemory(cfg.Cache.Store) {
		w = append(w, checkRedis("cache.store", cfg.Cache.Store, func(ctx context.Context, c rueidis.Client) ([]string, error) {
			return cacheRedisWarnings(ctx, c, cfg)
		})...)
	}
	return w
}

// checkRedis connects to the Redis at url (the setting at path) and runs
// check on it.
func checkRedis(path, url string, check func(context.Context, rueidis.Client) ([]string, error)) []string {
	client, err := storeurl.OpenRedis(url)
	if err != nil {
		return []string{fmt.Sprintf("%s: not reachable from here, so its settings were not checked: %v", path, err)}
	}
	defer client.Close()
	ctx, cancel := context.WithTimeout(context.Background(), storeCheckTimeout)
	defer cancel()
	w, err := check(ctx, client)
	if err != nil {
		return []string{fmt.Sprintf("%s: its settings could not be checked: %v", path, err)}
	}
	return w
}

func isHelp(s string) bool { return s == "-h" || s == "-help" || s == "--help" || s == "help" }

func (a *App) serve(args []string) int {
	sigs := make(chan os.Signal, 2) // the signal that stops, and one that hurries the stop
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
	defer signal.Stop(sigs)
	return a.runServe(sigs, args, nil)
}

// runServe serves the gateway until a signal arrives on sigs, then shuts
// it down (see shutdown); SIGHUP reloads the configuration's tenants
// instead (see reload). ready, if not nil, receives the listening address
// once requests are accepted (tests use it).
func (a *App) runServe(sigs <-chan os.Signal, args []string, ready chan<- string) int {
	fs := flag.NewFlagSet("llmgate serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	configPath := fs.String("config", "", "")
	listen := fs.String("listen", "", "")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(a.Stdout, serveUsageText)
			return exitOK
		}
		fmt.Fprintf(a.Stderr, "llmgate serve: %s; see 'llmgate serve --help'\n", twoDashes(err.Error()))
		return exitUsage
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(a.Stderr, "llmgate serve: unexpected argument %q; give the configuration with --config FILE\n", fs.Arg(0))
		return exitUsage
	}
	var cfg *config.Config
	if *configPath != "" {
		c, err := config.Load(*configPath, a.Getenv)
		if err != nil {
			fmt.Fprintf(a.Stderr, "llmgate serve: %v\n", err)
			return exitUsage
		}
		cfg = c
	} else {
		cfg = config.Default(a.Getenv)
	}
	if *listen != "" {
		cfg.Listen = *listen
	}
	// Always: the embedded default must not open without tenants on a
	// public address (LLMGATE_LISTEN=0.0.0.0:…), and --listen may change
	// what is allowed.
	if err := cfg.Validate(a.Getenv); err != nil {
		fmt.Fprintf(a.Stderr, "llmgate serve: %v\n", err)
		return exitUsage
	}
	secrets, err := configSecrets(cfg, a.Getenv)
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate serve: %v\n", err)
		return exitFailure
	}
	log := newLogger(a.Stderr, cfg.Log, secrets)
	if *configPath == "" {
		if cfg.Source == config.SourceDefaultSimulated {
			fmt.Fprintln(a.Stderr, "llmgate serve: no --config and no OPENAI_API_KEY: running the embedded default (memory store, built-in simulated provider)")
		} else {
			fmt.Fprintln(a.Stderr, "llmgate serve: no --config: memory store, provider OpenAI with the key in OPENAI_API_KEY")
		}
	}
	for _, w := range cfg.Warnings() {
		log.Warn(w)
	}

	s, err := a.startServer(cfg, log, secrets)
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate serve: %v\n", err)
		return exitFailure
	}
	defer s.close()

	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		fmt.Fprintf(a.Stderr, "llmgate serve: cannot listen on %s: %v\n", cfg.Listen, err)
		return exitFailure
	}
	srv, limited := s.httpServer(cfg, ln, log)
	errc := make(chan error, 1) // Serve's end: ErrServerClosed once shutdown closes the listener
	scheme := "http"
	go func() {
		if cfg.Server.TLS() {
			errc <- srv.ServeTLS(limited, cfg.Server.TLSCertFile, cfg.Server.TLSKeyFile)
			return
		}
		errc <- srv.Serve(limited)
	}()
	if cfg.Server.TLS() {
		scheme = "https"
	}
	log.Info("llmgate gateway listening", "addr", scheme+"://"+ln.Addr().String()+"/v1", "store", storeurl.Redact(cfg.Store))
	if ready != nil {
		ready <- ln.Addr().String()
	}
	var sig os.Signal
	for sig == nil {
		select {
		case err := <-errc:
			fmt.Fprintf(a.Stderr, "llmgate serve: %v\n", err)
			return exitFailure
		case sig = <-sigs:
			if sig == syscall.SIGHUP {
				a.reload(s, *configPath, *listen, log)
				sig = nil
			}
		}
	}
	s.shutdown(srv, cfg.Server, log, sig, sigs)
	return exitOK
}

// shutdown stops the gateway after the signal sig (docs/gateway.md,
// "Shutdown"): /readyz fails at once while requests are still served for
// the drain delay, so that load balancers stop sending here; then the
// listener closes and requests in flight have the grace to finish; those
// still running are then cut (their contexts cancelled): each ends and is
// settled as one whose client left, a stream charged its prompt estimate
// and the chunks it streamed. Last, within settleWait, the cut requests
// end and every settle and usage record is written. Nothing stays held:
// budget holds settled or released, rate-limit reservations settled or
// refunded, local quota blocks given back. Another signal on sigs skips
// what is left of the drain delay and the grace.
func (s *server) shutdown(srv *http.Server, sv config.Server, log *slog.Logger, sig os.Signal, sigs <-chan os.Signal) {
	hurry, skip := context.WithCancel(context.Background())
	defer skip()
	go func() {
		var sig os.Signal
		for sig == nil || sig == syscall.SIGHUP {
			select {
			case sig = <-sigs:
			case <-hurry.Done():
				return
			}
		}
		log.Warn("second signal: skipping the rest of the drain delay and the grace; requests still running are cut now", "signal", sig.String())
		skip()
	}()

	s.gw.Drain()
	// Each answer from now on closes its connection (idle ones close now):
	// clients reconnect, through the load balancer, to another replica.
	srv.SetKeepAlivesEnabled(false)
	log.Info("shutting down: /readyz answers 503; requests are still accepted until the drain delay ends",
		"signal", sig.String(), "drain_delay", sv.DrainDelay, "running", s.gw.Running())
	drain := time.NewTimer(sv.DrainDelay)
	select {
	case <-drain.C:
	case <-hurry.Done():
		drain.Stop()
	}

	log.Info("closing the listener; requests in flight may finish", "shutdown_grace", sv.ShutdownGrace, "running", s.gw.Running())
	gctx, cancel := context.WithTimeout(hurry, sv.ShutdownGrace)
	err := srv.Shutdown(gctx)
	cancel()
	if err == nil {
		log.Info("every request in flight finished")
	} else {
		log.Warn("shutdown grace over: cutting the requests still running; each is charged what it used",
			"running", s.gw.Running())
		s.gw.Cut()
	}

	sctx, cancel := context.WithTimeout(context.Background(), settleWait)
	defer cancel()
	if err := s.gw.Close(sctx); err != nil {
		// Their budget holds are charged when they expire.
		log.Warn("some requests or usage records were not settled before exit", "err", err,
			"running", s.gw.Running(), "settle_wait", settleWait)
	} else {
		log.Info("stopped: every request settled and its usage recorded")
	}
	_ = srv.Close() // connections still open (a cut request's, once answered)
}

// httpServer returns net/http's server for the gateway, with the bounds of
// cfg.Server, and the listener it must serve: ln, bounded to
// server.max_connections.
func (s *server) httpServer(cfg *config.Config, ln net.Listener, log *slog.Logger) (*http.Server, net.Listener) {
	sv := cfg.Server
	var reject []byte
	if !sv.TLS() {
		reject = tooManyConnections
	}
	rejected := prometheus.NewCounter(prometheus.CounterOpts{
		Name: "llmgate_connections_rejected_total",
		Help: "Client connections turned away because server.max_connections were open.",
	})
	limited := connlimit.New(ln, sv.MaxConnections, reject, rejected.Inc)
	open := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "llmgate_connections_open", Help: "Client connections open now.",
	}, func() float64 { return float64(limited.Open()) })
	s.registry.MustRegister(rejected, open)
	return &http.Server{
		Handler: s.gw.Handler(),
		// Requests derive from the gateway's context, which the shutdown
		// cancels at the end of its grace (gateway.Gateway.Cut).
		BaseContext:       s.gw.BaseContext,
		ReadHeaderTimeout: sv.ReadHeaderTimeout,
		IdleTimeout:       sv.IdleTimeout,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}, limited
}

// tooManyConnections is the answer to a connection over
// server.max_connections: a 503 in OpenAI's error shape, then close.
var tooManyConnections = func() []byte {
	body := `{"error":{"message":"This gateway has as many client connections open as it accepts (server.max_connections). Retry shortly.","type":"service_unavailable","param":null,"code":"too_many_connections"}}` + "\n"
	return []byte("HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
		strconv.Itoa(len(body)) + "\r\n\r\n" + body)
}()

// configSecrets returns every secret the configuration resolves: provider
// keys and header values taken from the environment or files, tenant keys,
// and the admin and metrics tokens. They are kept out of logs and of
// everything relayed to clients.
func configSecrets(cfg *config.Config, getenv func(string) string) ([]string, error) {
	deps, err := cfg.Deployments(getenv)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, d := range deps {
		out = append(out, d.APIKey)
		for _, vs := range d.Header {
			out = append(out, vs...)
		}
	}
	for _, env := range []string{cfg.AdminTokenEnv, cfg.MetricsTokenEnv} {
		if env != "" {
			out = append(out, getenv(env))
		}
	}
	for _, t := range cfg.Tenants {
		if t.APIKeyEnv != "" {
			out = append(out, getenv(t.APIKeyEnv))
		}
	}
	return out, nil
}

// newLogger returns the gateway's logger, which never writes one of
// secrets.
func newLogger(w io.Writer, c config.Log, secrets []string) *slog.Logger {
	opts := &slog.HandlerOptions{Level: c.SlogLevel()}
	var h slog.Handler = slog.NewTextHandler(w, opts)
	if c.Format == "json" {
		h = slog.NewJSONHandler(w, opts)
	}
	return slog.New(redact.New(secrets...).Handler(h))
}

// reload reads the configuration file again on SIGHUP and, when it is
// valid, puts its tenants in force (keys, limits, budgets, cache
// settings); an invalid file changes nothing and the log says why. Other
// settings take effect on the next start: the log says so when the file
// changed them.
func (a *App) reload(s *server, path, listen string, log *slog.Logger) {
	if path == "" {
		log.Warn("SIGHUP: no --config file to reload; nothing changed")
		return
	}
	cfg, err := config.Load(path, a.Getenv)
	if err == nil {
		if listen != "" {
			cfg.Listen = listen
		}
		err = cfg.Validate(a.Getenv)
	}
	var restart bool
	if err == nil {
		restart, err = s.tenants.reload(cfg, a.Getenv)
	}
	if err != nil {
		log.Error("SIGHUP: the configuration file is not valid; the configuration in force stays", "file", path, "err", err)
		return
	}
	log.Info("SIGHUP: configuration reloaded; the file's tenants are in force", "file", path, "tenants", len(cfg.Tenants))
	if restart {
		log.Warn("SIGHUP: the file changes settings other than tenants; those take effect on the next start", "file", path)
	}
}

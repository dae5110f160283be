package app

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/budget"
	budgetmemory "github.com/llmgate/llmgate/budget/memory"
	budgetredis "github.com/llmgate/llmgate/budget/redis"
	"github.com/llmgate/llmgate/clock"
	"github.com/llmgate/llmgate/dedup"
	dedupmemory "github.com/llmgate/llmgate/dedup/memory"
	dedupredis "github.com/llmgate/llmgate/dedup/redis"
	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/gateway"
	"github.com/llmgate/llmgate/internal/provider"
	"github.com/llmgate/llmgate/internal/respcache"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/internal/tenants"
	"github.com/llmgate/llmgate/internal/tokens"
	"github.com/llmgate/llmgate/lock"
	lockmemory "github.com/llmgate/llmgate/lock/memory"
	lockredis "github.com/llmgate/llmgate/lock/redis"
	"github.com/llmgate/llmgate/ratelimit"
	rlmemory "github.com/llmgate/llmgate/ratelimit/memory"
)

// server is a running gateway with what it owns.
type server struct {
	gw       *gateway.Gateway
	registry *prometheus.Registry // served on /metrics
	tenants  *tenantSet           // the file's and the registry's tenants
	closers  []func()
}

func (s *server) close() {
	for i := len(s.closers) - 1; i >= 0; i-- {
		s.closers[i]()
	}
}

// startServer builds the gateway cfg describes: its stores, its simulated
// providers, its upstream client, and the gateway on top.
func (a *App) startServer(cfg *config.Config, log *slog.Logger, secrets []string) (_ *server, err error) {
	s := &server{registry: prometheus.NewRegistry()}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	st, err := openStores(cfg, log)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, st.close)
	simURL, err := s.startSims(cfg)
	if err != nil {
		return nil, err
	}
	var gw *gateway.Gateway
	// gw is set before the server accepts its first request.
	up, err := upstreamClient(cfg, log, func(t *provider.Target, f provider.Feedback) { gw.Feedback(t, f) })
	if err != nil {
		return nil, err
	}
	opt, err := a.gatewayOptions(cfg, st, up, simURL)
	if err != nil {
		return nil, err
	}
	opt.Logger, opt.Registry, opt.Secrets = log, s.registry, secrets
	opt.AccessLog = cfg.Log.AccessOn()
	tracer, stopTracer, err := newTracer(cfg.Tracing, log)
	if err != nil {
		return nil, err
	}
	s.closers = append(s.closers, stopTracer) // after the gateway's: its last spans are flushed
	opt.Tracer = tracer
	set, adm := a.tenantRegistry(cfg, st, opt.Tenants, opt.AdminTokenSHA256, log)
	if err := set.registerMetrics(s.registry); err != nil {
		return nil, err
	}
	// The Go runtime's and the process's own series (memory, GC,
	// goroutines, CPU, open files).
	if err := registerRuntime(s.registry); err != nil {
		return nil, err
	}
	opt.TenantAdmin = adm.Handler()
	host, _ := os.Hostname()
	opt.ReplicaName = host + ":" + strconv.Itoa(os.Getpid())
	var stopPresence func()
	opt.Replicas, stopPresence = startPresence(st.client, opt.ReplicaName)
	s.closers = append(s.closers, stopPresence) // before the store's client closes
	if gw, err = gateway.New(opt); err != nil {
		return nil, err
	}
	s.gw, s.tenants = gw, set
	s.closers = append(s.closers, set.run(gw))
	go tokens.Warm() // ~0.1 s of loading the first request would otherwise wait for
	return s, nil
}

// stores are the coordination backends of one gateway, all in this process
// (the memory store) or all on one Redis.
type stores struct {
	limiter *ratelimit.Limiter
	budgets *budget.Manager
	locks   lock.Backend
	dedup   dedup.Backend
	cache   respcache.Store
	// cachePing pings the cache's own Redis (nil: it has none).
	cachePing func(context.Context) error
	tenants   tenants.Store
	// ready pings the store (nil for the memory store).
	ready func(context.Context) error
	// client is the Redis client (nil for the memory store).
	client rueidis.Client
	// close releases them: the Redis client, or the budget file.
	close func()
}

// openStores opens cfg's store and the backends on it.
func openStores(cfg *config.Config, log *slog.Logger) (_ *stores, err error) {
	st := &stores{close: func() {}}
	var (
		limits  ratelimit.Backend
		budgets budget.Backend
	)
	if storeurl.IsMemory(cfg.Store) {
		if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
			return nil, fmt.Errorf("state_dir %s: %w", cfg.StateDir, err)
		}
		bm, err := budgetmemory.Open(budgetmemory.Config{
			Path: filepath.Join(cfg.StateDir, "budgets.json"), Logger: log,
			// One write per 100ms at most: settles run after the answer,
			// so the wait costs clients nothing, and a burst shares a write.
			MinWriteInterval: 100 * time.Millisecond,
		})
		if err != nil {
			return nil, err
		}
		st.close = func() { _ = bm.Close() }
		limits, budgets = rlmemory.New(clock.Real{}), bm
		st.locks = lockmemory.New(clock.Real{})
		st.dedup = dedupmemory.New(clock.Real{})
		if st.tenants, err = tenants.OpenMemory(filepath.Join(cfg.StateDir, "tenants.json")); err != nil {
			st.close()
			return nil, err
		}
	} else {
		client, err := storeurl.OpenRedis(cfg.Store)
		if err != nil {
			return nil, err
		}
		st.close, st.client = client.Close, client
		ctx, cancel := context.WithTimeout(context.Background(), storeCheckTimeout)
		warnings, err := redisWarnings(ctx, client, cfg)
		cancel()
		if err != nil {
			log.Warn("could not check the store's persistence", "err", err)
		}
		for _, w := range warnings {
			log.Warn(w)
		}
		limits = redisLimits(client)
		budgets = budgetredis.New(client, budgetredis.Config{AckReplicas: cfg.Budget.AckReplicas})
		locks, dd := lockredis.New(client, lockredis.Config{}), dedupredis.New(client, dedupredis.Config{})
		// Their wake-up subscriptions' connections are theirs to close.
		st.close = func() { locks.Close(); dd.Close(); client.Close() }
		st.locks, st.dedup = locks, dd
		st.tenants = tenants.NewRedis(client, "")
		st.ready = func(ctx context.Context) error {
			return client.Do(ctx, client.B().Ping().Build()).Error()
		}
	}
	cache := openCache(cfg, log, st.client)
	st.cache, st.cachePing = cache.store, cache.ping
	closeStore := st.close
	st.close = func() { cache.close(); closeStore() }
	defer func() {
		if err != nil {
			st.close()
		}
	}()
	rlOpts := []ratelimit.Option{ratelimit.WithLogger(log)}
	// Local quota blocks pay with the memory store too: a block is one
	// backend decision for many requests, where the backend's own
	// per-request reservation and settle mark cost more than taking a share
	// of a block.
	if cfg.RateLimit.LocalQuotaOn() {
		rlOpts = append(rlOpts, ratelimit.WithLocalQuota(ratelimit.LocalQuota{Window: cfg.RateLimit.LocalWindow}))
	}
	st.limiter = ratelimit.New(limits, rlOpts...)
	st.budgets, err = budget.New(budgets, budget.Config{
		Prices: cfg.Prices, // the defaults with the file's prices merged over them
		TTL:    cfg.Budget.ReservationTTL, FailOpen: cfg.Budget.FailOpen, Logger: log,
	})
	if err != nil {
		return nil, err
	}
	return st, nil
}

// startSims runs cfg's simulated providers in this process, each on a
// loopback port, and returns their base URLs by provider name.
func (s *server) startSims(cfg *config.Config) (map[string]string, error) {
	simURL := map[string]string{}
	for i := range cfg.Providers {
		p := &cfg.Providers[i]
		if p.Type != "simulated" {
			continue
		}
		url, stop, err := startSim(p)
		if err != nil {
			return nil, fmt.Errorf("providers[%d] (%s): %w", i, p.Name, err)
		}
		s.closers = append(s.closers, stop)
		simURL[p.Name] = url
	}
	return simURL, nil
}

// startSim runs a simulated provider on a loopback port and returns its
// base URL.
func startSim(p *config.Provider) (string, func(), error) {
	srv, err := sim.New(p.SimConfig())
	if err != nil {
		return "", nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = hs.Serve(ln) }()
	return "http://" + ln.Addr().String() + "/v1", func() { _ = hs.Close() }, nil
}

// upstreamClient is the client the gateway calls providers with.
func upstreamClient(cfg *config.Config, log *slog.Logger, feedback func(*provider.Target, provider.Feedback)) (*provider.Client, error) {
	u := cfg.Upstream
	return provider.New(provider.Config{
		MaxAttempts:       u.MaxAttempts,
		BackoffBase:       u.BackoffBase,
		BackoffMax:        u.BackoffMax,
		BreakerFailures:   u.Breaker.Failures,
		BreakerOpenFor:    u.Breaker.OpenFor,
		TimeoutFloor:      u.Timeout.Floor,
		TimeoutCeiling:    u.Timeout.Ceiling,
		TimeoutMultiplier: u.Timeout.Multiplier,
		Transport: provider.NewTransport(provider.TransportConfig{
			MaxConnsPerHost:        u.MaxConnsPerHost,
			MaxResponseHeaderBytes: int64(u.MaxResponseHeaderBytes),
			DialTimeout:            u.DialTimeout,
			TLSHandshakeTimeout:    u.TLSHandshakeTimeout,
		}),
		Logger:   log,
		Feedback: feedback,
	})
}

// gatewayOptions turns cfg into the gateway's options, on the stores st,
// calling providers through up (simulated ones at simURL). Logger,
// Registry and Secrets are left to the caller.
func (a *App) gatewayOptions(cfg *config.Config, st *stores, up *provider.Client, simURL map[string]string) (gateway.Options, error) {
	opt := gateway.Options{
		Route:    cfg.Router(),
		Limiter:  st.limiter,
		Budgets:  st.budgets,
		Upstream: up,
		Ready:    st.ready,
		Admission: gateway.AdmissionOptions{
			MaxWait:         cfg.MaxWait,
			ReservationHold: cfg.RateLimit.ReservationHold,
			FailClosed:      cfg.RateLimit.FailClosed,
			SlowStart:       slowStart(cfg.RateLimit.SlowStartWindow()),
		},
		HTTP: gateway.HTTPOptions{
			MaxBodyBytes:        int64(cfg.MaxBodyBytes),
			BodyTimeout:         cfg.Server.BodyTimeout,
			RequestTimeout:      cfg.RequestTimeout,
			WriteTimeout:        cfg.Server.WriteTimeout,
			StreamWriteTimeout:  cfg.Server.StreamWriteTimeout,
			UpstreamIdleTimeout: cfg.Upstream.IdleTimeout,
		},
		Sessions: gateway.SessionOptions{
			Locker: lock.New(st.locks),
			Header: cfg.Sessions.Header,
			TTL:    cfg.Sessions.TTL,
		},
		Dedup: gateway.DedupOptions{
			Group:          dedup.New(st.dedup, dedup.Options{LeaseTTL: cfg.Dedup.LeaseTTL, Retain: cfg.Dedup.Retain}),
			Deterministic:  cfg.Dedup.DeterministicOn(),
			Models:         set(cfg.Dedup.Models),
			Retain:         cfg.Dedup.Retain,
			IdempotencyTTL: cfg.Dedup.IdempotencyTTL,
		},
		Cache: gateway.CacheOptions{
			Store:  st.cache,
			Ping:   st.cachePing,
			MaxTTL: cfg.Cache.MaxTTL,
			Length: cfg.Cache.CacheLength,
		},
	}
	if cfg.MaxWait == 0 {
		opt.Admission.MaxWait = -1 // configured as "never wait"
	}
	opt.PassThrough = gateway.PassThroughOptions{Provider: cfg.PassThrough.Provider, Unknown: cfg.PassThrough.UnknownRoutes == config.UnknownPass}
	deps, err := cfg.Deployments(a.Getenv)
	if err != nil {
		return opt, err
	}
	seenModel := map[string]bool{}
	for _, d := range deps {
		base := d.Provider.BaseURL
		if u, ok := simURL[d.Provider.Name]; ok {
			base = u
		}
		target := provider.Target{Name: d.Name, BaseURL: base, APIKey: d.APIKey, Header: d.Header}
		switch d.Provider.Type {
		case config.TypeAnthropic:
			target.Kind, target.APIVersion = provider.KindAnthropic, d.Provider.APIVersion
		case config.TypeAzure:
			target.Kind, target.APIVersion, target.AzureDeployment = provider.KindAzure, d.Provider.APIVersion, d.Provider.AzureDeployment(d.Model)
		}
		opt.Deployments = append(opt.Deployments, gateway.Deployment{
			Name: d.Name, Provider: d.Provider.Name, Model: d.Model,
			Target: target,
			Limits: gateway.Limits{RPM: d.Limits.RPM, TPM: d.Limits.TPM, Concurrency: d.Limits.Concurrency, ITPM: d.Limits.ITPM, OTPM: d.Limits.OTPM},
		})
		if !seenModel[d.Model] {
			seenModel[d.Model] = true
			opt.Models = append(opt.Models, gateway.Model{ID: d.Model, OwnedBy: d.Provider.Name})
		}
	}
	for _, al := range cfg.Models {
		if !seenModel[al.Name] {
			seenModel[al.Name] = true
			opt.Models = append(opt.Models, gateway.Model{ID: al.Name, OwnedBy: "llmgate"})
		}
	}
	if opt.Tenants, err = fileTenants(cfg, a.Getenv); err != nil {
		return opt, err
	}
	opt.AdminTokenSHA256 = tokenHash(a.Getenv(cfg.AdminTokenEnv))
	if cfg.MetricsTokenEnv != "" {
		opt.MetricsTokenSHA256 = tokenHash(a.Getenv(cfg.MetricsTokenEnv))
	}
	return opt, nil
}

// slowStart is the gateway's slow-start option for a configured window,
// where 0 means off.
func slowStart(window int64) int64 {
	if window == 0 {
		return -1
	}
	return window
}

// registerRuntime adds the Go runtime and process collectors to reg.
func registerRuntime(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// set is the set of names, or nil when there are none.
func set(names []string) map[string]bool {
	if len(names) == 0 {
		return nil
	}
	m := make(map[string]bool, len(names))
	for _, n := range names {
		m[n] = true
	}
	return m
}

// tokenHash is the hex SHA-256 of tok, or "" for an empty token.
func tokenHash(tok string) string {
	if tok == "" {
		return ""
	}
	sum := sha256.Sum256([]byte(tok))
	return hex.EncodeToString(sum[:])
}

// gatewayTenant converts a configured tenant.
func gatewayTenant(ct *config.Tenant) (*gateway.Tenant, error) {
	t := &gateway.Tenant{
		Name:     ct.Name,
		Limits:   gateway.Limits{RPM: ct.Limits.RPM, TPM: ct.Limits.TPM, Concurrency: ct.Limits.Concurrency},
		Priority: ct.RatePriority(),
		MaxWait:  ct.MaxWait,
		Dedup:    ct.Dedup,
		Models:   set(ct.Models),
	}
	if len(ct.ModelLimits) > 0 {
		t.ModelLimits = make(map[string]gateway.Limits, len(ct.ModelLimits))
		for m, l := range ct.ModelLimits {
			t.ModelLimits[m] = gateway.Limits{RPM: l.RPM, TPM: l.TPM, Concurrency: l.Concurrency}
		}
	}
	if ct.Cache != nil {
		t.Cache = &gateway.TenantCache{TTL: ct.Cache.TTL, Models: set(ct.Cache.Models)}
	}
	if ct.Budget != nil {
		b, err := ct.Budget.Budget(ct.Name)
		if err != nil {
			return nil, fmt.Errorf("tenant %s: %w", ct.Name, err)
		}
		t.Budget = &b
	}
	return t, nil
}

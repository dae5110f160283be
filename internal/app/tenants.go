package app

import (
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/gateway"
	"github.com/llmgate/llmgate/internal/tenants"
)

// tenantSet is the tenants of one gateway: those of the configuration file
// (replaced on SIGHUP) and those of the registry in the store (created and
// changed through /admin/tenants, watched), merged and handed to the
// gateway whole on every change.
type tenantSet struct {
	log      *slog.Logger
	adminSHA string // the admin token's hash: no tenant key may equal it
	watcher  *tenants.Watcher
	// roundTrip and version are the registry's metrics (registerMetrics).
	roundTrip *prometheus.HistogramVec
	version   prometheus.Gauge

	mu   sync.Mutex                 // protects what follows
	cfg  *config.Config             // the configuration in force (API tenants are checked against it)
	file map[string]*gateway.Tenant // key hash -> tenant of the file
	snap tenants.Snapshot           // the registry as last read
	gw   *gateway.Gateway           // nil until the gateway exists
}

// setFile replaces the file's tenants.
func (s *tenantSet) setFile(cfg *config.Config, file map[string]*gateway.Tenant) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg, s.file = cfg, file
	s.publishLocked()
}

// setSnapshot replaces the registry's tenants (the watcher calls it).
func (s *tenantSet) setSnapshot(snap tenants.Snapshot) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.snap = snap
	if s.version != nil {
		s.version.Set(float64(snap.Version))
	}
	s.publishLocked()
}

// registerMetrics adds the registry's series to reg: the store round trip
// of its polls, and the version in force.
func (s *tenantSet) registerMetrics(reg prometheus.Registerer) error {
	s.roundTrip = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "llmgate_store_roundtrip_seconds",
		Help:    "Round trip of the tenant registry's version poll (one GET every 250ms), by result (ok, error): the store's latency as requests see it.",
		Buckets: prometheus.ExponentialBuckets(0.0001, 2, 16),
	}, []string{"result"})
	s.version = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "llmgate_tenant_registry_version",
		Help: "Version of the tenant registry in force on this replica (grows with every admin change; equal on every replica once they all caught up).",
	})
	for _, c := range []prometheus.Collector{s.roundTrip, s.version} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}

func (s *tenantSet) observe(d time.Duration, err error) {
	if s.roundTrip == nil {
		return
	}
	result := "ok"
	if err != nil {
		result = "error"
	}
	s.roundTrip.WithLabelValues(result).Observe(d.Seconds())
}

// attach hands the tenants to gw, now and on every change.
func (s *tenantSet) attach(gw *gateway.Gateway) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gw = gw
	s.publishLocked()
}

// publishLocked gives the gateway the file's tenants and the registry's.
// A registry tenant named like a file tenant, or one that no longer fits
// the configuration (a model removed by a reload), is left out and logged.
func (s *tenantSet) publishLocked() {
	if s.gw == nil {
		return
	}
	names := s.fileNamesLocked()
	m := make(map[string]*gateway.Tenant, len(s.file)+len(s.snap.Tenants))
	for h, t := range s.file {
		m[h] = t
	}
	for _, rt := range s.snap.Tenants {
		if names[rt.Name] {
			s.log.Warn("tenant registry: a tenant of the configuration file has this name; the file's is in force", "tenant", rt.Name)
			continue
		}
		ct := configTenant(rt)
		t, err := gatewayTenant(&ct)
		if err == nil {
			err = s.checkLocked(rt)
		}
		if err != nil {
			s.log.Warn("tenant registry: tenant left out: it does not fit the configuration", "tenant", rt.Name, "err", err)
			continue
		}
		for _, k := range rt.Keys {
			if _, taken := m[k.SHA256]; taken {
				s.log.Warn("tenant registry: a key of this tenant is a key of the configuration file; left out", "tenant", rt.Name, "key_id", k.ID)
				continue
			}
			m[k.SHA256] = t
		}
	}
	s.gw.SetTenants(m)
}

func (s *tenantSet) fileNamesLocked() map[string]bool {
	names := make(map[string]bool, len(s.cfg.Tenants))
	for i := range s.cfg.Tenants {
		names[s.cfg.Tenants[i].Name] = true
	}
	return names
}

// fileTenant reports whether the file defines a tenant of that name.
func (s *tenantSet) fileTenant(name string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.fileNamesLocked()[name]
}

// fileKey reports whether a key hash is the file's or the admin token's.
func (s *tenantSet) fileKey(sha string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.file[sha]
	return ok || sha == s.adminSHA
}

// check validates a registry tenant as the configuration file's would be.
func (s *tenantSet) check(t tenants.Tenant) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkLocked(t)
}

func (s *tenantSet) checkLocked(t tenants.Tenant) error {
	ct := configTenant(t)
	ct.APIKeySHA256 = tenants.HashKey(t.Name) // any valid hash: keys are checked elsewhere
	c := *s.cfg
	c.Tenants = []config.Tenant{ct}
	if err := c.Validate(nil); err != nil {
		msg := strings.ReplaceAll(err.Error(), "tenants[0].", "")
		return fmt.Errorf("%s", strings.ReplaceAll(msg, "tenants[0]", "tenant"))
	}
	if _, err := gatewayTenant(&ct); err != nil {
		return err
	}
	return nil
}

// configTenant is a registry tenant as the configuration file would
// write it (without a key).
func configTenant(t tenants.Tenant) config.Tenant {
	ct := config.Tenant{
		Name:     t.Name,
		Models:   t.Models,
		Limits:   config.Limits{RPM: t.Limits.RPM, TPM: t.Limits.TPM, Concurrency: t.Limits.Concurrency},
		Priority: t.Priority,
		Dedup:    t.Dedup,
	}
	if len(t.ModelLimits) > 0 {
		ct.ModelLimits = make(map[string]config.Limits, len(t.ModelLimits))
		for m, l := range t.ModelLimits {
			ct.ModelLimits[m] = config.Limits{RPM: l.RPM, TPM: l.TPM, Concurrency: l.Concurrency}
		}
	}
	if t.Budget != nil {
		ct.Budget = &config.TenantBudget{Period: t.Budget.Period, USD: t.Budget.USD, Tokens: t.Budget.Tokens, Timezone: t.Budget.Timezone}
	}
	if t.MaxWait != nil {
		d := time.Duration(*t.MaxWait)
		ct.MaxWait = &d
	}
	if t.Cache != nil {
		ct.Cache = &config.TenantCache{TTL: time.Duration(t.Cache.TTL), Models: t.Cache.Models}
	}
	return ct
}

// fileTenants converts the configuration file's tenants, by key hash.
func fileTenants(cfg *config.Config, getenv func(string) string) (map[string]*gateway.Tenant, error) {
	keys, err := cfg.TenantKeys(getenv)
	if err != nil {
		return nil, err
	}
	byCfg := map[*config.Tenant]*gateway.Tenant{}
	out := make(map[string]*gateway.Tenant, len(keys))
	for hash, ct := range keys {
		t, ok := byCfg[ct]
		if !ok {
			if t, err = gatewayTenant(ct); err != nil {
				return nil, err
			}
			byCfg[ct] = t
		}
		out[hash] = t
	}
	return out, nil
}

// tenantRegistry sets up the registry on st: the tenant set, with its
// watcher, and the admin API's handler. file are the configuration's
// tenants.
func (a *App) tenantRegistry(cfg *config.Config, st *stores, file map[string]*gateway.Tenant, adminSHA string, log *slog.Logger) (*tenantSet, *tenants.Admin) {
	set := &tenantSet{log: log, adminSHA: adminSHA, cfg: cfg, file: file}
	reg := tenants.NewRegistry(st.tenants, nil)
	set.watcher = tenants.NewWatcher(reg, 0, log, set.setSnapshot)
	set.watcher.Observe = set.observe
	adm := &tenants.Admin{
		Registry: reg, Check: set.check, FileTenant: set.fileTenant, FileKey: set.fileKey,
		Changed: set.watcher.Poke, Log: log,
	}
	return set, adm
}

// run reads the registry once (not fatal: the file's tenants serve while
// the store is away), then keeps gw's tenants current until stop is
// called.
func (s *tenantSet) run(gw *gateway.Gateway) (stop func()) {
	s.attach(gw)
	ctx, cancel := context.WithCancel(context.Background())
	sctx, scancel := context.WithTimeout(ctx, 5*time.Second)
	_ = s.watcher.Sync(sctx)
	scancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.watcher.Run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// reload replaces the file's tenants with those of cfg, a new
// configuration already validated; it returns an error, and changes
// nothing, when they cannot be resolved. Settings other than tenants need
// a restart: it says so when cfg changes them.
func (s *tenantSet) reload(cfg *config.Config, getenv func(string) string) (restartNeeded bool, err error) {
	file, err := fileTenants(cfg, getenv)
	if err != nil {
		return false, err
	}
	s.mu.Lock()
	old := *s.cfg
	s.mu.Unlock()
	nw := *cfg
	old.Tenants, nw.Tenants = nil, nil
	restartNeeded = !reflect.DeepEqual(old, nw)
	s.setFile(cfg, file)
	return restartNeeded, nil
}

// Package dashboard serves llmgate's live dashboard: one page with every asset embedded, updated every second over server-sent events.
package dashboard

import (
	"context"
	_ "embed"
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

//go:embed page.html
var page []byte

// historyLen is how many snapshots (seconds) a page that connects gets, so
// that its charts start full.
const historyLen = 300

// Snapshot is what the page shows at one moment. Counters are cumulative,
// as /metrics has them; rates are per second over the last interval.
type Snapshot struct {
	Time    time.Time `json:"time"`
	Replica string    `json:"replica"`
	StoreUp bool      `json:"store_up"`

	Requests    float64            `json:"requests"`     // llmgate_requests_total
	Outcomes    map[string]float64 `json:"outcomes"`     // the same by outcome
	Limited     float64            `json:"limited"`      // outcome "limited": the gateway's 429s
	Upstream429 float64            `json:"upstream_429"` // llmgate_upstream_429_total
	Rates       Rates              `json:"rates"`

	Deployments []Deployment `json:"deployments"`
	Tenants     []Tenant     `json:"tenants"`
	Latency     []Latency    `json:"latency"`
	// Replicas are the gateway replicas that shared the store lately.
	Replicas []Replica `json:"replicas"`
}

// Replica is a gateway replica seen in the store.
type Replica struct {
	Name     string    `json:"name"`
	LastSeen time.Time `json:"last_seen"`
}

// Rates are per-second rates over the last interval.
type Rates struct {
	Requests float64 `json:"requests"`
	Errors   float64 `json:"errors"` // outcomes other than ok, limited and budget
	Limited  float64 `json:"limited"`
}

// Deployment is one deployment's quota in the shared store and its traffic
// through this replica.
type Deployment struct {
	Name string `json:"name"`
	// RPM and TPM are the limits in force (the configured or the
	// provider's lower one) and what the shared bucket has used of them:
	// every replica's requests, not only this one's.
	RPM Quota `json:"rpm"`
	TPM Quota `json:"tpm"`
	// Responses counts upstream answers relayed by this replica, by
	// status class (llmgate_upstream_responses_total).
	Responses map[string]float64 `json:"responses"`
	Tokens    float64            `json:"tokens"` // llmgate_tokens_total
	// Queued is how many of this replica's requests wait in the
	// deployment's queue now (llmgate_queue_depth).
	Queued  float64 `json:"queued"`
	Breaker string  `json:"breaker,omitempty"`
}

// Quota is a limit and how much of it is in use; Limit 0 means none.
type Quota struct {
	Limit int64 `json:"limit"`
	Used  int64 `json:"used"`
}

// Tenant is a tenant's spend against its budget, from the shared store.
type Tenant struct {
	Name        string  `json:"name"`
	Period      string  `json:"period,omitempty"`
	SpentUSD    float64 `json:"spent_usd"`
	CapUSD      float64 `json:"cap_usd,omitempty"`
	SpentTokens int64   `json:"spent_tokens"`
	CapTokens   int64   `json:"cap_tokens,omitempty"`
	Holds       int     `json:"holds"`
}

// Latency is a latency distribution over the last minute, in seconds.
type Latency struct {
	Name  string  `json:"name"`
	Count float64 `json:"count"` // observations in the last minute
	P50   float64 `json:"p50"`
	P95   float64 `json:"p95"`
	P99   float64 `json:"p99"`
}

// State is what the dashboard needs from the gateway besides its metrics:
// the shared store's view of quotas and budgets.
type State struct {
	Deployments []Deployment
	Tenants     []Tenant
	Replicas    []Replica
}

// Config configures a Dashboard.
type Config struct {
	// Gatherer is the gateway's metrics registry.
	Gatherer prometheus.Gatherer
	// State reads the quotas and budgets; called once per interval while
	// a page is open.
	State func(ctx context.Context) State
	// Replica names this replica on the page.
	Replica string
	// Every is the update interval. Default 1s.
	Every time.Duration
	// Latency names the histogram shown as latency, and the label its
	// series are grouped by. Default llmgate_request_duration_seconds by
	// endpoint.
	LatencyMetric, LatencyLabel string
}

// Dashboard samples the metrics once per interval while at least one page
// is open, and streams each sample to every open page.
type Dashboard struct {
	cfg Config

	mu      sync.Mutex // protects the fields below
	subs    map[chan []byte]struct{}
	history [][]byte           // the last historyLen samples, JSON
	last    *Snapshot          // the previous sample, for rates
	hists   []map[string]*hist // the last minute of latency histograms, oldest first
	stop    chan struct{}      // closes the sampler; nil while none runs
}

// New returns a dashboard; Handler serves it.
func New(cfg Config) *Dashboard {
	if cfg.Every <= 0 {
		cfg.Every = time.Second
	}
	if cfg.LatencyMetric == "" {
		cfg.LatencyMetric, cfg.LatencyLabel = "llmgate_request_duration_seconds", "endpoint"
	}
	if cfg.State == nil {
		cfg.State = func(context.Context) State { return State{} }
	}
	return &Dashboard{cfg: cfg, subs: map[chan []byte]struct{}{}}
}

// Handler serves the page at its root and the event stream at "events".
// Mount it under a prefix ending in "/", behind authentication.
func (d *Dashboard) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("Content-Type", "text/html; charset=utf-8")
		h.Set("Cache-Control", "no-store")
		// Everything is inline: nothing else may load.
		h.Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'; img-src data:")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("X-Frame-Options", "DENY")
		_, _ = w.Write(page)
	})
	mux.HandleFunc("GET /events", d.serveEvents)
	return mux
}

// serveEvents streams samples as server-sent events: the history first,
// then one event per interval until the client leaves.
func (d *Dashboard) serveEvents(w http.ResponseWriter, r *http.Request) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(http.StatusOK)
	ch, history := d.subscribe()
	defer d.unsubscribe(ch)
	for _, b := range history {
		if !writeEvent(w, b) {
			return
		}
	}
	if rc.Flush() != nil {
		return
	}
	for {
		select {
		case <-r.Context().Done():
			return
		case b := <-ch:
			// A client that does not read is cut: a sample is small, and
			// a page reads each as it comes.
			_ = rc.SetWriteDeadline(time.Now().Add(10 * d.cfg.Every))
			if !writeEvent(w, b) || rc.Flush() != nil {
				return
			}
		}
	}
}

func writeEvent(w http.ResponseWriter, b []byte) bool {
	_, err := fmt.Fprintf(w, "data: %s\n\n", b)
	return err == nil
}

func (d *Dashboard) subscribe() (chan []byte, [][]byte) {
	ch := make(chan []byte, 4)
	d.mu.Lock()
	defer d.mu.Unlock()
	d.subs[ch] = struct{}{}
	if d.stop == nil {
		d.stop = make(chan struct{})
		go d.sample(d.stop)
	}
	return ch, append([][]byte(nil), d.history...)
}

func (d *Dashboard) unsubscribe(ch chan []byte) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.subs, ch)
	if len(d.subs) == 0 && d.stop != nil {
		close(d.stop)
		d.stop = nil
	}
}

// sample takes a sample every interval until stop is closed.
func (d *Dashboard) sample(stop <-chan struct{}) {
	t := time.NewTicker(d.cfg.Every)
	defer t.Stop()
	for {
		d.tick()
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// tick takes one sample and sends it to every open page.
func (d *Dashboard) tick() {
	ctx, cancel := context.WithTimeout(context.Background(), d.cfg.Every)
	st := d.cfg.State(ctx)
	cancel()
	s, hists := d.fromMetrics()
	s.Deployments = mergeDeployments(st.Deployments, s.Deployments)
	s.Tenants, s.Replicas = st.Tenants, st.Replicas
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.last != nil {
		if dt := s.Time.Sub(d.last.Time).Seconds(); dt > 0 {
			s.Rates.Requests = (s.Requests - d.last.Requests) / dt
			s.Rates.Limited = (s.Limited - d.last.Limited) / dt
			s.Rates.Errors = (errorsOf(&s) - errorsOf(d.last)) / dt
		}
	}
	d.hists = append(d.hists, hists)
	if keep := int(time.Minute/d.cfg.Every) + 1; len(d.hists) > keep {
		d.hists = d.hists[len(d.hists)-keep:]
	}
	s.Latency = latencies(d.hists[0], hists)
	d.last = &s
	b, err := json.Marshal(s)
	if err != nil {
		return
	}
	d.history = append(d.history, b)
	if len(d.history) > historyLen {
		d.history = d.history[len(d.history)-historyLen:]
	}
	for ch := range d.subs {
		select {
		case ch <- b:
		default: // a page behind by several samples skips this one
		}
	}
}

// errorsOf counts the requests that ended in an error: every outcome but
// ok and the refusals the gateway decided (limits, budget).
func errorsOf(s *Snapshot) float64 {
	n := 0.0
	for o, v := range s.Outcomes {
		switch o {
		case "ok", "limited", "budget":
		default:
			n += v
		}
	}
	return n
}

// fromMetrics reads the snapshot's counters and the latency histograms
// from the registry.
func (d *Dashboard) fromMetrics() (Snapshot, map[string]*hist) {
	s := Snapshot{Time: time.Now(), Replica: d.cfg.Replica, Outcomes: map[string]float64{}}
	hists := map[string]*hist{}
	mfs, _ := d.cfg.Gatherer.Gather() // a failing collector leaves its series out
	deps := map[string]*Deployment{}
	dep := func(name string) *Deployment {
		if deps[name] == nil {
			deps[name] = &Deployment{Name: name, Responses: map[string]float64{}}
		}
		return deps[name]
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := labels(m)
			switch mf.GetName() {
			case "llmgate_store_up":
				if l["store"] != "cache" { // the coordination store; the cache's own is not the page's
					s.StoreUp = m.GetGauge().GetValue() == 1
				}
			case "llmgate_requests_total":
				v := m.GetCounter().GetValue()
				s.Requests += v
				s.Outcomes[l["outcome"]] += v
				if l["outcome"] == "limited" {
					s.Limited += v
				}
			case "llmgate_upstream_429_total":
				s.Upstream429 += m.GetCounter().GetValue()
			case "llmgate_upstream_responses_total":
				dep(l["deployment"]).Responses[l["status"]] += m.GetCounter().GetValue()
			case "llmgate_tokens_total":
				dep(l["deployment"]).Tokens += m.GetCounter().GetValue()
			case "llmgate_queue_depth":
				dep(l["deployment"]).Queued += m.GetGauge().GetValue()
			case d.cfg.LatencyMetric:
				if h := m.GetHistogram(); h != nil {
					hists[l[d.cfg.LatencyLabel]] = histOf(h)
				}
			}
		}
	}
	for _, v := range deps {
		s.Deployments = append(s.Deployments, *v)
	}
	return s, hists
}

// mergeDeployments joins the store's view of each deployment with its
// traffic through this replica, in the store's order, then any others by
// name.
func mergeDeployments(store, traffic []Deployment) []Deployment {
	byName := map[string]Deployment{}
	for _, t := range traffic {
		byName[t.Name] = t
	}
	out := make([]Deployment, 0, len(store)+len(traffic))
	for _, s := range store {
		t := byName[s.Name]
		delete(byName, s.Name)
		s.Responses, s.Tokens, s.Queued = t.Responses, t.Tokens, t.Queued
		if s.Responses == nil {
			s.Responses = map[string]float64{}
		}
		out = append(out, s)
	}
	var rest []string
	for n := range byName {
		rest = append(rest, n)
	}
	sort.Strings(rest)
	for _, n := range rest {
		out = append(out, byName[n])
	}
	return out
}

func labels(m *dto.Metric) map[string]string {
	out := make(map[string]string, len(m.GetLabel()))
	for _, lp := range m.GetLabel() {
		out[lp.GetName()] = lp.GetValue()
	}
	return out
}

// hist is a cumulative histogram: counts at each upper bound.
type hist struct {
	upper  []float64
	counts []float64
	total  float64
}

func histOf(h *dto.Histogram) *hist {
	out := &hist{total: float64(h.GetSampleCount())}
	for _, b := range h.GetBucket() {
		out.upper = append(out.upper, b.GetUpperBound())
		out.counts = append(out.counts, float64(b.GetCumulativeCount()))
	}
	return out
}

// latencies are the quantiles of what each histogram observed between old
// and now.
func latencies(old, now map[string]*hist) []Latency {
	var out []Latency
	for name, h := range now {
		delta := &hist{upper: h.upper, counts: append([]float64(nil), h.counts...), total: h.total}
		if o := old[name]; o != nil && len(o.counts) == len(h.counts) && o != h {
			for i := range delta.counts {
				delta.counts[i] -= o.counts[i]
			}
			delta.total -= o.total
		}
		out = append(out, Latency{Name: name, Count: delta.total,
			P50: delta.quantile(0.5), P95: delta.quantile(0.95), P99: delta.quantile(0.99)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out
}

// quantile interpolates the q-quantile within its bucket, as Prometheus's
// histogram_quantile does; 0 without observations.
func (h *hist) quantile(q float64) float64 {
	if h.total <= 0 || len(h.upper) == 0 {
		return 0
	}
	rank := q * h.total
	lower, below := 0.0, 0.0
	for i, up := range h.upper {
		if h.counts[i] >= rank {
			if math.IsInf(up, 1) {
				return lower
			}
			in := h.counts[i] - below
			if in <= 0 {
				return up
			}
			return lower + (up-lower)*(rank-below)/in
		}
		lower, below = up, h.counts[i]
	}
	return lower // beyond the last bound
}

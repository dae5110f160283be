//go:build unix

package e2etopo

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"

	"github.com/llmgate/llmgate/budget"
	"github.com/llmgate/llmgate/internal/config"
	"github.com/llmgate/llmgate/internal/e2eutil"
	"github.com/llmgate/llmgate/internal/sim"
	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/internal/testutil"
)

// The failover tests double as the harness whose figures are in
// BENCHMARKS.md. By default they run a killed master on each topology,
// and a planned Sentinel failover with budget.ack_replicas; with
// -failover.all every kind with and without ack_replicas, and with
// -failover.runs=N each N times, logging the medians.
var (
	failoverRuns = flag.Int("failover.runs", 1, "failovers of each kind")
	failoverAll  = flag.Bool("failover.all", false, "every kind of failover (killed, planned), with and without budget.ack_replicas")
)

// The load: cappedTenants tenants with a budget (fail closed) and one
// without ("free": only rate limits, which fail open), each sent to by
// clients in a closed loop over the three replicas.
const (
	cappedTenants    = 3
	clientsPerTenant = 1
	freeClients      = 2
	// loadPace spaces each client's requests, so that the load does not
	// take every core of a small machine.
	loadPace = 20 * time.Millisecond
	// maxPerClient bounds each client's requests.
	maxPerClient = 20_000
	// requestTimeout bounds each request.
	requestTimeout = 10 * time.Second
	// sustain is how long every request must have succeeded for the
	// gateway to count as serving normally again.
	sustain = 2 * time.Second
	// holdTTL is budget.reservation_ttl: a hold whose settle failed is
	// charged when it expires, within the test.
	holdTTL = 5 * time.Second
	freeKey = "sk-e2etopo-free-a41c07d2"
)

func cappedKey(i int) string { return fmt.Sprintf("sk-e2etopo-capped-%d-7b30e9", i) }

// failoverYAML configures providers "capped" (gpt-4.1) and "free"
// (gpt-4.1-mini) on their own simulated providers, so that each group's
// tokens are counted apart, both with limits far above the load (the
// limiter runs, and fails open); the tenant free without a budget, and
// the capped ones, each with a cap far above the load.
func failoverYAML(store, cappedURL, freeURL, free string, capped []string, ackReplicas int) string {
	var b strings.Builder
	fmt.Fprintf(&b, "listen: 127.0.0.1:0\nstore: %q\nlog: {level: info, access: false}\n", store)
	fmt.Fprintf(&b, "budget: {reservation_ttl: %v, ack_replicas: %d}\n", holdTTL, ackReplicas)
	b.WriteString("upstream: {backoff_base: 10ms, backoff_max: 100ms}\nproviders:\n")
	for _, p := range []struct{ name, url, model string }{{"capped", cappedURL, "gpt-4.1"}, {"free", freeURL, "gpt-4.1-mini"}} {
		fmt.Fprintf(&b, "  - name: %s\n    base_url: %s\n    api_key_env: E2E_PROVIDER_KEY\n    models: [%s]\n    limits: {rpm: 1000000, tpm: 100000000}\n",
			p.name, p.url, p.model)
	}
	b.WriteString("tenants:\n")
	fmt.Fprintf(&b, "  - name: %s\n    api_key_sha256: %s\n", free, config.HashKey(freeKey))
	for i, n := range capped {
		fmt.Fprintf(&b, "  - name: %s\n    api_key_sha256: %s\n    budget: {period: day, tokens: 1000000000}\n", n, config.HashKey(cappedKey(i)))
	}
	return b.String()
}

// failoverEvent is one kind of failover of a topology.
type failoverEvent struct {
	name string
	// run fails master over; it returns when the topology is stable
	// again, with how long until a replica had taken over.
	run func(ctx context.Context, master *testutil.Redis) (time.Duration, error)
	// ackReplicas is budget.ack_replicas.
	ackReplicas int
	// switchLoss: the old master stays up and takes writes until the
	// clients move (SENTINEL FAILOVER), and those are lost.
	switchLoss bool
}

// failoverEvents returns the events to run: killed always, planned with
// -failover.all; each with ackReplicas, and without with -failover.all.
// planned is also run with acknowledgements by default when switchLoss.
func failoverEvents(kill, planned func(ctx context.Context, master *testutil.Redis) (time.Duration, error), ackReplicas int, switchLoss bool) []failoverEvent {
	evs := []failoverEvent{{name: "kill", run: kill}}
	if *failoverAll {
		evs = append(evs,
			failoverEvent{name: "kill+ack", run: kill, ackReplicas: ackReplicas},
			failoverEvent{name: "planned", run: planned, switchLoss: switchLoss})
	}
	if *failoverAll || switchLoss {
		evs = append(evs, failoverEvent{name: "planned+ack", run: planned, ackReplicas: ackReplicas})
	}
	return evs
}

// TestGatewayFailoverSentinel: three replicas under load while the
// Sentinel master is killed, and while SENTINEL FAILOVER moves it with
// budget.ack_replicas: 2; see runFailover for what is checked.
func TestGatewayFailoverSentinel(t *testing.T) {
	tp := onSentinel(t)
	s := tp.sentinel
	kill := func(ctx context.Context, _ *testutil.Redis) (time.Duration, error) {
		_, d, err := s.KillMaster(ctx)
		return d, err
	}
	planned := func(ctx context.Context, _ *testutil.Redis) (time.Duration, error) {
		start := time.Now()
		_, err := s.Failover(ctx)
		return time.Since(start), err
	}
	failoverRuns3(t, tp, failoverEvents(kill, planned, 2, true))
}

// TestGatewayFailoverCluster: three replicas under load while the master
// serving the most store commands is killed. Each capped tenant's budget
// lives on another master, so one of them is on the master that fails.
func TestGatewayFailoverCluster(t *testing.T) {
	tp := onCluster(t)
	c := tp.cluster
	kill := func(ctx context.Context, m *testutil.Redis) (time.Duration, error) {
		_, d, err := c.KillMaster(ctx, m)
		return d, err
	}
	planned := func(ctx context.Context, m *testutil.Redis) (time.Duration, error) {
		start := time.Now()
		_, err := c.Failover(ctx, m)
		return time.Since(start), err
	}
	// CLUSTER FAILOVER pauses the old master's clients until the replica
	// has caught up: nothing is lost in the switch.
	failoverRuns3(t, tp, failoverEvents(kill, planned, 1, false))
}

// budgetTag is the hash tag of tenant's budget keys in today's window
// (llmgate:budget:{TENANT:WINDOW}:..., see budget/redis).
func budgetTag(t *testing.T, tenant string) string {
	w, err := budget.Budget{Tenant: tenant, Period: budget.Day, Tokens: 1}.Window(time.Now())
	if err != nil {
		t.Fatal(err)
	}
	return "llmgate:budget:{" + tenant + ":" + w.ID + "}:"
}

// cappedNames returns cappedTenants tenant names starting with prefix;
// on a Cluster, one whose budget keys live on each master.
func cappedNames(t *testing.T, tp topology, prefix string) []string {
	names := make([]string, cappedTenants)
	if tp.cluster == nil {
		for i := range names {
			names[i] = prefix + strconv.Itoa(i)
		}
		return names
	}
	masters, err := tp.cluster.Masters(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; slices.Contains(names, ""); i++ {
		if i == 1000 {
			t.Fatal("no tenant name for every master")
		}
		n := prefix + strconv.Itoa(i)
		m, err := tp.cluster.MasterOf(t.Context(), budgetTag(t, n))
		if err != nil {
			t.Fatal(err)
		}
		if k := slices.Index(masters, m); k >= 0 && names[k] == "" {
			names[k] = n
		}
	}
	return names
}

// failingMaster is the master a run fails over: Sentinel's, or the
// Cluster's master that served the most store commands since before (a
// DataCommands reading).
func failingMaster(t *testing.T, tp topology, before map[*testutil.Redis]int64) *testutil.Redis {
	if tp.cluster == nil {
		m, err := tp.sentinel.Master(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		return m
	}
	d, _, err := tp.cluster.Spread(t.Context(), before, 0)
	if err != nil {
		t.Fatal(err)
	}
	m := slices.MaxFunc(slices.Collect(maps.Keys(d)), func(a, b *testutil.Redis) int { return int(d[a] - d[b]) })
	t.Logf("the busiest master, %s, served %d of the load's store commands", m.Addr, d[m])
	return m
}

// failoverRuns3 runs every event *failoverRuns times and logs the medians.
func failoverRuns3(t *testing.T, tp topology, events []failoverEvent) {
	for _, ev := range events {
		var results []failoverResult
		for i := range *failoverRuns {
			t.Run(fmt.Sprintf("%s-%d", ev.name, i), func(t *testing.T) {
				results = append(results, runFailover(t, tp, ev))
			})
		}
		logMedians(t, ev.name, results)
	}
}

// outcome is one request as its client saw it.
type outcome struct {
	tenant     string
	capped     bool
	start, end time.Time
	kind       string // "ok", or the error: "503 store_unavailable", "transport", ...
	tokens     int64  // the usage of an answer
}

// loadClient sends requests in a closed loop until stop closes (at most
// maxPerClient), and keeps what each got.
type loadClient struct {
	tenant string
	capped bool
	sdks   []openai.Client // one per replica
	model  string
	name   string

	mu  sync.Mutex // protects out
	out []outcome
}

func (c *loadClient) run(stop <-chan struct{}, done *sync.WaitGroup) {
	defer done.Done()
	for i := range maxPerClient {
		ctx, cancel := context.WithTimeout(context.Background(), requestTimeout)
		o := outcome{tenant: c.tenant, capped: c.capped, start: time.Now(), kind: "ok"}
		resp, err := c.sdks[i%len(c.sdks)].Chat.Completions.New(ctx, chatParams(c.model, fmt.Sprintf("%s request %d", c.name, i), 8))
		cancel()
		o.end = time.Now()
		switch e := sdkError(err); {
		case err == nil:
			o.tokens = resp.Usage.TotalTokens
		case e != nil:
			o.kind = fmt.Sprintf("%d %s", e.StatusCode, e.Code)
		default:
			o.kind = "transport"
		}
		c.mu.Lock()
		c.out = append(c.out, o)
		c.mu.Unlock()
		select {
		case <-stop:
			return
		case <-time.After(loadPace): // load pacing, not synchronisation
		}
	}
}

// load is the clients of a run, each on its own goroutine.
type load struct {
	clients []*loadClient
	stop    chan struct{}
	done    sync.WaitGroup
	stopped bool
}

// startLoad starts a client per capped tenant per clientsPerTenant (the
// names' keys are cappedKey(index)), and freeClients for free, each
// spreading its requests over reps.
func startLoad(reps []*e2eutil.Replica, capped []string, free string) *load {
	l := &load{stop: make(chan struct{})}
	add := func(tenant string, isCapped bool, key, model string, k int) {
		c := &loadClient{tenant: tenant, capped: isCapped, name: fmt.Sprintf("%s/%d", tenant, k), model: model}
		for _, r := range reps {
			c.sdks = append(c.sdks, r.SDK(key))
		}
		l.clients = append(l.clients, c)
	}
	for i, n := range capped {
		for k := range clientsPerTenant {
			add(n, true, cappedKey(i), "gpt-4.1", k)
		}
	}
	for k := range freeClients {
		add(free, false, freeKey, "gpt-4.1-mini", k)
	}
	for _, c := range l.clients {
		l.done.Add(1)
		go c.run(l.stop, &l.done)
	}
	return l
}

// end stops the clients and waits for them; it may be called again.
func (l *load) end() {
	if !l.stopped {
		l.stopped = true
		close(l.stop)
		l.done.Wait()
	}
}

// outcomes returns a copy of what the clients got so far.
func (l *load) outcomes() []outcome {
	var all []outcome
	for _, c := range l.clients {
		c.mu.Lock()
		all = append(all, c.out...)
		c.mu.Unlock()
	}
	return all
}

// each reports whether every client has at least n outcomes.
func (l *load) each(n int) bool {
	for _, c := range l.clients {
		c.mu.Lock()
		got := len(c.out)
		c.mu.Unlock()
		if got < n {
			return false
		}
	}
	return true
}

// recovered reports whether no request has failed since from, or since
// the last failure, for sustain, with two answers a client since.
func (l *load) recovered(from time.Time) bool {
	all := l.outcomes()
	for _, o := range all {
		if o.kind != "ok" && o.end.After(from) {
			from = o.end
		}
	}
	ok := 0
	for _, o := range all {
		if o.kind == "ok" && o.start.After(from) {
			ok++
		}
	}
	return time.Since(from) >= sustain && ok >= 2*len(l.clients)
}

// failoverResult is what one failover cost.
type failoverResult struct {
	takeover time.Duration // until a replica had taken over (the planned failover's call)
	// recovery is from the failover's start until the end of the last
	// request that failed (0: none failed).
	recovery time.Duration
	window   time.Duration  // from the failover's start to the end of the load
	served   int            // answers in the window
	errors   map[string]int // errors in the window, by status and code
	// Spend of the capped tenants: what the provider served, what their
	// clients were answered, and what their budgets charged.
	provider, answered, charged int64
	// The free tenant's usage: served by the provider, and recorded.
	freeProvider, freeRecorded int64
}

// lost is the capped tenants' spend the provider served and no budget
// charged (negative: charged more than was served).
func (r failoverResult) lost() int64 { return r.provider - r.charged }

// lagAllowance is how far back from a failover's start an answer may
// have been settled and still be lost with the old master: far more than
// replication on loopback lags, even on a loaded machine.
const lagAllowance = time.Second

// runFailover starts three replicas on tp, loads them with every tenant,
// fails the topology over with ev under that load, and measures what the
// clients saw until every request had succeeded for sustain past the
// failover, and what the budgets charged once every hold was settled. It
// checks what docs/failover.md promises: the gateway serves normally
// again within a bound of the takeover; the free tenant, whose only store
// calls are rate limits (fail open) and batched usage, sees no error; a
// capped tenant sees only 503 store_unavailable (budgets fail closed),
// and on a Cluster, one whose budget is on another master only while the
// Cluster is down (from the node timeout on until the takeover); and
// the spend the budgets lost is at most what was settled in the
// replication lag before the failover (and, for SENTINEL FAILOVER, until
// the clients moved), none with ack_replicas.
func runFailover(t *testing.T, tp topology, ev failoverEvent) failoverResult {
	e2eutil.LogRuntime(t)
	ctx, cancel := context.WithTimeout(t.Context(), 4*time.Minute)
	defer cancel()
	// Names of their own: the topology, and the day's budgets, outlive
	// a run.
	prefix := strconv.FormatInt(time.Now().UnixNano(), 36)
	names, free := cappedNames(t, tp, "capped-"+prefix+"-"), "free-"+prefix
	cappedSim := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1"}, APIKeys: []string{e2eutil.ProviderKey}})
	freeSim := e2eutil.NewGatedSim(t, sim.Config{Models: []string{"gpt-4.1-mini"}, APIKeys: []string{e2eutil.ProviderKey}})
	reps := e2eutil.StartReplicasYAML(t, 3, failoverYAML(tp.url, cappedSim.URL, freeSim.URL, free, names, ev.ackReplicas))

	var before map[*testutil.Redis]int64
	if tp.cluster != nil {
		var err error
		if before, err = tp.cluster.DataCommands(ctx); err != nil {
			t.Fatal(err)
		}
	}
	l := startLoad(reps, names, free)
	defer l.end()
	e2eutil.WaitUntil(t, time.Minute, "every client has 5 answers", func() bool { return l.each(5) })
	for _, o := range l.outcomes() {
		if o.kind != "ok" {
			t.Fatalf("before the failover a request of %s got %s", o.tenant, o.kind)
		}
	}
	master := failingMaster(t, tp, before)
	// The capped tenants whose budget is on the master that fails (the
	// free tenant has no budget).
	affected := map[string]bool{}
	for _, n := range names {
		if tp.cluster == nil {
			affected[n] = true
			continue
		}
		m, err := tp.cluster.MasterOf(ctx, budgetTag(t, n))
		if err != nil {
			t.Fatal(err)
		}
		affected[n] = m == master
	}

	start := time.Now()
	takeover, err := ev.run(ctx, master)
	if err != nil {
		t.Fatal(err)
	}
	stableAt := time.Now()
	// Clients learn of the new master within a topology refresh of the
	// takeover (storeurl.SentinelRefresh; a Cluster client on its first
	// error); a loaded machine gets as long again as the takeover took.
	bound := 2*takeover + 2*storeurl.SentinelRefresh + 5*time.Second
	deadline := start.Add(max(bound, stableAt.Sub(start)) + sustain + 5*time.Second)
	for !l.recovered(stableAt) && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // the clients' outcomes: nothing to wait on
	}
	healed := l.recovered(stableAt)
	l.end()

	res := failoverResult{takeover: takeover, window: time.Since(start), errors: map[string]int{}}
	// What a failover may lose (docs/failover.md): nothing acknowledged
	// by every replica (ack_replicas); without it, what was settled in
	// the replication lag before it, and with switchLoss what the old
	// master took until the clients moved, within the takeover.
	riskFrom, riskTo := start.Add(-lagAllowance), start
	if ev.switchLoss {
		riskTo = start.Add(takeover)
	}
	if ev.ackReplicas > 0 {
		riskTo = riskFrom
	}
	var freeAnswered, atRisk, freeAtRisk int64
	byTenant := map[string]int{}
	firstErr, lastErr := map[string]time.Duration{}, map[string]time.Duration{}
	for _, o := range l.outcomes() {
		if o.kind == "ok" {
			if o.capped {
				res.answered += o.tokens
			} else {
				freeAnswered += o.tokens
			}
			if o.end.After(riskFrom) && o.end.Before(riskTo) {
				if o.capped {
					atRisk += o.tokens
				} else {
					freeAtRisk += o.tokens
				}
			}
		}
		if o.end.Before(start) {
			continue
		}
		if o.kind == "ok" {
			res.served++
			continue
		}
		res.errors[o.kind]++
		byTenant[o.tenant]++
		if _, ok := firstErr[o.tenant]; !ok {
			firstErr[o.tenant] = o.end.Sub(start)
		}
		lastErr[o.tenant] = max(lastErr[o.tenant], o.end.Sub(start))
		res.recovery = max(res.recovery, o.end.Sub(start))
	}
	t.Logf("%s failover of %s: takeover %v, stable after %v; in the %v from its start %d answered, errors %v (by tenant %v); every request succeeded from %v on",
		ev.name, master.Addr, takeover.Round(time.Millisecond), stableAt.Sub(start).Round(time.Millisecond), res.window.Round(time.Millisecond),
		res.served, res.errors, byTenant, res.recovery.Round(time.Millisecond))
	if !healed || res.recovery > bound {
		t.Errorf("the gateway did not serve normally again within %v of the failover's start (last failure after %v)", bound, res.recovery)
	}
	for k := range res.errors {
		if k != "503 store_unavailable" {
			t.Errorf("clients got %d× %s; only budgets, which fail closed, may refuse (503 store_unavailable)", res.errors[k], k)
		}
	}
	for tenant, n := range byTenant {
		t.Logf("%s: %d errors from %v to %v after the failover's start", tenant, n, firstErr[tenant].Round(time.Millisecond), lastErr[tenant].Round(time.Millisecond))
		if tenant == free {
			t.Errorf("%s, without a budget (rate limits fail open), got %d errors", tenant, n)
		}
		// A Cluster refuses every command (CLUSTERDOWN) from when it
		// declares a master failed, a node timeout after it stopped
		// answering at the earliest, until its replica took over.
		if tenant != free && !affected[tenant] && firstErr[tenant] < testutil.ClusterNodeTimeout {
			t.Errorf("%s, whose budget is not on the failed master, got an error %v after its failure; the Cluster refuses it only once the node timeout (%v) declared the master failed",
				tenant, firstErr[tenant], testutil.ClusterNodeTimeout)
		}
	}

	// Spend: once every hold is settled (or expired and charged), what
	// the budgets charged against what the provider served.
	for _, n := range names {
		spent, holds := e2eutil.WaitSettled(t, ctx, reps[0], n)
		if holds != 0 {
			t.Errorf("%s: %d holds still live after the load (hold TTL %v)", n, holds, holdTTL)
		}
		res.charged += spent
	}
	st := cappedSim.Stats().Total
	res.provider = st.PromptTokens + st.CompletionTokens
	fst := freeSim.Stats().Total
	res.freeProvider = fst.PromptTokens + fst.CompletionTokens
	res.freeRecorded = recordedTokens(t, ctx, reps[0], free)
	t.Logf("capped tenants: the provider served %d tokens, clients were answered %d, budgets charged %d (lost %d, of %d at risk); free tenant: served %d, answered %d, recorded %d (%d at risk)",
		res.provider, res.answered, res.charged, res.lost(), atRisk, res.freeProvider, freeAnswered, res.freeRecorded, freeAtRisk)
	if res.lost() > atRisk {
		t.Errorf("the budgets lost %d tokens of spend; at most %d (answered from %v before the failover's start to %v after it) may be",
			res.lost(), atRisk, start.Sub(riskFrom), riskTo.Sub(start))
	}
	if lost := res.freeProvider - res.freeRecorded; lost > freeAtRisk {
		t.Errorf("the free tenant's usage lost %d tokens; at most %d (answered from %v before the failover's start to %v after it) may be",
			lost, freeAtRisk, start.Sub(riskFrom), riskTo.Sub(start))
	}
	return res
}

// recordedTokens reads the tokens recorded for tenant in its usage rows
// (GET /admin/usage), polling until two reads 200ms apart agree: usage
// without a budget is recorded in batches.
func recordedTokens(t *testing.T, ctx context.Context, r *e2eutil.Replica, tenant string) int64 {
	t.Helper()
	read := func() int64 {
		var out []struct {
			Rows []budget.UsageRow `json:"rows"`
		}
		if err := r.Get(ctx, "/admin/usage?tenant="+tenant, e2eutil.AdminToken, &out); err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, u := range out {
			for _, row := range u.Rows {
				n += row.PromptTokens + row.CompletionTokens
			}
		}
		return n
	}
	last := read()
	for range 50 {
		time.Sleep(200 * time.Millisecond) // batches flush on their own timer: nothing to wait on
		n := read()
		if n == last {
			return n
		}
		last = n
	}
	return last
}

// logMedians logs the medians of the results of one kind of failover.
func logMedians(t *testing.T, kind string, rs []failoverResult) {
	if len(rs) == 0 {
		return
	}
	med := func(f func(failoverResult) float64) float64 {
		v := make([]float64, len(rs))
		for i, r := range rs {
			v[i] = f(r)
		}
		slices.Sort(v)
		return v[len(v)/2]
	}
	errs := map[string]bool{}
	for _, r := range rs {
		for k := range r.errors {
			errs[k] = true
		}
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(errs)) {
		parts = append(parts, fmt.Sprintf("%s %.0f", k, med(func(r failoverResult) float64 { return float64(r.errors[k]) })))
	}
	t.Logf("%s failover, medians of %d runs: takeover %.1fs, recovery %.1fs; window %.1fs: %.0f answered, errors: %s; lost spend %.0f of %.0f tokens (capped), %.0f of %.0f (free)",
		kind, len(rs),
		med(func(r failoverResult) float64 { return r.takeover.Seconds() }),
		med(func(r failoverResult) float64 { return r.recovery.Seconds() }),
		med(func(r failoverResult) float64 { return r.window.Seconds() }),
		med(func(r failoverResult) float64 { return float64(r.served) }),
		strings.Join(parts, ", "),
		med(func(r failoverResult) float64 { return float64(r.lost()) }),
		med(func(r failoverResult) float64 { return float64(r.provider) }),
		med(func(r failoverResult) float64 { return float64(r.freeProvider - r.freeRecorded) }),
		med(func(r failoverResult) float64 { return float64(r.freeProvider) }))
}

package simrun

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
)

// Arm names.
const (
	ArmDirect  = "direct"
	ArmLlmgate = "llmgate"
)

// Result is what one run measured: the same workload straight to the
// provider and through the gateway.
type Result struct {
	Scenario    string `json:"scenario"`
	Description string `json:"description"`
	Replicas    int    `json:"replicas"`
	Store       string `json:"store"` // "memory" or "redis" (never the URL: it may hold a password)
	Seed        uint64 `json:"seed"`
	Arms        []Arm  `json:"arms"`
}

// Arm is what one arm measured. Latencies are in milliseconds.
type Arm struct {
	Name string `json:"name"`
	// Seconds is how long the arm ran (until its last answer, or its
	// duration bound).
	Seconds float64 `json:"seconds"`
	// Requests are the requests the clients made (a retry is the same
	// request); Succeeded those answered 200 within their deadline.
	Requests int `json:"requests"`
	// Cut are the requests still running when the arm's duration ended,
	// left out of every other figure.
	Cut         int     `json:"cut"`
	Succeeded   int     `json:"succeeded"`
	SuccessRate float64 `json:"success_rate"`
	// Client429 are the 429 answers clients received (retried or not);
	// Failed429 the requests that ended with one.
	Client429 int `json:"client_429"`
	Failed429 int `json:"failed_429"`
	// Failures counts the requests that failed by their last status
	// ("0": no answer within the deadline, or the connection failed).
	Failures map[string]int `json:"failures,omitempty"`
	// Provider429 are the 429s the provider answered; UpstreamCalls every
	// request that reached it; ProviderErrors its 5xx answers.
	Provider429    int `json:"provider_429"`
	ProviderErrors int `json:"provider_errors"`
	UpstreamCalls  int `json:"upstream_calls"`
	// TokensBilled are the prompt plus completion tokens the provider
	// counted for the calls it answered; CostUSD their price.
	TokensBilled int64   `json:"tokens_billed"`
	CostUSD      float64 `json:"cost_usd"`
	// QuotaUsed is the share of the provider's quota used over the arm:
	// per model, requests (or tokens, whichever is higher) admitted over
	// what the quota allowed (a full minute's bucket at the start plus its
	// refill); the figure is over all models with a quota.
	QuotaUsed float64 `json:"quota_used"`
	// Latency of the requests that succeeded, client side.
	LatencyMS Percentiles `json:"latency_ms"`
	// Histogram of those latencies.
	Histogram []Bucket `json:"latency_histogram"`
	// Series is one point per second of the arm.
	Series []Point `json:"series"`
	// Classes break the requests down by model and priority.
	Classes []ClassResult `json:"classes,omitempty"`
	// Groups is set when prompts are sent in identical groups.
	Groups *Groups `json:"groups,omitempty"`
	// Turns is set for conversations.
	Turns *Turns `json:"turns,omitempty"`
	// Budget is set when the gateway has a budget.
	Budget *BudgetResult `json:"budget,omitempty"`
}

// Percentiles of a latency distribution, in milliseconds.
type Percentiles struct {
	P50 float64 `json:"p50"`
	P95 float64 `json:"p95"`
	P99 float64 `json:"p99"`
	Max float64 `json:"max"`
}

// Bucket counts latencies up to UpToMS (and above the previous bucket's).
type Bucket struct {
	UpToMS float64 `json:"up_to_ms"`
	Count  int     `json:"count"`
}

// Point is one second of an arm: requests the provider admitted (answered
// 200), 429s the clients received, and requests waiting (sent by a client,
// not yet at the provider: in the gateway's queue, or in a client's
// retry backoff), averaged over the second.
type Point struct {
	Second   int     `json:"t"`
	Admitted int     `json:"admitted"`
	Got429   int     `json:"rejected_429"`
	Queued   float64 `json:"queued"`
}

// ClassResult is one model and priority of the mix.
type ClassResult struct {
	Model     string      `json:"model"`
	Priority  string      `json:"priority"`
	Requests  int         `json:"requests"`
	Succeeded int         `json:"succeeded"`
	LatencyMS Percentiles `json:"latency_ms"`
}

// Groups counts upstream calls per group of identical requests.
type Groups struct {
	Groups int `json:"groups"`
	// CallsMin and CallsMax are the fewest and most provider calls
	// answered 200 for one group's prompt.
	CallsMin int `json:"calls_min"`
	CallsMax int `json:"calls_max"`
}

// Turns says whether conversation turns reached the provider in order.
type Turns struct {
	Sessions int `json:"sessions"`
	// Sent are the messages sent, Duplicates the copies among them.
	Sent       int `json:"sent"`
	Duplicates int `json:"duplicates"`
	// OutOfOrder are the turns the provider answered after a later turn
	// of the same session; SessionsOutOfOrder the sessions with one.
	OutOfOrder         int `json:"out_of_order"`
	SessionsOutOfOrder int `json:"sessions_out_of_order"`
}

// BudgetResult compares the spend with the tenant's cap.
type BudgetResult struct {
	CapTokens int64   `json:"cap_tokens,omitempty"`
	CapUSD    float64 `json:"cap_usd,omitempty"`
	// Over is the billed tokens (or cost) over the cap, as a share of it:
	// 0.5 = 50% overshoot; 0 when the spend stayed under.
	Over float64 `json:"over"`
}

// Arm returns the arm called name, or nil.
func (r *Result) Arm(name string) *Arm {
	for i := range r.Arms {
		if r.Arms[i].Name == name {
			return &r.Arms[i]
		}
	}
	return nil
}

// WriteJSON writes r as indented JSON.
func (r *Result) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// Rows are the table's lines: a label, then one value per arm. The HTML
// report shows the same rows.
func (r *Result) Rows() [][]string {
	rows := [][]string{{""}}
	for _, a := range r.Arms {
		rows[0] = append(rows[0], a.Name)
	}
	add := func(label string, f func(a *Arm) string) {
		row := []string{label}
		for i := range r.Arms {
			row = append(row, f(&r.Arms[i]))
		}
		rows = append(rows, row)
	}
	add("requests", func(a *Arm) string { return fmt.Sprint(a.Requests) })
	if r.hasAny(func(a *Arm) bool { return a.Cut > 0 }) {
		add("cut by the end of the run", func(a *Arm) string { return fmt.Sprint(a.Cut) })
	}
	add("succeeded", func(a *Arm) string { return fmt.Sprintf("%d (%s)", a.Succeeded, pct(a.SuccessRate)) })
	add("failed (by last status)", func(a *Arm) string {
		if len(a.Failures) == 0 {
			return "-"
		}
		keys := make([]string, 0, len(a.Failures))
		for k := range a.Failures {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		var parts []string
		for _, k := range keys {
			label := k
			if k == "0" {
				label = "timeout"
			}
			parts = append(parts, fmt.Sprintf("%s: %d", label, a.Failures[k]))
		}
		return strings.Join(parts, ", ")
	})
	add("429s seen by clients", func(a *Arm) string { return fmt.Sprint(a.Client429) })
	add("429s at the provider", func(a *Arm) string { return fmt.Sprint(a.Provider429) })
	add("upstream calls", func(a *Arm) string { return fmt.Sprint(a.UpstreamCalls) })
	add("tokens billed", func(a *Arm) string { return fmt.Sprint(a.TokensBilled) })
	add("cost", func(a *Arm) string { return fmt.Sprintf("$%.4f", a.CostUSD) })
	add("quota used", func(a *Arm) string { return pct(a.QuotaUsed) })
	add("latency p50", func(a *Arm) string { return ms(a.LatencyMS.P50) })
	add("latency p95", func(a *Arm) string { return ms(a.LatencyMS.P95) })
	add("latency p99", func(a *Arm) string { return ms(a.LatencyMS.P99) })
	add("run time", func(a *Arm) string { return fmt.Sprintf("%.1fs", a.Seconds) })
	if r.hasAny(func(a *Arm) bool { return a.Groups != nil }) {
		add("upstream calls per group", func(a *Arm) string {
			if a.Groups == nil {
				return "-"
			}
			if a.Groups.CallsMin == a.Groups.CallsMax {
				return fmt.Sprint(a.Groups.CallsMax)
			}
			return fmt.Sprintf("%d-%d", a.Groups.CallsMin, a.Groups.CallsMax)
		})
	}
	if r.hasAny(func(a *Arm) bool { return a.Turns != nil }) {
		add("turns out of order", func(a *Arm) string {
			if a.Turns == nil {
				return "-"
			}
			return fmt.Sprintf("%d (%d sessions)", a.Turns.OutOfOrder, a.Turns.SessionsOutOfOrder)
		})
	}
	if r.hasAny(func(a *Arm) bool { return a.Budget != nil }) {
		add("spend over the budget", func(a *Arm) string {
			if a.Budget == nil {
				return "-"
			}
			return pct(a.Budget.Over)
		})
	}
	if r.hasAny(func(a *Arm) bool { return len(a.Classes) > 1 }) {
		for i := range r.Arms[0].Classes {
			c := r.Arms[0].Classes[i]
			label := fmt.Sprintf("%s %s p95", c.Model, c.Priority)
			add(label, func(a *Arm) string {
				if i >= len(a.Classes) {
					return "-"
				}
				x := a.Classes[i]
				return fmt.Sprintf("%s (%d/%d ok)", ms(x.LatencyMS.P95), x.Succeeded, x.Requests)
			})
		}
	}
	return rows
}

func (r *Result) hasAny(f func(*Arm) bool) bool {
	return slices.ContainsFunc(r.Arms, func(a Arm) bool { return f(&a) })
}

// WriteTable writes the result as an aligned table.
func (r *Result) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "llmgate sim %s: %d replica(s), %s store, seed %d\n", r.Scenario, r.Replicas, r.Store, r.Seed)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	for _, row := range r.Rows() {
		fmt.Fprintln(tw, strings.Join(row, "\t"))
	}
	return tw.Flush()
}

func pct(f float64) string { return fmt.Sprintf("%.1f%%", 100*f) }

func ms(v float64) string {
	if v >= 1000 {
		return fmt.Sprintf("%.2fs", v/1000)
	}
	return fmt.Sprintf("%.0fms", v)
}

// percentiles of sorted latencies (ms).
func percentiles(sorted []float64) Percentiles {
	if len(sorted) == 0 {
		return Percentiles{}
	}
	at := func(q float64) float64 {
		i := int(math.Ceil(q*float64(len(sorted)))) - 1
		return sorted[max(0, min(i, len(sorted)-1))]
	}
	return Percentiles{P50: round1(at(0.50)), P95: round1(at(0.95)), P99: round1(at(0.99)), Max: round1(sorted[len(sorted)-1])}
}

// histogram counts sorted latencies in buckets on a 1-2-5 scale.
func histogram(sorted []float64) []Bucket {
	if len(sorted) == 0 {
		return nil
	}
	var bounds []float64
	for b := 10.0; ; b *= 10 {
		bounds = append(bounds, b, 2*b, 5*b)
		if 5*b >= sorted[len(sorted)-1] {
			break
		}
	}
	out := make([]Bucket, len(bounds))
	i := 0
	for k, up := range bounds {
		out[k].UpToMS = up
		for i < len(sorted) && sorted[i] <= up {
			out[k].Count++
			i++
		}
	}
	out[len(out)-1].Count += len(sorted) - i
	// Leading empty buckets say nothing.
	for len(out) > 1 && out[0].Count == 0 {
		out = out[1:]
	}
	return out
}

func round1(v float64) float64 { return math.Round(v*10) / 10 }

func round4(v float64) float64 { return math.Round(v*1e4) / 1e4 }

// Command summarize reads JSON lines written by `peers --json` (or
// `llmgate bench lock --json`) and prints the median of each figure per
// configuration as a Markdown table.
//
//	go run ./summarize < ../out/results.jsonl
package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
)

type row = map[string]any

// columns printed, in order.
var columns = []string{
	"ops_per_sec", "ping_p50_us", "ping_during_p50_us", "pair_p50_us", "pair_pings",
	"handoff_p50_us", "handoff_p50_pings", "handoff_p99_us", "wait_p50_us", "wait_p99_us", "wait_max_us",
	"jain", "self_reacquire_pct", "violations", "lock_errors",
}

func main() {
	if err := run(os.Stdin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "summarize:", err)
		os.Exit(1)
	}
}

func run(in io.Reader, out io.Writer) error {
	groups := map[string][]row{}
	var order []string
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || !strings.HasPrefix(line, "{") {
			continue
		}
		var r row
		if err := json.Unmarshal([]byte(line), &r); err != nil {
			return err
		}
		k := key(r)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], r)
	}
	if err := sc.Err(); err != nil {
		return err
	}
	fmt.Fprintf(out, "| config | n | %s |\n", strings.Join(columns, " | "))
	fmt.Fprintf(out, "|---|---|%s\n", strings.Repeat("---|", len(columns)))
	for _, k := range order {
		rs := groups[k]
		cells := make([]string, len(columns))
		for i, c := range columns {
			cells[i] = median(rs, c)
		}
		fmt.Fprintf(out, "| %s | %d | %s |\n", k, len(rs), strings.Join(cells, " | "))
	}
	return nil
}

func key(r row) string {
	k := fmt.Sprintf("%v w=%v keys=%v cs=%vus", r["algo"], r["workers"], r["keys"], r["cs_us"])
	if r["fair"] == true {
		k += " fair"
	}
	if r["shared_client"] == true {
		k += " shared"
	}
	return k
}

// median of field f over rs; max for violations and errors (they must all be 0).
func median(rs []row, f string) string {
	var xs []float64
	for _, r := range rs {
		if v, ok := r[f].(float64); ok {
			xs = append(xs, v)
		}
	}
	if len(xs) == 0 {
		return ""
	}
	slices.Sort(xs)
	if f == "violations" || f == "lock_errors" {
		return fmt.Sprintf("%g", xs[len(xs)-1])
	}
	m := xs[len(xs)/2]
	if len(xs)%2 == 0 {
		m = (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
	}
	switch {
	case f == "jain":
		return fmt.Sprintf("%.4f", m)
	case m >= 100:
		return fmt.Sprintf("%.0f", m)
	default:
		return fmt.Sprintf("%.2f", m)
	}
}

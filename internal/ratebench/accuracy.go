package ratebench

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/storeurl"
	"github.com/llmgate/llmgate/ratelimit"
)

// childFlag is the hidden flag that makes Main a worker process of an
// accuracy run.
const childFlag = "accuracy-child"

// maxAttempts bounds every worker's loop whatever the clocks do.
const maxAttempts = 50_000_000

// AccuracyConfig describes an accuracy run: Procs processes with Workers
// goroutines each, one client per process, ask as fast as they can for
// admission against one limit of Rate per second for Duration.
type AccuracyConfig struct {
	Store    string
	Algo     string // AlgoLlmgate or AlgoGCRA
	Procs    int
	Workers  int   // per process
	Rate     int64 // admissions per second
	Burst    int64 // bucket size; 0 means Rate
	Duration time.Duration
	Wait     bool // llmgate only: Wait in the queue until the end instead of Allow
	Local    bool // llmgate only: a local quota, one Limiter per process
	// Command is the program and arguments that run a worker process; the
	// worker flags are appended. Default: this executable, "bench",
	// "ratelimit" (the llmgate command line).
	Command []string
}

// Validate reports an AccuracyConfig that cannot run.
func (c AccuracyConfig) Validate() error {
	switch {
	case c.Algo != AlgoLlmgate && c.Algo != AlgoGCRA:
		return fmt.Errorf("%w: --algo must be %s or %s, got %q", ErrConfig, AlgoLlmgate, AlgoGCRA, c.Algo)
	case c.Procs < 1 || c.Procs > 256:
		return fmt.Errorf("%w: --procs must be between 1 and 256, got %d", ErrConfig, c.Procs)
	case c.Workers < 1 || c.Workers > 1000:
		return fmt.Errorf("%w: --workers (per process in --accuracy) must be between 1 and 1000, got %d", ErrConfig, c.Workers)
	case c.Rate < 1 || c.Rate > 10_000_000:
		return fmt.Errorf("%w: --rate must be between 1 and 10000000 per second, got %d", ErrConfig, c.Rate)
	case c.Burst < 0:
		return fmt.Errorf("%w: --burst must not be negative, got %d", ErrConfig, c.Burst)
	case c.Duration <= 0 || c.Duration > time.Hour:
		return fmt.Errorf("%w: --duration must be positive and at most 1h, got %v", ErrConfig, c.Duration)
	case c.Wait && c.Algo != AlgoLlmgate:
		return fmt.Errorf("%w: --wait needs --algo %s", ErrConfig, AlgoLlmgate)
	case c.Local && c.Algo != AlgoLlmgate:
		return fmt.Errorf("%w: --local needs --algo %s", ErrConfig, AlgoLlmgate)
	case storeurl.IsMemory(c.Store):
		return fmt.Errorf("%w: --accuracy needs a Redis store shared by the processes", ErrConfig)
	}
	return nil
}

// AccuracyResult is the outcome of an accuracy run.
//
// Ideal is what a perfect limiter could have admitted: the bucket holds
// Burst at the first admission (it starts full) and refills at Rate per
// second while the workers ask, so Ideal = Burst + Rate × (end − first
// admitted call's start), where end is the later of the end of the run and
// the return of the last admitted call. Both instants come from the
// workers' wall clocks, which on one machine are Redis's TIME too; they
// bracket the server's first and last admission, so Ideal is an upper
// bound: Over counts admissions beyond it and must be 0.
type AccuracyResult struct {
	Mode        string  `json:"mode"` // "accuracy"
	Algo        string  `json:"algo"`
	Store       string  `json:"store"`
	Procs       int     `json:"procs"`
	Workers     int     `json:"workers"` // per process
	Rate        int64   `json:"rate"`
	Burst       int64   `json:"burst"`
	Wait        bool    `json:"wait"`
	Local       bool    `json:"local_quota,omitempty"`
	DurationS   float64 `json:"duration_s"` // first admitted call's start to the end (see Ideal)
	Admitted    int64   `json:"admitted"`
	Ideal       float64 `json:"ideal"`
	Over        int64   `json:"over"`
	AccuracyPct float64 `json:"accuracy_pct"` // admitted / ideal
	// Owed is what a perfect bucket had certainly handed out by the last
	// refusal: Burst + Rate × (the last refused call's start − the first
	// admitted call's return), as long as it never filled up in between
	// (no pause of every worker longer than Burst/Rate). Unlike Ideal it
	// does not grow while the workers do not ask (a process paused by a
	// busy machine, a reply read late at the end of the run), so
	// Admitted/Owed below 100% is a limiter refusing what it had. 0 when
	// nothing was refused.
	Owed       float64 `json:"owed"`
	OwedPct    float64 `json:"owed_pct,omitempty"` // admitted / owed
	Attempts   int64   `json:"attempts"`
	Errors     int64   `json:"errors"`
	FirstError string  `json:"first_error,omitempty"`
	PerProcess []int64 `json:"per_process"`
	StartedAt  string  `json:"started_at"`
}

// workerResult is what one process reports.
type workerResult struct {
	Admitted   int64 `json:"admitted"`
	Attempts   int64 `json:"attempts"`
	FirstStart int64 `json:"first_start"` // unix ns; 0: nothing admitted
	FirstEnd   int64 `json:"first_end"`   // unix ns: the earliest return of an admitted call
	LastEnd    int64 `json:"last_end"`    // unix ns: the last admitted call's return, or the run's end
	// LastRefused is when the latest refused call started (unix ns; 0:
	// none): the store refused it after that, when it had nothing left.
	LastRefused int64  `json:"last_refused"`
	Errors      int64  `json:"errors"`
	FirstError  string `json:"first_error,omitempty"`
}

func (r *workerResult) add(o workerResult) {
	r.Admitted += o.Admitted
	r.Attempts += o.Attempts
	r.Errors += o.Errors
	if o.FirstStart != 0 && (r.FirstStart == 0 || o.FirstStart < r.FirstStart) {
		r.FirstStart = o.FirstStart
	}
	if o.FirstEnd != 0 && (r.FirstEnd == 0 || o.FirstEnd < r.FirstEnd) {
		r.FirstEnd = o.FirstEnd
	}
	r.LastEnd = max(r.LastEnd, o.LastEnd)
	r.LastRefused = max(r.LastRefused, o.LastRefused)
	if r.FirstError == "" {
		r.FirstError = o.FirstError
	}
}

// childArgs are the worker flags for cfg on key.
func childArgs(cfg AccuracyConfig, key string) []string {
	args := []string{"--" + childFlag, "--store", cfg.Store, "--algo", cfg.Algo, "--key", key,
		"--rate", strconv.FormatInt(cfg.Rate, 10), "--burst", strconv.FormatInt(cfg.Burst, 10),
		"--workers", strconv.Itoa(cfg.Workers)}
	if cfg.Wait {
		args = append(args, "--wait")
	}
	if cfg.Local {
		args = append(args, "--local")
	}
	return args
}

// lockedWriter serialises writes to w.
type lockedWriter struct {
	mu sync.Mutex // protects w
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

type child struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string
	done  chan struct{}
}

func (c *child) line(ctx context.Context, d time.Duration) (string, error) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case l, ok := <-c.lines:
		if !ok {
			return "", errors.New("worker process exited early")
		}
		return l, nil
	case <-t.C:
		return "", fmt.Errorf("worker process said nothing within %v", d)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// Accuracy runs an accuracy test: it starts cfg.Procs worker processes
// sharing one fresh limit, lets them ask for admissions from a common start
// instant for cfg.Duration, and adds up what they were admitted.
func Accuracy(ctx context.Context, cfg AccuracyConfig, stderr io.Writer) (*AccuracyResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := storeurl.RedisOption(cfg.Store); err != nil {
		return nil, err
	}
	if cfg.Burst == 0 {
		cfg.Burst = cfg.Rate
	}
	command := cfg.Command
	if len(command) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, fmt.Errorf("ratebench: cannot find this executable to start workers: %w", err)
		}
		command = []string{exe, "bench", "ratelimit"}
	}
	key := "ratebench-accuracy-" + newRunID()
	res := &AccuracyResult{
		Mode: "accuracy", Algo: cfg.Algo, Store: storeurl.Redact(cfg.Store), Procs: cfg.Procs, Workers: cfg.Workers,
		Rate: cfg.Rate, Burst: cfg.Burst, Wait: cfg.Wait, Local: cfg.Local, StartedAt: time.Now().UTC().Format(time.RFC3339),
	}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	if _, ok := stderr.(*os.File); !ok && stderr != nil {
		stderr = &lockedWriter{w: stderr} // the children's stderr is copied in by one goroutine each
	}
	children := make([]*child, 0, cfg.Procs)
	defer func() {
		for _, c := range children {
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}()
	for i := range cfg.Procs {
		cmd := exec.CommandContext(cctx, command[0], append(append([]string(nil), command[1:]...), childArgs(cfg, key)...)...)
		cmd.Stderr = stderr
		stdin, err := cmd.StdinPipe()
		if err != nil {
			return nil, err
		}
		out, err := cmd.StdoutPipe()
		if err != nil {
			return nil, err
		}
		if err := cmd.Start(); err != nil {
			return nil, fmt.Errorf("ratebench: start worker process %d: %w", i, err)
		}
		c := &child{cmd: cmd, stdin: stdin, lines: make(chan string, 8), done: make(chan struct{})}
		go func() {
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				c.lines <- sc.Text()
			}
			close(c.lines)
			_ = cmd.Wait()
			close(c.done)
		}()
		children = append(children, c)
	}
	for i, c := range children {
		l, err := c.line(ctx, 30*time.Second)
		if err != nil || l != "ready" {
			return nil, fmt.Errorf("ratebench: worker process %d: %q %v", i, l, err)
		}
	}
	start := time.Now().Add(200 * time.Millisecond)
	end := start.Add(cfg.Duration)
	for i, c := range children {
		if _, err := fmt.Fprintf(c.stdin, "go %d %d\n", start.UnixNano(), end.UnixNano()); err != nil {
			return nil, fmt.Errorf("ratebench: worker process %d: %w", i, err)
		}
	}
	var total workerResult
	for i, c := range children {
		l, err := c.line(ctx, cfg.Duration+60*time.Second)
		if err != nil {
			return nil, fmt.Errorf("ratebench: worker process %d: %w", i, err)
		}
		raw, ok := strings.CutPrefix(l, "result ")
		if !ok {
			return nil, fmt.Errorf("ratebench: worker process %d said %q", i, l)
		}
		var wr workerResult
		if err := json.Unmarshal([]byte(raw), &wr); err != nil {
			return nil, fmt.Errorf("ratebench: worker process %d: %w", i, err)
		}
		res.PerProcess = append(res.PerProcess, wr.Admitted)
		total.add(wr)
	}
	res.Admitted, res.Attempts, res.Errors, res.FirstError = total.Admitted, total.Attempts, total.Errors, total.FirstError
	if total.FirstStart == 0 {
		return res, fmt.Errorf("ratebench: nothing was admitted (%d errors; first: %s)", total.Errors, total.FirstError)
	}
	elapsed := time.Duration(total.LastEnd - total.FirstStart)
	res.DurationS = round(elapsed.Seconds(), 4)
	res.Ideal = round(float64(cfg.Burst)+float64(cfg.Rate)*elapsed.Seconds(), 2)
	res.Over = max(0, res.Admitted-int64(math.Floor(float64(cfg.Burst)+float64(cfg.Rate)*elapsed.Seconds()+1e-9)))
	res.AccuracyPct = round(100*float64(res.Admitted)/(float64(cfg.Burst)+float64(cfg.Rate)*elapsed.Seconds()), 2)
	if total.LastRefused != 0 {
		asked := max(0, time.Duration(total.LastRefused-total.FirstEnd))
		owed := float64(cfg.Burst) + float64(cfg.Rate)*asked.Seconds()
		res.Owed = round(owed, 2)
		res.OwedPct = round(100*float64(res.Admitted)/owed, 2)
	}
	return res, nil
}

// runChild is the body of a worker process: it connects, says "ready",
// reads "go <start ns> <end ns>" from stdin, asks for admissions from start
// to end, and prints "result <json>".
func runChild(ctx context.Context, cfg AccuracyConfig, key string, stdin io.Reader, stdout io.Writer) error {
	opt, err := storeurl.RedisOption(cfg.Store)
	if err != nil {
		return err
	}
	c, err := rueidis.NewClient(opt)
	if err != nil {
		return fmt.Errorf("ratebench: cannot connect to %s: %w", storeurl.Redact(cfg.Store), err)
	}
	defer c.Close()
	if cfg.Burst == 0 {
		cfg.Burst = cfg.Rate
	}
	lim := ratelimit.Limit{Kind: ratelimit.Requests, Limit: cfg.Rate, Window: time.Second, Burst: cfg.Burst}
	var newDecider func() decider
	switch cfg.Algo {
	case AlgoGCRA:
		newDecider = func() decider { return newGCRADecider(c, "ratebench:{"+key+"}", cfg.Rate, cfg.Burst, time.Second) }
	default:
		req := ratelimit.Request{Charges: []ratelimit.Charge{{Scope: key, Limit: lim, Cost: 1}}}
		l := newLimiter(c, key, cfg.Local) // one per process: one replica
		newDecider = func() decider { return newLimiterDecider(l, req, cfg.Wait, false) }
	}
	fmt.Fprintln(stdout, "ready")
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil {
		return fmt.Errorf("ratebench: reading the start line: %w", err)
	}
	var startNS, endNS int64
	if _, err := fmt.Sscanf(line, "go %d %d", &startNS, &endNS); err != nil {
		return fmt.Errorf("ratebench: start line %q: %w", line, err)
	}
	start, end := time.Unix(0, startNS), time.Unix(0, endNS)
	// Load the script before the start, so the first attempts are like the rest.
	if err := gcraScript.Exec(ctx, c, []string{"ratebench:{warm-" + key + "}"}, []string{"1", "1", "1", "0"}).Error(); err != nil {
		return fmt.Errorf("ratebench: warm-up: %w", err)
	}
	time.Sleep(time.Until(start)) // the agreed start instant
	var mu sync.Mutex
	var total workerResult
	var wg sync.WaitGroup
	for range cfg.Workers {
		d := newDecider()
		wg.Go(func() {
			var r workerResult
			for range maxAttempts {
				t0 := time.Now()
				if !t0.Before(end) || ctx.Err() != nil {
					break
				}
				dctx, cancel := ctx, context.CancelFunc(func() {})
				if cfg.Wait { // a waiter gives up at the end; an Allow in flight completes
					dctx, cancel = context.WithDeadline(ctx, end)
				}
				ok, err := d.decide(dctx)
				cancel()
				t1 := time.Now()
				r.Attempts++
				// An admission happened before its call returned; a refusal,
				// or a waiter that gave up (and returns only after its
				// Abandon), bounds nothing past the end of the run.
				if err == nil && ok {
					r.LastEnd = max(r.LastEnd, t1.UnixNano())
				} else {
					r.LastEnd = max(r.LastEnd, min(t1.UnixNano(), end.UnixNano()))
				}
				if err != nil {
					r.Errors++
					if r.FirstError == "" {
						r.FirstError = err.Error()
					}
					continue
				}
				if ok {
					r.Admitted++
					if r.FirstStart == 0 {
						r.FirstStart = t0.UnixNano()
					}
					if r.FirstEnd == 0 {
						r.FirstEnd = t1.UnixNano()
					}
				} else {
					r.LastRefused = t0.UnixNano()
				}
			}
			mu.Lock()
			total.add(r)
			mu.Unlock()
		})
	}
	wg.Wait()
	raw, err := json.Marshal(total)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "result %s\n", raw)
	return err
}

package simrun

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

const (
	// replicaStartup bounds the wait for a replica to answer /readyz.
	replicaStartup = 60 * time.Second
	// replicaStop is how long a replica may take to exit after SIGTERM
	// before it is killed.
	replicaStop = 10 * time.Second
	// logTail is how much of a replica's output is kept for messages.
	logTail = 16 << 10
)

// listeningRE finds the address in serve's "listening" log line.
var listeningRE = regexp.MustCompile(`llmgate gateway listening.*addr=http://(127\.0\.0\.1:[0-9]+)/v1`)

// tail keeps the last logTail bytes written to it and signals writes.
type tail struct {
	mu      sync.Mutex // protects b, changed
	b       []byte
	changed chan struct{}
}

func newTail() *tail { return &tail{changed: make(chan struct{})} }

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > logTail {
		t.b = append([]byte(nil), t.b[len(t.b)-logTail:]...)
	}
	close(t.changed)
	t.changed = make(chan struct{})
	return len(p), nil
}

func (t *tail) snapshot() (string, <-chan struct{}) {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b), t.changed
}

// replica is one `llmgate serve` child process.
type replica struct {
	name string
	cmd  *exec.Cmd
	out  *tail
	url  string        // http://127.0.0.1:PORT once ready
	done chan struct{} // closed when the process has exited
}

// startReplicas starts n `BIN serve --config cfgPath` processes and waits
// until each answers /readyz. On error the ones started are stopped.
func startReplicas(ctx context.Context, bin string, n int, cfgPath string, env []string) (_ []*replica, err error) {
	var rs []*replica
	defer func() {
		if err != nil {
			stopReplicas(rs)
		}
	}()
	for i := range n {
		r := &replica{name: fmt.Sprintf("replica-%d", i+1), out: newTail(), done: make(chan struct{})}
		r.cmd = exec.Command(bin, "serve", "--config", cfgPath)
		r.cmd.Env = env
		r.cmd.Stdout, r.cmd.Stderr = r.out, r.out
		r.cmd.SysProcAttr = childAttr()
		r.cmd.WaitDelay = time.Second
		if err := r.cmd.Start(); err != nil {
			return nil, fmt.Errorf("start %s serve: %w", bin, err)
		}
		go func() {
			_ = r.cmd.Wait()
			close(r.done)
		}()
		rs = append(rs, r)
	}
	for _, r := range rs {
		if err := r.waitReady(ctx); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

func (r *replica) waitReady(ctx context.Context) error {
	deadline := time.NewTimer(replicaStartup)
	defer deadline.Stop()
	for r.url == "" {
		have, changed := r.out.snapshot()
		if m := listeningRE.FindStringSubmatch(have); m != nil {
			r.url = "http://" + m[1]
			break
		}
		select {
		case <-changed:
		case <-r.done:
			return fmt.Errorf("gateway %s exited at start:\n%s", r.name, indent(have))
		case <-deadline.C:
			return fmt.Errorf("gateway %s did not listen within %v:\n%s", r.name, replicaStartup, indent(have))
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	// A health endpoint has nothing to wait on but itself: poll it.
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	var last error
	for {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		req, _ := http.NewRequestWithContext(rctx, http.MethodGet, r.url+"/readyz", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				cancel()
				return nil
			}
			err = fmt.Errorf("/readyz answered %s", resp.Status)
		}
		cancel()
		last = err
		select {
		case <-tick.C:
		case <-r.done:
			have, _ := r.out.snapshot()
			return fmt.Errorf("gateway %s exited before it was ready:\n%s", r.name, indent(have))
		case <-deadline.C:
			return fmt.Errorf("gateway %s not ready within %v: %v", r.name, replicaStartup, last)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// stopReplicas sends SIGTERM then SIGINT (a second signal skips the drain
// delay) to every replica, and kills those still running after
// replicaStop.
func stopReplicas(rs []*replica) {
	for _, r := range rs {
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		_ = r.cmd.Process.Signal(syscall.SIGINT)
	}
	timer := time.NewTimer(replicaStop)
	defer timer.Stop()
	for _, r := range rs {
		select {
		case <-r.done:
		case <-timer.C:
			for _, k := range rs {
				_ = k.cmd.Process.Kill()
			}
			<-r.done
		}
	}
	for _, r := range rs {
		<-r.done
	}
}

// childEnv is the environment of the replicas: the caller's, without the
// settings that would change what they do, plus extra.
func childEnv(environ []string, extra ...string) []string {
	var env []string
	for _, kv := range environ {
		k, _, _ := strings.Cut(kv, "=")
		if strings.HasPrefix(k, "LLMGATE_") || k == "OPENAI_API_KEY" || k == "XDG_STATE_HOME" {
			continue
		}
		env = append(env, kv)
	}
	return append(env, extra...)
}

func indent(s string) string {
	s = strings.TrimRight(s, "\n")
	if s == "" {
		return "  (no output)"
	}
	return "  " + strings.ReplaceAll(s, "\n", "\n  ")
}

// writeFile writes data to dir/name, readable only by the user.
func writeFile(dir, name string, data []byte) (string, error) {
	p := filepath.Join(dir, name)
	return p, os.WriteFile(p, data, 0o600)
}

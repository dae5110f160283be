package simrun

import (
	"context"
	"errors"
	"syscall"
	"testing"
	"time"
)

// TestCancelStopsReplicas: cancelling a run (what Ctrl-C does) ends it and
// leaves no replica running.
func TestCancelStopsReplicas(t *testing.T) {
	sc := builtin(t, "burst")
	sc.Clients.Requests = 0
	sc.Clients.Callers = 10
	sc.Duration = 3 * time.Second // the direct arm; the llmgate arm is cancelled at once
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var started []*replica
	replicasStarted = func(rs []*replica) {
		started = rs
		cancel() // as soon as the llmgate arm is up
	}
	defer func() { replicasStarted = nil }()
	res, err := Run(ctx, sc, Options{Binary: llmgateBin, Replicas: 1})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Run = %v, %v; want context.Canceled", res, err)
	}
	if len(started) != 1 {
		t.Fatalf("%d replicas started; want 1", len(started))
	}
	for _, r := range started {
		select {
		case <-r.done:
		default:
			t.Errorf("%s still running after Run returned", r.name)
		}
		if err := r.cmd.Process.Signal(syscall.Signal(0)); err == nil {
			t.Errorf("%s (pid %d) still exists", r.name, r.cmd.Process.Pid)
		}
	}
}

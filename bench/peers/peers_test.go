package main

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/lockbench"
	"github.com/llmgate/llmgate/internal/testutil"
)

// TestPeersSmoke runs every peer algorithm briefly against a real
// redis-server, contended (4 workers on one key) and uncontended (one
// key each, a shared client): each must complete critical sections with
// no overlap and no error, or the measurements in BENCHMARKS.md that
// compare llmgate with them would rest on a broken lock.
func TestPeersSmoke(t *testing.T) {
	r := testutil.StartRedis(t)
	for _, algo := range peerAlgos() {
		for _, tc := range []struct {
			name string
			args []string
		}{
			{"contended", []string{"--workers", "4"}},
			{"uncontended", []string{"--workers", "2", "--keys", "2", "--shared-client"}},
		} {
			t.Run(algo.Name+"/"+tc.name, func(t *testing.T) {
				if _, err := r.Do(t.Context(), "FLUSHALL"); err != nil {
					t.Fatal(err)
				}
				args := append([]string{"--store", r.URL(), "--algo", algo.Name, "--duration", "200ms", "--ping", "10", "--json"}, tc.args...)
				var stdout, stderr bytes.Buffer
				ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
				defer cancel()
				if code := lockbench.MainWith(ctx, args, &stdout, &stderr, peerAlgos()...); code != 0 {
					t.Fatalf("exit %d, stderr:\n%s", code, stderr.String())
				}
				var m struct {
					Acquisitions  float64 `json:"acquisitions"`
					Violations    float64 `json:"violations"`
					LockErrors    float64 `json:"lock_errors"`
					ReleaseErrors float64 `json:"release_errors"`
					FirstError    string  `json:"first_error"`
				}
				if err := json.Unmarshal(stdout.Bytes(), &m); err != nil {
					t.Fatalf("stdout is not the JSON object: %v\n%s", err, stdout.String())
				}
				if m.Acquisitions < 1 || m.Violations != 0 || m.LockErrors+m.ReleaseErrors != 0 {
					t.Fatalf("acquisitions %v, violations %v, errors %v (%s)", m.Acquisitions, m.Violations, m.LockErrors+m.ReleaseErrors, m.FirstError)
				}
			})
		}
	}
}

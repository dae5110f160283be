package localredis

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/llmgate/llmgate/internal/testutil"
)

// TestStart: a throw-away redis-server is started, answers, and is gone
// with its directory after Stop.
func TestStart(t *testing.T) {
	bin, err := testutil.RedisServerPath()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r, err := Start(ctx, bin)
	if err != nil {
		t.Fatal(err)
	}
	addr := strings.TrimPrefix(r.URL, "redis://")
	if err := Ping(ctx, addr); err != nil {
		t.Fatalf("started redis-server does not answer: %v", err)
	}
	r.Stop()
	if err := Ping(ctx, addr); err == nil {
		t.Fatal("redis-server still answers after Stop")
	}
	if _, err := os.Stat(r.Dir()); !os.IsNotExist(err) {
		t.Errorf("its directory %s is still there: %v", r.Dir(), err)
	}
}

// TestPathMissing: without redis-server the error says how to install it.
func TestPathMissing(t *testing.T) {
	t.Setenv("REDIS_SERVER", "")
	t.Setenv("PATH", t.TempDir())
	_, err := Path()
	if err == nil || !strings.Contains(err.Error(), "apt-get install redis-server") {
		t.Fatalf("Path() = %v; want an error saying how to install redis-server", err)
	}
}

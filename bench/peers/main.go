// Command peers runs llmgate's lock benchmark over other Go Redis lock
// libraries (go-redis polling, redsync, bsm/redislock, rueidislock) beside
// llmgate's own lock and the rueidis polling reference, with the same flags
// as `llmgate bench lock`. It is a separate module so that those libraries
// stay out of llmgate's go.mod. See README.md.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/llmgate/llmgate/internal/lockbench"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "lock" {
		args = args[1:] // accept `peers lock ...` like `llmgate bench lock ...`
	}
	code := lockbench.MainWith(ctx, args, os.Stdout, os.Stderr, peerAlgos()...)
	stop()
	os.Exit(code)
}

package redis

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// callBound is how long one command may go unanswered when its context has
// no deadline of its own (see callCtx).
const callBound = time.Second

// errNoReply reports a command that callBound ended.
var errNoReply = fmt.Errorf("no reply from Redis within %v", callBound)

// callCtx is the context a command is sent with.
//
// rueidis runs a command in the calling goroutine (write, then read the
// reply) as long as nobody else uses the connection at the same time; a
// process whose lock calls come one at a time (a cron job, `llmgate lock`,
// a worker with its own client) keeps that fast path. But a context that
// can be cancelled and has no deadline makes rueidis move the connection to
// background reader and writer goroutines for good, so that a cancel can
// abandon a call: every later command then costs two goroutine hand-offs
// (measured here: 1.35x the acquire+release pairs a second from one
// goroutine). Such a context gets a deadline callBound away instead, which
// keeps the fast path and bounds how long a cancel can go unnoticed when
// Redis stops answering; with the connection busy (background mode) the
// cancel still ends the call at once, as before.
func callCtx(ctx context.Context) context.Context {
	if _, ok := ctx.Deadline(); ok || ctx.Done() == nil {
		return ctx
	}
	return boundedCtx{ctx, time.Now().Add(callBound)}
}

// boundedCtx is its parent with a deadline that only bounds the command's
// network wait: Done and Err stay the parent's.
type boundedCtx struct {
	context.Context
	deadline time.Time
}

func (c boundedCtx) Deadline() (time.Time, bool) { return c.deadline, true }

// callErr names the deadline callCtx added when it, not the caller's
// context, ended a command.
func callErr(ctx context.Context, err error) error {
	if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
		return errNoReply
	}
	return err
}

package redis_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/testutil"
	"github.com/llmgate/llmgate/ratelimit"
	"github.com/llmgate/llmgate/ratelimit/redis"
)

// overtaking is a client that holds back its first admit.lua of one mode
// ("q" Enqueue, "a" Admit) the way rueidis can: a command queued on one of
// its connections is still sent when its caller stops waiting for it, and a
// command the caller sends next, on another connection, can reach the
// server first. Once the test closes cancelled, the held command goes out:
// at once if its caller still waits for the reply, else after the caller's
// next command (or release).
type overtaking struct {
	rueidis.Client
	mode      string
	held      chan struct{} // closed when the command is held back
	cancelled chan struct{} // closed by the test once the caller's ctx ended
	sent      chan struct{} // closed when the held command was answered
	next      chan struct{} // closed after a command sent while it was held, or by release

	once, nextOnce sync.Once
	holding        chan struct{} // closed while a command is held
}

func newOvertaking(c rueidis.Client, mode string) *overtaking {
	return &overtaking{
		Client: c, mode: mode, held: make(chan struct{}), cancelled: make(chan struct{}),
		sent: make(chan struct{}), next: make(chan struct{}), holding: make(chan struct{}),
	}
}

// release lets the held command go out after its caller stopped waiting,
// when no command of that caller follows it.
func (c *overtaking) release() { c.nextOnce.Do(func() { close(c.next) }) }

func (c *overtaking) admits(cmd rueidis.Completed) bool { return isAdmit(cmd, c.mode) }

// isAdmit reports whether cmd runs admit.lua in mode.
func isAdmit(cmd rueidis.Completed, mode string) bool {
	cs := cmd.Commands()
	// EVALSHA|EVAL script numkeys key mode ...
	return len(cs) > 4 && (cs[0] == "EVALSHA" || cs[0] == "EVAL") && cs[4] == mode
}

func (c *overtaking) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	first := false
	if c.admits(cmd) {
		c.once.Do(func() { first = true })
	}
	if !first {
		res := c.Client.Do(ctx, cmd)
		select {
		case <-c.holding:
			if e, ok := rueidis.IsRedisErr(res.Error()); !ok || !e.IsNoScript() {
				c.release()
			}
		default:
		}
		return res
	}
	close(c.holding)
	close(c.held)
	out := make(chan rueidis.RedisResult, 1)
	go func() {
		defer close(c.sent)
		<-c.cancelled
		if ctx.Err() != nil { // the caller stopped waiting: its next command goes first
			select {
			case <-c.next:
			case <-time.After(10 * time.Second): // a safety bound; the test fails anyway
			}
		}
		out <- c.Client.Do(context.WithoutCancel(ctx), cmd)
	}()
	select {
	case res := <-out:
		return res
	case <-ctx.Done():
		return rueidis.NewErrorResult(ctx.Err())
	}
}

// TestCutEnqueueLeavesNothing: a waiter whose ctx ends while its Enqueue is
// on the wire gives up without leaving a place in the lane behind, nor a
// permit that a holder's settle would then give that place.
func TestCutEnqueueLeavesNothing(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	scope := newScope(t, "C")
	holder := newLimiter(t, r)
	h := mustAllow(t, ctx, holder, one(scope, conc(1), 1), "holder") // loads the script too
	c := newOvertaking(r.Client(t), "q")
	w := ratelimit.New(redis.New(c, redis.Config{}))

	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := waitAsync(wctx, w, one(scope, conc(1), 1))
	select {
	case <-c.held:
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not enqueue")
	}
	cancel()
	close(c.cancelled)
	select {
	case got := <-ch:
		if !errors.Is(got.err, ratelimit.ErrLimited) || got.d.Allowed {
			t.Fatalf("Wait = %+v, %v; want it to give up", got.d, got.err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the waiter did not return")
	}
	select {
	case <-c.sent: // the Enqueue has run, whenever it reached the server
	case <-time.After(15 * time.Second):
		t.Fatal("the held Enqueue was not answered")
	}
	if err := holder.Settle(ctx, h.ID, []int64{1}); err != nil {
		t.Fatal(err)
	}
	if n := r.Int(t, "ZCARD", base+":c:"+scope); n != 0 {
		t.Errorf("%d permits held after the holder settled and the waiter gave up", n)
	}
	if n := r.Int(t, "ZCARD", laneKey(scope)); n != 0 {
		t.Errorf("%d waiters left in the lane", n)
	}
	d := mustAllow(t, ctx, holder, one(scope, conc(1), 1), "after")
	if err := holder.Settle(ctx, d.ID, []int64{1}); err != nil {
		t.Fatal(err)
	}
}

// TestCutAdmitIsReported: an Allow whose ctx ends while its decision is on
// the wire reports the admission the store made, so that its caller can
// settle it, instead of an error and a permit nobody knows is held.
func TestCutAdmitIsReported(t *testing.T) {
	r := testutil.StartRedis(t)
	ctx := testCtx(t, 30*time.Second)
	scope := newScope(t, "C")
	// Load the script, so that the command held back is the one that admits.
	mustAllow(t, ctx, newLimiter(t, r), one(newScope(t, "load"), rpm(1), 1), "load")
	c := newOvertaking(r.Client(t), "a")
	l := ratelimit.New(redis.New(c, redis.Config{}))

	actx, cancel := context.WithCancel(ctx)
	defer cancel()
	ch := make(chan waited, 1)
	go func() {
		d, err := l.Allow(actx, one(scope, conc(1), 1))
		ch <- waited{d: d, err: err}
	}()
	select {
	case <-c.held:
	case <-time.After(10 * time.Second):
		t.Fatal("Allow did not reach the store")
	}
	cancel()
	close(c.cancelled)
	var got waited
	select {
	case got = <-ch:
	case <-time.After(10 * time.Second):
		t.Fatal("Allow did not return")
	}
	c.release()
	select {
	case <-c.sent:
	case <-time.After(15 * time.Second):
		t.Fatal("the held Admit was not answered")
	}
	if got.err == nil && got.d.Allowed {
		if err := l.Settle(ctx, got.d.ID, []int64{1}); err != nil {
			t.Fatal(err)
		}
	}
	if n := r.Int(t, "ZCARD", base+":c:"+scope); n != 0 {
		t.Errorf("Allow = %+v, %v; yet %d permits are held", got.d, got.err, n)
	}
}

// lostReply is a client whose first admit.lua of one mode runs on the server
// but whose reply is lost on the way back, as when a connection breaks
// after the command was sent.
type lostReply struct {
	rueidis.Client
	mode string
	once sync.Once
}

func (c *lostReply) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	if isAdmit(cmd, c.mode) {
		lost := false
		c.once.Do(func() { lost = true })
		if lost {
			_ = c.Client.Do(ctx, cmd)
			return rueidis.NewErrorResult(errors.New("connection reset by peer"))
		}
	}
	return c.Client.Do(ctx, cmd)
}

// TestLostReplyLeavesNothing: an Enqueue, or an Admit, whose script ran but
// whose reply was lost is answered by the fail-closed policy, and the place
// or the permit it took is given back, not left for a walk to turn into a
// permit that no one settles.
func TestLostReplyLeavesNothing(t *testing.T) {
	for _, mode := range []string{"q", "a"} {
		t.Run(mode, func(t *testing.T) {
			r := testutil.StartRedis(t)
			ctx := testCtx(t, 30*time.Second)
			scope := newScope(t, "L")
			holder := newLimiter(t, r)
			h := mustAllow(t, ctx, holder, one(scope, conc(1), 1), "holder") // loads the script too
			if mode == "a" {
				// Admit finds the permit free.
				if err := holder.Settle(ctx, h.ID, []int64{1}); err != nil {
					t.Fatal(err)
				}
			}
			l := ratelimit.New(redis.New(&lostReply{Client: r.Client(t), mode: mode}, redis.Config{}))
			req := one(scope, conc(1), 1)
			req.Charges[0].Limit.FailClosed = true
			var err error
			if mode == "q" {
				_, err = l.Wait(ctx, req)
			} else {
				_, err = l.Allow(ctx, req)
			}
			if !errors.Is(err, ratelimit.ErrStoreUnavailable) {
				t.Fatalf("err = %v; want the outage, failed closed", err)
			}
			if err := l.Close(ctx); err != nil { // waits for the clean-up
				t.Fatal(err)
			}
			if mode == "q" {
				if err := holder.Settle(ctx, h.ID, []int64{1}); err != nil {
					t.Fatal(err)
				}
			}
			if n := r.Int(t, "ZCARD", base+":c:"+scope); n != 0 {
				t.Errorf("%d permits held; want none", n)
			}
			if n := r.Int(t, "ZCARD", laneKey(scope)); n != 0 {
				t.Errorf("%d waiters left in the lane", n)
			}
			d := mustAllow(t, ctx, holder, one(scope, conc(1), 1), "after")
			if err := holder.Settle(ctx, d.ID, []int64{1}); err != nil {
				t.Fatal(err)
			}
		})
	}
}

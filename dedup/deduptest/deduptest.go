// Package deduptest is the conformance suite every dedup.Backend must pass.
//
// A backend's own tests call Run with a constructor; the suite drives the
// backend through the public dedup.Group API, with several Groups standing
// for several processes, real time and real goroutines.
package deduptest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llmgate/llmgate/dedup"
	"github.com/llmgate/llmgate/lock"
)

// Timing bounds. They are generous because the suite runs under -race on
// small, busy machines; each is still far below the lease or retain period
// whose effect it checks.
const (
	// waitBound bounds every wait for something that should happen "now".
	waitBound = 10 * time.Second
	// slack is how late an event may come after the time it is due.
	slack = time.Second
	// shortLease is the lease of tests where a leader dies.
	shortLease = 500 * time.Millisecond
	// longLease is the lease of tests where no lease may run out.
	longLease = 30 * time.Second
)

// Run runs the conformance suite as subtests of t.
//
// newBackend is called once per simulated process, with the subtest's t.
// Every backend it returns during one Run must share one store, so that the
// Groups over them see each other's flights; a networked backend should
// return one on a new client each time. Each subtest uses its own keys, so
// the store need not be empty.
func Run(t *testing.T, newBackend func(t *testing.T) dedup.Backend) {
	s := &suite{newBackend: newBackend}
	tests := []struct {
		name string
		fn   func(t *testing.T)
	}{
		{"OneLeaderLiveFanOut", s.testOneLeaderLiveFanOut},
		{"LocalFollowersShareTheLeader", s.testLocalSharing},
		{"LocalFollowersShareStoreReads", s.testLocalStoreSharing},
		{"RetainedReplay", s.testRetainedReplay},
		{"RetainedResultExpires", s.testRetainExpires},
		{"ConflictRunning", s.testConflictRunning},
		{"ConflictRetained", s.testConflictRetained},
		{"AbortWakesFollowersAtOnce", s.testAbort},
		{"LeaderDiesFollowersTakeOver", s.testLeaderDies},
		{"LeaderLeaseLost", s.testLeaseLost},
		{"JoinerTakesOverDeadLeader", s.testJoinerTakesOver},
		{"NextDeadline", s.testNextDeadline},
		{"TooLarge", s.testTooLarge},
		{"TooManyFrames", s.testTooManyFrames},
		{"EmptyAndBinaryFrames", s.testBinaryFrames},
		{"FencesIncrease", s.testFencesIncrease},
		{"DistinctRequestsDoNotShare", s.testDistinct},
		{"ClosedUse", s.testClosedUse},
		{"FollowerCloseKeepsOthers", s.testFollowerClose},
		{"RejoinSkipsConsumedFrames", s.testRejoinSkip},
		{"InvalidArguments", s.testInvalid},
	}
	for _, tc := range tests {
		t.Run(tc.name, tc.fn)
	}
}

type suite struct {
	newBackend func(t *testing.T) dedup.Backend
}

// process is one simulated process: a Group over its own backend, which
// the test can cut off from the store.
type process struct {
	g *dedup.Group
	b *Faulty
}

func (s *suite) process(t *testing.T, opts dedup.Options) *process {
	t.Helper()
	b := s.newBackend(t)
	if b == nil {
		t.Fatal("newBackend returned nil")
	}
	f := NewFaulty(b)
	return &process{g: dedup.New(f, opts), b: f}
}

func (s *suite) processes(t *testing.T, n int, opts dedup.Options) []*process {
	t.Helper()
	ps := make([]*process, n)
	for i := range ps {
		ps[i] = s.process(t, opts)
	}
	return ps
}

// newKey returns a key no other subtest or run uses.
func newKey(t *testing.T) string {
	return "deduptest/" + strings.ReplaceAll(t.Name(), "/", ".") + "/" + lock.NewToken()[:8]
}

func testCtx(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(t.Context(), d)
	t.Cleanup(cancel)
	return ctx
}

func frame(i int) []byte { return fmt.Appendf(nil, "frame-%d", i) }

func mustLead(t *testing.T, ctx context.Context, g *dedup.Group, key, fp string) *dedup.Leader {
	t.Helper()
	l, f, err := g.Join(ctx, key, fp, 0)
	if err != nil {
		t.Fatalf("Join(%q): %v", key, err)
	}
	if l == nil {
		f.Close()
		t.Fatalf("Join(%q) gave a Follower, want the Leader", key)
	}
	t.Cleanup(func() { _ = l.Abort(context.Background()) })
	return l
}

func mustFollow(t *testing.T, ctx context.Context, g *dedup.Group, key, fp string) *dedup.Follower {
	t.Helper()
	l, f, err := g.Join(ctx, key, fp, 0)
	if err != nil {
		t.Fatalf("Join(%q): %v", key, err)
	}
	if f == nil {
		_ = l.Abort(ctx)
		t.Fatalf("Join(%q) gave the Leader (fence %d), want a Follower", key, l.Fence())
	}
	t.Cleanup(f.Close)
	return f
}

func mustPublish(t *testing.T, ctx context.Context, l *dedup.Leader, fr []byte) {
	t.Helper()
	if err := l.Publish(ctx, fr); err != nil {
		t.Fatalf("Publish(%q): %v", fr, err)
	}
}

// readAll reads f to its end and returns the frames and the final error.
func readAll(ctx context.Context, f *dedup.Follower) ([][]byte, error) {
	var frames [][]byte
	for range 1 << 20 {
		fr, err := f.Next(ctx)
		if err != nil {
			return frames, err
		}
		frames = append(frames, fr)
	}
	return frames, errors.New("more than 1<<20 frames")
}

// expectFrames checks that f yields exactly want, then io.EOF.
func expectFrames(t *testing.T, ctx context.Context, f *dedup.Follower, want ...[]byte) {
	t.Helper()
	got, err := readAll(ctx, f)
	if !errors.Is(err, io.EOF) {
		t.Fatalf("after %d frames: Next = %v, want io.EOF", len(got), err)
	}
	checkFrames(t, got, want)
}

func checkFrames(t *testing.T, got, want [][]byte) {
	t.Helper()
	if len(got) != len(want) {
		t.Fatalf("got %d frames %q, want %d %q", len(got), got, len(want), want)
	}
	for i := range want {
		if !bytes.Equal(got[i], want[i]) {
			t.Fatalf("frame %d = %q, want %q", i, got[i], want[i])
		}
	}
}

// waitErr waits for the next result on ch.
func waitErr(t *testing.T, ch <-chan error, d time.Duration, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(d):
		t.Fatalf("%s: no result within %v", what, d)
		return nil
	}
}

// waitGroup waits for wg with a bound.
func waitGroup(t *testing.T, wg *sync.WaitGroup, d time.Duration, what string) {
	t.Helper()
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(d):
		t.Fatalf("%s: not done within %v", what, d)
	}
}

// joined is one Join's result.
type joined struct {
	l   *dedup.Leader
	f   *dedup.Follower
	err error
}

// joinAll joins key from n goroutines spread over ps, all released at once,
// and returns the results.
func joinAll(ctx context.Context, ps []*process, n int, key, fp string) []joined {
	res := make([]joined, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			<-start
			l, f, err := ps[i%len(ps)].g.Join(ctx, key, fp, 0)
			res[i] = joined{l, f, err}
		})
	}
	close(start)
	wg.Wait()
	return res
}

// oneLeader checks that exactly one result leads and the others follow, and
// returns the leader and the followers' indexes.
func oneLeader(t *testing.T, res []joined) (*dedup.Leader, []int) {
	t.Helper()
	var leader *dedup.Leader
	var followers []int
	for i, r := range res {
		switch {
		case r.err != nil:
			t.Fatalf("joiner %d: %v", i, r.err)
		case r.l != nil && r.f != nil:
			t.Fatalf("joiner %d got a Leader and a Follower", i)
		case r.l != nil:
			if leader != nil {
				t.Fatalf("two leaders: fences %d and %d", leader.Fence(), r.l.Fence())
			}
			leader = r.l
		case r.f != nil:
			followers = append(followers, i)
		default:
			t.Fatalf("joiner %d got neither a Leader nor a Follower", i)
		}
	}
	if leader == nil {
		t.Fatalf("%d joiners, no leader", len(res))
	}
	t.Cleanup(func() { _ = leader.Abort(context.Background()) })
	for _, i := range followers {
		t.Cleanup(res[i].f.Close)
	}
	return leader, followers
}

// testOneLeaderLiveFanOut: 100 joiners in 4 processes; exactly one leads.
// Frames go out in lockstep: the leader publishes frame i+1 only once every
// follower has received frame i, so followers receive frames live, not at
// the end. 40 of the joiners arrive after 3 frames were published and
// receive those too, then the rest live.
func (s *suite) testOneLeaderLiveFanOut(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	ps := s.processes(t, 4, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	const early, late, frames, lateFrom = 60, 40, 6, 3

	res := joinAll(ctx, ps, early, key, "fp")
	leader, followers := oneLeader(t, res)

	// received[i] is done when every follower that joined before frame i
	// was published has received it.
	received := make([]sync.WaitGroup, frames)
	results := make(chan error, early+late)
	// lockstep reads f to the end, marking frames from `from` on received.
	lockstep := func(f *dedup.Follower, from int) {
		n := 0
		defer func() {
			for ; n < frames; n++ {
				if n >= from {
					received[n].Done() // on failure: unblock the leader
				}
			}
		}()
		for ; n < frames; n++ {
			fr, err := f.Next(ctx)
			if err != nil {
				results <- fmt.Errorf("follower after %d frames: %w", n, err)
				return
			}
			if !bytes.Equal(fr, frame(n)) {
				results <- fmt.Errorf("frame %d = %q, want %q", n, fr, frame(n))
				return
			}
			if n >= from {
				received[n].Done()
			}
		}
		fr, err := f.Next(ctx)
		if !errors.Is(err, io.EOF) {
			results <- fmt.Errorf("after %d frames: Next = %q, %v; want io.EOF", frames, fr, err)
			return
		}
		results <- nil
	}
	for i := range frames {
		received[i].Add(len(followers))
	}
	for _, i := range followers {
		go lockstep(res[i].f, 0)
	}

	nLate := 0
	for i := range frames {
		if i == lateFrom {
			// Late joiners must follow, receive the frames published before
			// they joined, and then the rest live.
			lateRes := joinAll(ctx, ps, late, key, "fp")
			for j := i; j < frames; j++ {
				received[j].Add(late)
			}
			for j, r := range lateRes {
				if r.err != nil || r.f == nil {
					t.Fatalf("late joiner %d: leader=%v err=%v, want a Follower", j, r.l != nil, r.err)
				}
				t.Cleanup(r.f.Close)
				nLate++
				go lockstep(r.f, lateFrom)
			}
		}
		mustPublish(t, ctx, leader, frame(i))
		waitGroup(t, &received[i], waitBound, fmt.Sprintf("frame %d received by every follower before frame %d is published", i, i+1))
	}
	if err := leader.Finish(ctx); err != nil {
		t.Fatalf("Finish: %v", err)
	}
	for range len(followers) + nLate {
		if err := waitErr(t, results, waitBound, "follower result"); err != nil {
			t.Error(err)
		}
	}
	if n := len(followers) + nLate; n != early+late-1 {
		t.Fatalf("%d followers, want %d", n, early+late-1)
	}
}

// testLocalSharing: followers in the leader's own process get its frames
// from memory: no store read at all.
func (s *suite) testLocalSharing(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	p := s.process(t, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	l := mustLead(t, ctx, p.g, key, "fp")
	mustPublish(t, ctx, l, frame(0))
	var fs []*dedup.Follower
	for range 5 {
		fs = append(fs, mustFollow(t, ctx, p.g, key, "fp"))
	}
	mustPublish(t, ctx, l, frame(1))
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	for _, f := range fs {
		expectFrames(t, ctx, f, frame(0), frame(1))
	}
	if n := p.b.Reads(); n != 0 {
		t.Fatalf("followers of a local leader made %d store reads, want 0", n)
	}
	if n := p.b.Lookups(); n != 0 {
		t.Fatalf("local joiners made %d store lookups, want 0", n)
	}
}

// testLocalStoreSharing: 20 followers in one process of a leader in another
// share one stream of store reads, not one each.
func (s *suite) testLocalStoreSharing(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	lp, fp := s.process(t, dedup.Options{LeaseTTL: longLease}), s.process(t, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	l := mustLead(t, ctx, lp.g, key, "fp")
	const n, frames = 20, 5
	res := joinAll(ctx, []*process{fp}, n, key, "fp")
	for i, r := range res {
		if r.err != nil || r.f == nil {
			t.Fatalf("joiner %d: leader=%v err=%v", i, r.l != nil, r.err)
		}
		t.Cleanup(r.f.Close)
	}
	if c := fp.b.Claims() + fp.b.Lookups(); c > 3 {
		t.Fatalf("%d joiners of one process made %d claims and lookups, want at most a few", n, c)
	}
	var wg sync.WaitGroup
	errs := make(chan error, n)
	for _, r := range res {
		wg.Go(func() {
			got, err := readAll(ctx, r.f)
			if !errors.Is(err, io.EOF) || len(got) != frames {
				errs <- fmt.Errorf("%d frames then %v", len(got), err)
			}
		})
	}
	for i := range frames {
		mustPublish(t, ctx, l, frame(i))
	}
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	waitGroup(t, &wg, waitBound, "followers")
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	// One reader reads for all: at most one read per frame plus the end and
	// a few empty waits, far fewer than n per frame.
	if r := fp.b.Reads(); r > 2*(frames+2) {
		t.Fatalf("%d followers in one process made %d store reads for %d frames; want them shared", n, r, frames)
	}
}

// testRetainedReplay: a joiner after Finish, in any process, replays the
// retained result.
func (s *suite) testRetainedReplay(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	ps := s.processes(t, 2, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	l := mustLead(t, ctx, ps[0].g, key, "fp")
	for i := range 3 {
		mustPublish(t, ctx, l, frame(i))
	}
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		for range 2 {
			f := mustFollow(t, ctx, p.g, key, "fp")
			expectFrames(t, ctx, f, frame(0), frame(1), frame(2))
			f.Close()
		}
	}
}

// testRetainExpires: a retained result is readable until retain has passed
// since Finish, and then gone: the next joiner leads.
func (s *suite) testRetainExpires(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	ps := s.processes(t, 2, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	const retain = 300 * time.Millisecond
	l, _, err := ps[0].g.Join(ctx, key, "fp", retain)
	if err != nil || l == nil {
		t.Fatalf("Join: leader=%v err=%v", l != nil, err)
	}
	mustPublish(t, ctx, l, frame(0))
	finishing := time.Now()
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	f := mustFollow(t, ctx, ps[1].g, key, "fp")
	if time.Since(finishing) < retain {
		expectFrames(t, ctx, f, frame(0))
	}
	f.Close()
	deadline := time.Now().Add(retain + waitBound)
	for {
		l2, f2, err := ps[1].g.Join(ctx, key, "fp", retain)
		if err != nil {
			t.Fatal(err)
		}
		if l2 != nil {
			if d := time.Since(finishing); d < retain-5*time.Millisecond {
				t.Fatalf("led again %v after Finish, before retain %v", d, retain)
			}
			_ = l2.Abort(ctx)
			break
		}
		f2.Close()
		if time.Now().After(deadline) {
			t.Fatalf("result still retained %v after Finish with retain %v", time.Since(finishing), retain)
		}
		time.Sleep(10 * time.Millisecond) // waiting for expiry in the store: nothing to select on
	}
}

// testConflictRunning: joining a running flight with another fingerprint is
// ErrConflict, in its leader's process and in another.
func (s *suite) testConflictRunning(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	ps := s.processes(t, 2, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	l := mustLead(t, ctx, ps[0].g, key, "fp-a")
	for _, p := range ps {
		if _, _, err := p.g.Join(ctx, key, "fp-b", 0); !errors.Is(err, dedup.ErrConflict) {
			t.Fatalf("Join with another fingerprint = %v, want ErrConflict", err)
		}
	}
	// The same fingerprint still follows.
	f := mustFollow(t, ctx, ps[1].g, key, "fp-a")
	if err := l.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Next(ctx); !errors.Is(err, dedup.ErrLeaderGone) {
		t.Fatalf("Next after Abort = %v, want ErrLeaderGone", err)
	}
	// Aborted: the key is free for any request.
	l2 := mustLead(t, ctx, ps[1].g, key, "fp-b")
	_ = l2.Abort(ctx)
}

// testConflictRetained: so is joining a retained result with another
// fingerprint.
func (s *suite) testConflictRetained(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	ps := s.processes(t, 2, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	l := mustLead(t, ctx, ps[0].g, key, "fp-a")
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	for _, p := range ps {
		if _, _, err := p.g.Join(ctx, key, "fp-b", 0); !errors.Is(err, dedup.ErrConflict) {
			t.Fatalf("Join of a retained result with another fingerprint = %v, want ErrConflict", err)
		}
	}
}

// outcome is what one follower read: its frames, its final error, and when
// it ended.
type outcome struct {
	frames [][]byte
	err    error
	at     time.Time
}

// readAsync starts reading every follower; each reports its outcome once.
func readAsync(ctx context.Context, fs []*dedup.Follower) []chan outcome {
	chs := make([]chan outcome, len(fs))
	for i, f := range fs {
		chs[i] = make(chan outcome, 1)
		go func() {
			frames, err := readAll(ctx, f)
			chs[i] <- outcome{frames, err, time.Now()}
		}()
	}
	return chs
}

func waitOutcome(t *testing.T, ch <-chan outcome, d time.Duration, what string) outcome {
	t.Helper()
	select {
	case o := <-ch:
		return o
	case <-time.After(d):
		t.Fatalf("%s: no result within %v", what, d)
		return outcome{}
	}
}

// followersIn joins key as a follower n times in each process.
func followersIn(t *testing.T, ctx context.Context, ps []*process, n int, key, fp string) []*dedup.Follower {
	t.Helper()
	var fs []*dedup.Follower
	for _, p := range ps {
		for range n {
			fs = append(fs, mustFollow(t, ctx, p.g, key, fp))
		}
	}
	return fs
}

// rejoinOneLeader has every old follower join again at once: exactly one
// leads, with a larger fence than before, and the others receive its result.
func rejoinOneLeader(t *testing.T, ctx context.Context, ps []*process, n int, key string, oldFence uint64) {
	t.Helper()
	res := joinAll(ctx, ps, n, key, "fp")
	l, followers := oneLeader(t, res)
	if l.Fence() <= oldFence {
		t.Fatalf("new leader's fence %d, want > %d", l.Fence(), oldFence)
	}
	var fs []*dedup.Follower
	for _, i := range followers {
		fs = append(fs, res[i].f)
	}
	chs := readAsync(ctx, fs)
	mustPublish(t, ctx, l, frame(7))
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chs {
		o := waitOutcome(t, ch, waitBound, "follower of the new leader")
		if !errors.Is(o.err, io.EOF) {
			t.Fatalf("follower %d of the new leader: %v after %d frames", i, o.err, len(o.frames))
		}
		checkFrames(t, o.frames, [][]byte{frame(7)})
	}
}

// testAbort: Abort sends every follower, local or not, ErrLeaderGone at
// once (the lease is long, so nothing else can end the flight); they join
// again and exactly one leads.
func (s *suite) testAbort(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	ps := s.processes(t, 3, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	l := mustLead(t, ctx, ps[0].g, key, "fp")
	mustPublish(t, ctx, l, frame(0))
	fs := followersIn(t, ctx, ps, 3, key, "fp")
	chs := readAsync(ctx, fs)
	aborting := time.Now()
	if err := l.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	for i, ch := range chs {
		o := waitOutcome(t, ch, waitBound, "follower after Abort")
		if !errors.Is(o.err, dedup.ErrLeaderGone) {
			t.Fatalf("follower %d: %v after %d frames, want ErrLeaderGone", i, o.err, len(o.frames))
		}
		if d := o.at.Sub(aborting); d > 2*slack {
			t.Fatalf("follower %d learned of the abort after %v; want it at once (lease %v)", i, d, longLease)
		}
	}
	rejoinOneLeader(t, ctx, ps, len(fs), key, l.Fence())
}

// testLeaderDies: a leader whose process is cut off from the store (as good
// as dead: no renewal, no abort) is replaced: its followers elsewhere get
// ErrLeaderGone within the lease plus one check period, and one of them
// leads next.
func (s *suite) testLeaderDies(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	opts := dedup.Options{LeaseTTL: shortLease}
	ps := s.processes(t, 3, opts)
	key := newKey(t)
	l := mustLead(t, ctx, ps[0].g, key, "fp")
	mustPublish(t, ctx, l, frame(0))
	fs := followersIn(t, ctx, ps[1:], 2, key, "fp")
	chs := readAsync(ctx, fs)
	cut := time.Now()
	ps[0].b.Partition(true)
	bound := shortLease + min(shortLease/3, time.Second) + slack
	for i, ch := range chs {
		o := waitOutcome(t, ch, waitBound, "follower of a dead leader")
		if !errors.Is(o.err, dedup.ErrLeaderGone) {
			t.Fatalf("follower %d: %v after %d frames, want ErrLeaderGone", i, o.err, len(o.frames))
		}
		checkFrames(t, o.frames, [][]byte{frame(0)})
		if d := o.at.Sub(cut); d > bound {
			t.Fatalf("follower %d learned of the dead leader %v after it died, want within %v", i, d, bound)
		}
	}
	select {
	case <-l.Lost():
	case <-time.After(waitBound):
		t.Fatal("the cut-off leader's Lost() was not closed")
	}
	rejoinOneLeader(t, ctx, ps[1:], len(fs), key, l.Fence())
	// Back in touch, the old leader can do nothing.
	ps[0].b.Partition(false)
	if err := l.Publish(ctx, frame(9)); !errors.Is(err, dedup.ErrLost) {
		t.Fatalf("old leader's Publish = %v, want ErrLost", err)
	}
	if err := l.Finish(ctx); !errors.Is(err, dedup.ErrLost) {
		t.Fatalf("old leader's Finish = %v, want ErrLost", err)
	}
}

// testLeaseLost: a leader whose lease is refused by the store (it lost the
// lock) sees Lost() closed, its local and remote followers get
// ErrLeaderGone, and its writes are refused.
func (s *suite) testLeaseLost(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	opts := dedup.Options{LeaseTTL: shortLease}
	ps := s.processes(t, 2, opts)
	key := newKey(t)
	l := mustLead(t, ctx, ps[0].g, key, "fp")
	mustPublish(t, ctx, l, frame(0))
	fs := append(followersIn(t, ctx, ps[:1], 1, key, "fp"), followersIn(t, ctx, ps[1:], 1, key, "fp")...)
	chs := readAsync(ctx, fs)
	refused := time.Now()
	ps[0].b.RefuseExtend(true)
	select {
	case <-l.Lost():
	case <-time.After(waitBound):
		t.Fatal("Lost() not closed after the store refused the lease")
	}
	if d := time.Since(refused); d > shortLease/3+slack {
		t.Fatalf("Lost() closed %v after the lease was refused, want within a renewal period", d)
	}
	for i, ch := range chs {
		o := waitOutcome(t, ch, waitBound, "follower of a leader that lost its lease")
		if !errors.Is(o.err, dedup.ErrLeaderGone) {
			t.Fatalf("follower %d: %v, want ErrLeaderGone", i, o.err)
		}
	}
	if err := l.Publish(ctx, frame(1)); !errors.Is(err, dedup.ErrLost) {
		t.Fatalf("Publish after the loss = %v, want ErrLost", err)
	}
	ps[0].b.RefuseExtend(false)
	rejoinOneLeader(t, ctx, ps, 2, key, l.Fence())
}

// testJoinerTakesOver: a joiner arriving after a dead leader's lease ran out
// (with no follower around to notice) leads at once: its claim ends the dead
// generation, whose leader can no longer write to it.
func (s *suite) testJoinerTakesOver(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	opts := dedup.Options{LeaseTTL: shortLease}
	ps := s.processes(t, 2, opts)
	key := newKey(t)
	l := mustLead(t, ctx, ps[0].g, key, "fp")
	mustPublish(t, ctx, l, frame(0))
	ps[0].b.Partition(true)
	// Wait until the dead leader's lease has run out in the store.
	locker := lock.New(ps[1].b.Locks())
	deadline := time.Now().Add(shortLease + waitBound)
	for {
		lease, err := locker.TryAcquire(ctx, key, lock.Options{TTL: time.Second})
		if err == nil {
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			break
		}
		if !errors.Is(err, lock.ErrNotObtained) {
			t.Fatal(err)
		}
		if time.Now().After(deadline) {
			t.Fatal("the dead leader's lease did not run out")
		}
		time.Sleep(10 * time.Millisecond) // a lease running out in the store: nothing to select on
	}
	l2 := mustLead(t, ctx, ps[1].g, key, "fp")
	if l2.Fence() <= l.Fence() {
		t.Fatalf("new fence %d, want > %d", l2.Fence(), l.Fence())
	}
	ps[0].b.Partition(false)
	// The store refuses the dead generation, whatever its leader believes.
	if err := ps[0].b.Append(ctx, key, l.Fence(), frame(9), time.Minute); !errors.Is(err, dedup.ErrLost) {
		t.Fatalf("Append to the replaced generation = %v, want ErrLost", err)
	}
	if err := ps[0].b.Finish(ctx, key, l.Fence(), time.Minute); !errors.Is(err, dedup.ErrLost) {
		t.Fatalf("Finish of the replaced generation = %v, want ErrLost", err)
	}
	if b, err := ps[0].b.Read(ctx, key, l.Fence(), "", 10, 0); err != nil || b.State != dedup.StateNone || len(b.Frames) != 0 {
		t.Fatalf("Read of the replaced generation = %d frames, %v, %v; want none, StateNone", len(b.Frames), b.State, err)
	}
	mustPublish(t, ctx, l2, frame(1))
	if err := l2.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	// Even in the dead leader's process, joiners get the new result.
	f := mustFollow(t, ctx, ps[0].g, key, "fp")
	expectFrames(t, ctx, f, frame(1))
	select {
	case <-l.Lost():
	case <-time.After(waitBound):
		t.Fatal("the dead leader's Lost() was not closed")
	}
}

// testNextDeadline: Next returns ctx's error when its deadline passes with
// no frame, promptly, and leaves no goroutine behind; the follower still
// works afterwards.
func (s *suite) testNextDeadline(t *testing.T) {
	ctx := testCtx(t, 60*time.Second)
	ps := s.processes(t, 2, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	l := mustLead(t, ctx, ps[0].g, key, "fp")
	remote := mustFollow(t, ctx, ps[1].g, key, "fp")
	local := mustFollow(t, ctx, ps[0].g, key, "fp")

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	for _, f := range []*dedup.Follower{remote, local} {
		if _, err := f.Next(cancelled); !errors.Is(err, context.Canceled) {
			t.Fatalf("Next(cancelled) = %v, want context.Canceled", err)
		}
	}
	next := func(f *dedup.Follower, d time.Duration) {
		t.Helper()
		dctx, cancel := context.WithTimeout(ctx, d)
		defer cancel()
		start := time.Now()
		fr, err := f.Next(dctx)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Next with a %v deadline = %q, %v; want context.DeadlineExceeded", d, fr, err)
		}
		if late := time.Since(start) - d; late > slack/2 {
			t.Fatalf("Next returned %v after its deadline", late)
		}
	}
	// Warm up: connections a store client opens on first use are not leaks.
	next(remote, 50*time.Millisecond)
	settle(t, -1)
	base := runtime.NumGoroutine()
	for _, d := range []time.Duration{time.Millisecond, 30 * time.Millisecond, 150 * time.Millisecond, 700 * time.Millisecond} {
		next(remote, d)
		next(local, d)
	}
	settle(t, base)

	mustPublish(t, ctx, l, frame(0))
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	expectFrames(t, ctx, remote, frame(0))
	expectFrames(t, ctx, local, frame(0))
}

// settle waits until at most base goroutines run (base < 0: until the count
// stops falling for a moment).
func settle(t *testing.T, base int) {
	t.Helper()
	deadline := time.Now().Add(waitBound)
	prev := runtime.NumGoroutine()
	for {
		time.Sleep(20 * time.Millisecond) // goroutines exiting: nothing to select on
		n := runtime.NumGoroutine()
		if (base >= 0 && n <= base) || (base < 0 && n >= prev) {
			return
		}
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			t.Fatalf("%d goroutines, want at most %d:\n%s", n, base, buf[:runtime.Stack(buf, true)])
		}
		prev = n
	}
}

// testTooLarge: a frame past MaxBytes fails with ErrTooLarge and aborts the
// flight; its followers get ErrLeaderGone and the key can be led again.
func (s *suite) testTooLarge(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	opts := dedup.Options{LeaseTTL: longLease, MaxBytes: 10}
	ps := s.processes(t, 2, opts)
	key := newKey(t)
	l := mustLead(t, ctx, ps[0].g, key, "fp")
	fs := append(followersIn(t, ctx, ps[:1], 1, key, "fp"), followersIn(t, ctx, ps[1:], 1, key, "fp")...)
	chs := readAsync(ctx, fs)
	mustPublish(t, ctx, l, []byte("123456"))
	if err := l.Publish(ctx, []byte("7890!")); !errors.Is(err, dedup.ErrTooLarge) {
		t.Fatalf("Publish past MaxBytes = %v, want ErrTooLarge", err)
	}
	for i, ch := range chs {
		o := waitOutcome(t, ch, waitBound, "follower of a flight too large")
		if !errors.Is(o.err, dedup.ErrLeaderGone) {
			t.Fatalf("follower %d: %v, want ErrLeaderGone", i, o.err)
		}
	}
	if err := l.Publish(ctx, []byte("x")); !errors.Is(err, dedup.ErrClosed) {
		t.Fatalf("Publish after ErrTooLarge = %v, want ErrClosed", err)
	}
	l2 := mustLead(t, ctx, ps[1].g, key, "fp")
	mustPublish(t, ctx, l2, []byte("1234567890")) // exactly MaxBytes
	if err := l2.Finish(ctx); err != nil {
		t.Fatal(err)
	}
}

// testTooManyFrames: likewise for MaxFrames, counting empty frames.
func (s *suite) testTooManyFrames(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	p := s.process(t, dedup.Options{LeaseTTL: longLease, MaxFrames: 3})
	key := newKey(t)
	l := mustLead(t, ctx, p.g, key, "fp")
	for range 3 {
		mustPublish(t, ctx, l, nil)
	}
	if err := l.Publish(ctx, nil); !errors.Is(err, dedup.ErrTooLarge) {
		t.Fatalf("Publish past MaxFrames = %v, want ErrTooLarge", err)
	}
}

// testBinaryFrames: frames are opaque bytes, empty ones and large ones
// included; a finished flight without frames is just io.EOF; the leader's
// buffer can be reused after Publish.
func (s *suite) testBinaryFrames(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	ps := s.processes(t, 2, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	big := bytes.Repeat([]byte{0, 1, 2, 0xff, '\r', '\n'}, 200_000)
	want := [][]byte{{}, {0}, []byte("data: {\"x\":1}\n\n"), big, []byte("\xff\xfe\x00")}
	l := mustLead(t, ctx, ps[0].g, key, "fp")
	f := mustFollow(t, ctx, ps[1].g, key, "fp")
	buf := make([]byte, 0, len(big))
	for _, w := range want {
		buf = append(buf[:0], w...)
		mustPublish(t, ctx, l, buf)
	}
	clear(buf[:cap(buf)])
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	expectFrames(t, ctx, f, want...)
	expectFrames(t, ctx, mustFollow(t, ctx, ps[0].g, key, "fp"), want...)

	empty := newKey(t)
	l = mustLead(t, ctx, ps[0].g, empty, "fp")
	f = mustFollow(t, ctx, ps[1].g, empty, "fp")
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	expectFrames(t, ctx, f)
}

// testFencesIncrease: each generation of a key has a larger fence, also
// across processes.
func (s *suite) testFencesIncrease(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	ps := s.processes(t, 2, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	var prev uint64
	for i := range 6 {
		l := mustLead(t, ctx, ps[i%2].g, key, "fp")
		if l.Fence() <= prev {
			t.Fatalf("generation %d: fence %d, want > %d", i, l.Fence(), prev)
		}
		prev = l.Fence()
		if l.Key() != key {
			t.Fatalf("Key() = %q, want %q", l.Key(), key)
		}
		if err := l.Abort(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// testDistinct: flights of different keys, or of one key with different
// fingerprints, never share frames, whatever bytes the keys and fingerprints
// contain.
func (s *suite) testDistinct(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	p := s.process(t, dedup.Options{LeaseTTL: longLease})
	base := newKey(t)
	pairs := [][2]string{{base + "a\x00b", "c"}, {base + "a", "b\x00c"}, {base + "a\x00", "bc"}, {base + "{x}", ""}, {base + "é", "\xff"}}
	// All running at once: each joiner must lead its own flight.
	leaders := make([]*dedup.Leader, len(pairs))
	for i, kf := range pairs {
		leaders[i] = mustLead(t, ctx, p.g, kf[0], kf[1])
	}
	followers := make([]*dedup.Follower, len(pairs))
	for i, kf := range pairs {
		followers[i] = mustFollow(t, ctx, p.g, kf[0], kf[1])
	}
	for i, l := range leaders {
		mustPublish(t, ctx, l, frame(i))
		if err := l.Finish(ctx); err != nil {
			t.Fatal(err)
		}
	}
	for i, f := range followers {
		expectFrames(t, ctx, f, frame(i))
	}
}

// testClosedUse: a Leader after Finish or Abort and a Follower after Close
// refuse with ErrClosed; Abort after either is a no-op.
func (s *suite) testClosedUse(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	p := s.process(t, dedup.Options{LeaseTTL: longLease})
	l := mustLead(t, ctx, p.g, newKey(t), "fp")
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Publish(ctx, frame(0)); !errors.Is(err, dedup.ErrClosed) {
		t.Fatalf("Publish after Finish = %v, want ErrClosed", err)
	}
	if err := l.Finish(ctx); !errors.Is(err, dedup.ErrClosed) {
		t.Fatalf("Finish after Finish = %v, want ErrClosed", err)
	}
	if err := l.Abort(ctx); err != nil {
		t.Fatalf("Abort after Finish = %v, want nil", err)
	}
	select {
	case <-l.Lost():
		t.Fatal("Lost() closed by Finish")
	default:
	}

	key := newKey(t)
	l = mustLead(t, ctx, p.g, key, "fp")
	f := mustFollow(t, ctx, p.g, key, "fp")
	if err := l.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l.Finish(ctx); !errors.Is(err, dedup.ErrClosed) {
		t.Fatalf("Finish after Abort = %v, want ErrClosed", err)
	}
	f.Close()
	f.Close()
	if _, err := f.Next(ctx); !errors.Is(err, dedup.ErrClosed) {
		t.Fatalf("Next after Close = %v, want ErrClosed", err)
	}
}

// testFollowerClose: closing followers, even all of one process's, does not
// disturb the others or later joiners.
func (s *suite) testFollowerClose(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	ps := s.processes(t, 2, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	l := mustLead(t, ctx, ps[0].g, key, "fp")
	mustPublish(t, ctx, l, frame(0))
	a := mustFollow(t, ctx, ps[1].g, key, "fp")
	b := mustFollow(t, ctx, ps[1].g, key, "fp")
	if fr, err := a.Next(ctx); err != nil || !bytes.Equal(fr, frame(0)) {
		t.Fatalf("Next = %q, %v", fr, err)
	}
	a.Close()
	b.Close()
	c := mustFollow(t, ctx, ps[1].g, key, "fp")
	mustPublish(t, ctx, l, frame(1))
	if err := l.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	expectFrames(t, ctx, c, frame(0), frame(1))
}

// testRejoinSkip documents the takeover contract: a follower that consumed
// n frames of an aborted generation joins again and skips n frames of the
// next one, which repeats them for a deterministic request.
func (s *suite) testRejoinSkip(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	ps := s.processes(t, 2, dedup.Options{LeaseTTL: longLease})
	key := newKey(t)
	l := mustLead(t, ctx, ps[0].g, key, "fp")
	f := mustFollow(t, ctx, ps[1].g, key, "fp")
	mustPublish(t, ctx, l, frame(0))
	mustPublish(t, ctx, l, frame(1))
	var got [][]byte
	for range 2 {
		fr, err := f.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, fr)
	}
	consumed := f.Consumed()
	if err := l.Abort(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Next(ctx); !errors.Is(err, dedup.ErrLeaderGone) {
		t.Fatalf("Next = %v, want ErrLeaderGone", err)
	}
	f.Close()
	l2 := mustLead(t, ctx, ps[1].g, key, "fp")
	for i := range 4 {
		mustPublish(t, ctx, l2, frame(i))
	}
	if err := l2.Finish(ctx); err != nil {
		t.Fatal(err)
	}
	f2 := mustFollow(t, ctx, ps[0].g, key, "fp")
	all, err := readAll(ctx, f2)
	if !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	got = append(got, all[consumed:]...)
	checkFrames(t, got, [][]byte{frame(0), frame(1), frame(2), frame(3)})
}

// testInvalid: bad arguments and options are refused with ErrInvalid.
func (s *suite) testInvalid(t *testing.T) {
	ctx := testCtx(t, 30*time.Second)
	p := s.process(t, dedup.Options{})
	for _, tc := range []struct {
		key, fp string
		retain  time.Duration
	}{
		{"", "fp", 0},
		{"}x", "fp", 0},
		{strings.Repeat("k", dedup.MaxKeyLen+1), "fp", 0},
		{"k", strings.Repeat("f", dedup.MaxFingerprintLen+1), 0},
		{"k", "fp", -time.Second},
		{"k", "fp", time.Microsecond},
	} {
		if _, _, err := p.g.Join(ctx, tc.key, tc.fp, tc.retain); !errors.Is(err, dedup.ErrInvalid) {
			t.Errorf("Join(%.20q, %.20q, %v) = %v, want ErrInvalid", tc.key, tc.fp, tc.retain, err)
		}
	}
	for _, o := range []dedup.Options{
		{LeaseTTL: time.Millisecond},
		{Retain: time.Microsecond},
		{MaxBytes: -1},
		{MaxFrames: -1},
	} {
		g := dedup.New(s.newBackend(t), o)
		if _, _, err := g.Join(ctx, newKey(t), "fp", 0); !errors.Is(err, dedup.ErrInvalid) {
			t.Errorf("Join with options %+v = %v, want ErrInvalid", o, err)
		}
	}
}

// ---------------------------------------------------------------------------

// Faulty wraps a Backend (and its lock store) to count calls and to inject
// faults: a partition (every call fails, as for a process cut off from the
// store or dead) or a lock store that refuses lease renewals.
type Faulty struct {
	dedup.Backend
	locks faultyLocks

	down                   atomic.Bool
	reads, lookups, claims atomic.Int64
	refuseExtend           atomic.Bool
}

// ErrPartitioned is returned by a partitioned Faulty.
var ErrPartitioned = errors.New("deduptest: partitioned from the store")

// NewFaulty wraps b.
func NewFaulty(b dedup.Backend) *Faulty {
	f := &Faulty{Backend: b}
	f.locks = faultyLocks{Backend: b.Locks(), f: f}
	return f
}

// Partition cuts the backend off from the store (true) or reconnects it.
func (f *Faulty) Partition(down bool) { f.down.Store(down) }

// RefuseExtend makes lease renewals fail with lock.ErrNotHeld, as when the
// lock was taken away in the store.
func (f *Faulty) RefuseExtend(v bool) { f.refuseExtend.Store(v) }

// Reads counts the Read calls made.
func (f *Faulty) Reads() int64 { return f.reads.Load() }

// Lookups counts the Lookup calls made.
func (f *Faulty) Lookups() int64 { return f.lookups.Load() }

// Claims counts the Claim calls made.
func (f *Faulty) Claims() int64 { return f.claims.Load() }

func (f *Faulty) check() error {
	if f.down.Load() {
		return ErrPartitioned
	}
	return nil
}

// Locks returns the wrapped lock store, subject to the same faults.
func (f *Faulty) Locks() lock.Backend { return &f.locks }

// Lookup counts and forwards the call unless partitioned.
func (f *Faulty) Lookup(ctx context.Context, key string) (dedup.Flight, error) {
	f.lookups.Add(1)
	if err := f.check(); err != nil {
		return dedup.Flight{}, err
	}
	return f.Backend.Lookup(ctx, key)
}

// Claim counts and forwards the call unless partitioned.
func (f *Faulty) Claim(ctx context.Context, key, fp string, gen uint64, keep time.Duration) (dedup.Flight, error) {
	f.claims.Add(1)
	if err := f.check(); err != nil {
		return dedup.Flight{}, err
	}
	return f.Backend.Claim(ctx, key, fp, gen, keep)
}

// Append forwards the call unless partitioned.
func (f *Faulty) Append(ctx context.Context, key string, gen uint64, frame []byte, keep time.Duration) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.Backend.Append(ctx, key, gen, frame, keep)
}

// Refresh forwards the call unless partitioned.
func (f *Faulty) Refresh(ctx context.Context, key string, gen uint64, keep time.Duration) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.Backend.Refresh(ctx, key, gen, keep)
}

// Finish forwards the call unless partitioned.
func (f *Faulty) Finish(ctx context.Context, key string, gen uint64, retain time.Duration) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.Backend.Finish(ctx, key, gen, retain)
}

// Abort forwards the call unless partitioned.
func (f *Faulty) Abort(ctx context.Context, key string, gen uint64, linger time.Duration) error {
	if err := f.check(); err != nil {
		return err
	}
	return f.Backend.Abort(ctx, key, gen, linger)
}

// Read counts and forwards the call unless partitioned.
func (f *Faulty) Read(ctx context.Context, key string, gen uint64, cursor string, limit int, wait time.Duration) (dedup.Batch, error) {
	f.reads.Add(1)
	if err := f.check(); err != nil {
		return dedup.Batch{}, err
	}
	return f.Backend.Read(ctx, key, gen, cursor, limit, wait)
}

type faultyLocks struct {
	lock.Backend
	f *Faulty
}

func (l *faultyLocks) TryAcquire(ctx context.Context, key, token string, opts lock.Options) (lock.Grant, error) {
	if err := l.f.check(); err != nil {
		return lock.Grant{}, err
	}
	return l.Backend.TryAcquire(ctx, key, token, opts)
}

func (l *faultyLocks) Acquire(ctx context.Context, key, token string, opts lock.Options) (lock.Grant, error) {
	if err := l.f.check(); err != nil {
		return lock.Grant{}, err
	}
	return l.Backend.Acquire(ctx, key, token, opts)
}

func (l *faultyLocks) Release(ctx context.Context, key, token string) error {
	if err := l.f.check(); err != nil {
		return err
	}
	return l.Backend.Release(ctx, key, token)
}

func (l *faultyLocks) Extend(ctx context.Context, key, token string, ttl time.Duration) (time.Time, error) {
	if err := l.f.check(); err != nil {
		return time.Time{}, err
	}
	if l.f.refuseExtend.Load() {
		return time.Time{}, lock.ErrNotHeld
	}
	return l.Backend.Extend(ctx, key, token, ttl)
}

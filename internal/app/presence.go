package app

import (
	"context"
	"strconv"
	"time"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/dashboard"
)

// Replicas sharing a Redis store announce themselves in one sorted set,
// scored by the time of their last heartbeat, so that the dashboard of any
// of them lists them all.
const (
	presenceKey   = "llmgate:{replicas}"
	presenceEvery = time.Second
	// presenceGone is how long a replica without a heartbeat still shows.
	presenceGone = 5 * presenceEvery
)

// startPresence keeps replica's heartbeat in the store until stop is called
// (which takes it out), and returns how to list the replicas seen lately.
// c nil is the memory store: only this replica shares it.
func startPresence(c rueidis.Client, replica string) (list func(context.Context) ([]dashboard.Replica, error), stop func()) {
	if c == nil {
		return func(context.Context) ([]dashboard.Replica, error) {
			return []dashboard.Replica{{Name: replica, LastSeen: time.Now()}}, nil
		}, func() {}
	}
	beat := func(ctx context.Context) {
		now := time.Now()
		_ = c.DoMulti(ctx,
			c.B().Zadd().Key(presenceKey).ScoreMember().ScoreMember(float64(now.UnixMilli()), replica).Build(),
			c.B().Zremrangebyscore().Key(presenceKey).Min("-inf").Max(strconv.FormatInt(now.Add(-time.Minute).UnixMilli(), 10)).Build(),
		)
	}
	done := make(chan struct{})
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		t := time.NewTicker(presenceEvery)
		defer t.Stop()
		for {
			ctx, cancel := context.WithTimeout(context.Background(), presenceEvery)
			beat(ctx) // a store outage only hides this replica for a while
			cancel()
			select {
			case <-done:
				return
			case <-t.C:
			}
		}
	}()
	list = func(ctx context.Context) ([]dashboard.Replica, error) {
		since := time.Now().Add(-presenceGone).UnixMilli()
		zs, err := c.Do(ctx, c.B().Zrange().Key(presenceKey).Min(strconv.FormatInt(since, 10)).Max("+inf").Byscore().Withscores().Build()).AsZScores()
		if err != nil {
			return nil, err
		}
		out := make([]dashboard.Replica, 0, len(zs))
		for _, z := range zs {
			out = append(out, dashboard.Replica{Name: z.Member, LastSeen: time.UnixMilli(int64(z.Score))})
		}
		return out, nil
	}
	stop = func() {
		close(done)
		<-stopped
		ctx, cancel := context.WithTimeout(context.Background(), presenceEvery)
		defer cancel()
		_ = c.Do(ctx, c.B().Zrem().Key(presenceKey).Member(replica).Build()).Error()
	}
	return list, stop
}

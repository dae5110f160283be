// Package redisack runs a Redis write script and, when asked, waits in the same round trip for replicas to acknowledge it (WAIT).
package redisack

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/redis/rueidis"
)

// ErrNotReplicated is returned, wrapped, by a write that too few replicas
// acknowledged in time. The write may be on the master only, and lost if
// it fails over.
var ErrNotReplicated = errors.New("redis: write not acknowledged by enough replicas")

// DefaultTimeout is how long a write waits for its replicas by default.
const DefaultTimeout = time.Second

// Script is a Lua script with the SHA1 that EVALSHA names it by.
type Script struct {
	Lua *rueidis.Lua
	src string
	sha string
}

// NewScript prepares src.
func NewScript(src string) Script {
	h := sha1.Sum([]byte(src))
	return Script{Lua: rueidis.NewLuaScript(src), src: src, sha: hex.EncodeToString(h[:])}
}

// Write runs s. With replicas > 0, WAIT follows it on the same connection
// (one round trip: both are sent together, and WAIT only counts the writes
// of its own connection), and a write acknowledged by fewer replicas within
// timeout fails with ErrNotReplicated (fail closed) while its result is
// still returned, for the caller to undo.
func Write(ctx context.Context, c rueidis.Client, s Script, replicas int, timeout time.Duration, keys, args []string) (rueidis.RedisResult, error) {
	if replicas <= 0 {
		return s.Lua.Exec(ctx, c, keys, args), nil
	}
	// WAIT has no key: its slot is the script's, so that a Cluster client
	// sends both to the same node on one connection.
	wait := func() rueidis.Completed {
		return c.B().Wait().Numreplicas(int64(replicas)).Timeout(max(timeout.Milliseconds(), 1)).Build().SetSlot(keys[0])
	}
	res := c.DoMulti(ctx, c.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait())
	if err := res[0].Error(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		res = c.DoMulti(ctx, c.B().Eval().Script(s.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait())
	}
	if res[0].Error() != nil {
		return res[0], nil
	}
	n, err := res[1].AsInt64()
	if err != nil {
		return res[0], fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err)
	}
	if n < int64(replicas) {
		return res[0], fmt.Errorf("%w: %d of %d within %v", ErrNotReplicated, n, replicas, timeout)
	}
	return res[0], nil
}

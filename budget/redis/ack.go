package redis

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

// ErrNotReplicated is returned, wrapped, by a write that Config.AckReplicas
// replicas did not acknowledge within Config.AckTimeout. The write may be
// on the master only, and lost if it fails over.
var ErrNotReplicated = errors.New("budget: redis: write not acknowledged by enough replicas")

// DefaultAckTimeout is Config.AckTimeout's default.
const DefaultAckTimeout = time.Second

// script is a Lua script with the SHA1 that EVALSHA names it by.
type script struct {
	lua *rueidis.Lua
	src string
	sha string
}

func newScript(src string) script {
	h := sha1.Sum([]byte(src))
	return script{lua: rueidis.NewLuaScript(src), src: src, sha: hex.EncodeToString(h[:])}
}

// write runs a script that writes. With AckReplicas, WAIT follows it on the
// same connection (one round trip: both are sent together, and WAIT only
// counts the writes of its own connection), and a write acknowledged by
// too few replicas fails with ErrNotReplicated (fail closed) while its
// result is still returned for the caller to undo.
func (b *Backend) write(ctx context.Context, s script, keys, args []string) (rueidis.RedisResult, error) {
	if b.ackReplicas <= 0 {
		return s.lua.Exec(ctx, b.c, keys, args), nil
	}
	// WAIT has no key: its slot is the script's, so that a Cluster client
	// sends both to the same node on one connection.
	wait := b.c.B().Wait().Numreplicas(int64(b.ackReplicas)).Timeout(max(b.ackTimeout.Milliseconds(), 1)).Build().SetSlot(keys[0])
	res := b.c.DoMulti(ctx, b.c.B().Evalsha().Sha1(s.sha).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait)
	if err := res[0].Error(); err != nil && strings.HasPrefix(err.Error(), "NOSCRIPT") {
		wait = b.c.B().Wait().Numreplicas(int64(b.ackReplicas)).Timeout(max(b.ackTimeout.Milliseconds(), 1)).Build().SetSlot(keys[0])
		res = b.c.DoMulti(ctx, b.c.B().Eval().Script(s.src).Numkeys(int64(len(keys))).Key(keys...).Arg(args...).Build(), wait)
	}
	if res[0].Error() != nil {
		return res[0], nil
	}
	n, err := res[1].AsInt64()
	if err != nil {
		return res[0], fmt.Errorf("%w: WAIT: %w", ErrNotReplicated, err)
	}
	if n < int64(b.ackReplicas) {
		return res[0], fmt.Errorf("%w: %d of %d within %v", ErrNotReplicated, n, b.ackReplicas, b.ackTimeout)
	}
	return res[0], nil
}

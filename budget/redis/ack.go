package redis

import (
	"context"

	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/internal/redisack"
)

// ErrNotReplicated is returned, wrapped, by a write that Config.AckReplicas
// replicas did not acknowledge within Config.AckTimeout. The write may be
// on the master only, and lost if it fails over.
var ErrNotReplicated = redisack.ErrNotReplicated

// DefaultAckTimeout is Config.AckTimeout's default.
const DefaultAckTimeout = redisack.DefaultTimeout

type script = redisack.Script

func newScript(src string) script { return redisack.NewScript(src) }

// write runs a script that writes, waiting for Config.AckReplicas replicas
// in the same round trip (see redisack.Write).
func (b *Backend) write(ctx context.Context, s script, keys, args []string) (rueidis.RedisResult, error) {
	return redisack.Write(ctx, b.c, s, b.ackReplicas, b.ackTimeout, keys, args)
}

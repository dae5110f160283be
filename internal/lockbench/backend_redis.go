package lockbench

import (
	"github.com/redis/rueidis"

	"github.com/llmgate/llmgate/lock"
	lockredis "github.com/llmgate/llmgate/lock/redis"
)

func newRedisBackend(c rueidis.Client) lock.Backend { return lockredis.New(c, lockredis.Config{}) }

package ratebench

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/redis/rueidis"
)

// countingClient is a rueidis.Client that counts the commands it sends:
// every Do is one command, a DoMulti of n commands is n (they share one
// write, but each is a command the server answers).
type countingClient struct {
	rueidis.Client
	n *atomic.Int64
}

func (c countingClient) Do(ctx context.Context, cmd rueidis.Completed) rueidis.RedisResult {
	c.n.Add(1)
	return c.Client.Do(ctx, cmd)
}

func (c countingClient) DoMulti(ctx context.Context, multi ...rueidis.Completed) []rueidis.RedisResult {
	c.n.Add(int64(len(multi)))
	return c.Client.DoMulti(ctx, multi...)
}

// cmdStat is one line of INFO commandstats.
type cmdStat struct {
	calls int64
	usec  int64
}

// commandstats reads INFO commandstats: calls and total µs per command.
// Commands that scripts run are counted too, under their own names.
func commandstats(ctx context.Context, c rueidis.Client) (map[string]cmdStat, error) {
	info, err := c.Do(ctx, c.B().Info().Section("commandstats").Build()).ToString()
	if err != nil {
		return nil, err
	}
	out := map[string]cmdStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok || !strings.HasPrefix(name, "cmdstat_") {
			continue
		}
		var s cmdStat
		for _, f := range strings.Split(rest, ",") {
			k, v, _ := strings.Cut(f, "=")
			switch k {
			case "calls":
				s.calls, _ = strconv.ParseInt(v, 10, 64)
			case "usec":
				s.usec, _ = strconv.ParseInt(v, 10, 64)
			}
		}
		out[strings.TrimPrefix(name, "cmdstat_")] = s
	}
	return out, nil
}

// scriptCommands are the commands a client sends to run a script.
var scriptCommands = []string{"evalsha", "eval", "evalsha_ro", "eval_ro", "fcall", "fcall_ro"}

// serverDelta summarises what the server did between two commandstats.
type serverDelta struct {
	scripts    int64         // script invocations
	scriptTime time.Duration // time inside them (what the server spent deciding)
	inner      int64         // commands run by other commands (inside scripts), except the bench's own INFO
}

func diffStats(before, after map[string]cmdStat) serverDelta {
	var d serverDelta
	isScript := map[string]bool{}
	for _, s := range scriptCommands {
		isScript[s] = true
		d.scripts += after[s].calls - before[s].calls
		d.scriptTime += time.Duration(after[s].usec-before[s].usec) * time.Microsecond
	}
	for name, s := range after {
		if isScript[name] || name == "info" || name == "ping" || name == "script|load" || name == "hello" || name == "client|setinfo" {
			continue
		}
		d.inner += s.calls - before[name].calls
	}
	return d
}

package ratebench

import (
	"context"
	"errors"
	"fmt"
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

// nodeLoad is what one master had done so far: its CPU time (INFO cpu:
// used_cpu_sys + used_cpu_user) and its commands (INFO commandstats).
type nodeLoad struct {
	cpu  float64 // seconds
	cmds map[string]cmdStat
}

// loads reads INFO cpu and commandstats from every master c reaches: the
// server of a standalone or Sentinel client, each master of a Cluster.
func loads(ctx context.Context, c rueidis.Client) (map[string]nodeLoad, error) {
	out := map[string]nodeLoad{}
	for addr, n := range c.Nodes() {
		info, err := n.Do(ctx, n.B().Info().Section("replication", "cpu", "commandstats").Build()).ToString()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", addr, err)
		}
		if l, master := parseLoad(info); master {
			out[addr] = l
		}
	}
	if len(out) == 0 {
		return nil, errors.New("no master answered INFO")
	}
	return out, nil
}

// parseLoad reads an INFO reply of the replication, cpu and commandstats
// sections; master reports its role.
func parseLoad(info string) (l nodeLoad, master bool) {
	l.cmds = map[string]cmdStat{}
	for _, line := range strings.Split(info, "\n") {
		name, rest, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		switch {
		case name == "role":
			master = rest == "master"
		case name == "used_cpu_sys" || name == "used_cpu_user":
			v, _ := strconv.ParseFloat(rest, 64)
			l.cpu += v
		case strings.HasPrefix(name, "cmdstat_"):
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
			l.cmds[strings.TrimPrefix(name, "cmdstat_")] = s
		}
	}
	return l, master
}

// total sums the commands of every master.
func total(ls map[string]nodeLoad) map[string]cmdStat {
	out := map[string]cmdStat{}
	for _, l := range ls {
		for name, s := range l.cmds {
			t := out[name]
			t.calls += s.calls
			t.usec += s.usec
			out[name] = t
		}
	}
	return out
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

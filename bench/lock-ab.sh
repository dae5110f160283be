#!/usr/bin/env bash
# Interleaved A/B runs of `llmgate bench lock`: two llmgate binaries (say, a
# commit and its parent) and, optionally, peers from bench/peers, one run of
# each per repetition, on a Redis of your own (everything in it is flushed
# between runs). Prints one line a run: ops/s, pair and hand-off p50, wait
# max, PING, violations, and the Redis and client CPU per operation.
#
#   bench/lock-ab.sh REPS URL OLD_BIN NEW_BIN [PEERS_BIN ALGO...] -- BENCH_ARGS...
#   bench/lock-ab.sh 3 redis://127.0.0.1:7711 /tmp/old /tmp/new /tmp/peers goredis-poll -- \
#       --workers 16 --keys 16 --shared-client --duration 3s
set -euo pipefail
command -v redis-cli >/dev/null && [ -x /usr/bin/time ] || { echo "lock-ab.sh: needs redis-cli and /usr/bin/time (Debian: apt-get install redis-tools time)" >&2; exit 2; }
reps=$1 url=$2 old=$3 new=$4; shift 4
peers="" algos=()
if [ "${1:-}" != "--" ]; then peers=$1; shift; while [ "${1:-}" != "--" ]; do algos+=("$1"); shift; done; fi
shift # --
hostport=${url#redis://}; host=${hostport%%:*}; port=${hostport##*:}; port=${port%%/*}
rcli() { redis-cli -h "$host" -p "$port" "$@"; }
rcpu() { rcli INFO cpu | awk -F: '/used_cpu_sys:|used_cpu_user:/{s+=$2} END{printf "%.6f", s}'; }
run() { # name, command...
	local name=$1; shift
	rcli FLUSHALL >/dev/null; rcli SCRIPT FLUSH >/dev/null
	local a b t
	a=$(rcpu)
	t=$( { /usr/bin/time -f "%U %S" "$@" --store "$url" --json > /tmp/lock-ab.json; } 2>&1 | tail -1)
	b=$(rcpu)
	python3 - "$r" "$name" "$a" "$b" "$t" <<'PY'
import json, sys
rep, name, a, b, t = sys.argv[1:]
d = json.load(open("/tmp/lock-ab.json"))
n = max(d["acquisitions"], 1)
u, s = map(float, t.split()[-2:])
print(f'{rep} {name:14} ops/s={d["ops_per_sec"]:.0f} pair_p50={d.get("pair_p50_us", 0)}us handoff_p50={d.get("handoff_p50_us", 0)}us '
      f'wait_max={d["wait_max_us"]:.0f}us ping={d.get("ping_p50_us")}/{d.get("ping_during_p50_us", "-")}us violations={d["violations"]} '
      f'redis_cpu={(float(b) - float(a)) * 1e6 / n:.1f}us/op client_cpu={(u + s) * 1e6 / n:.1f}us/op')
PY
}
for r in $(seq 1 "$reps"); do
	run old "$old" bench lock "$@"
	run new "$new" bench lock "$@"
	for a in "${algos[@]}"; do run "$a" "$peers" --algo "$a" "$@"; done
done

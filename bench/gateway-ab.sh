#!/usr/bin/env bash
# Alternated A/B runs of `llmgate bench gateway`: two llmgate binaries (say,
# a commit and its parent), ROUNDS rounds, each running both (in an order
# that alternates by round) with the same arguments. Prints, for each
# figure, the median over every repetition of every round and its range:
# memory (or redis) against the proxy and against direct, its own req/s,
# CPU per request and added p50 (minus direct's), and the proxy's.
#
#   bench/gateway-ab.sh ROUNDS OLD_BIN NEW_BIN -- BENCH_ARGS...
#   bench/gateway-ab.sh 6 /tmp/old /tmp/new -- --variants direct,proxy,memory \
#       --concurrency 64 --reps 3 --duration 2s --stream=false
set -euo pipefail
rounds=$1 old=$2 new=$3; shift 3
[ "${1:-}" = "--" ] && shift
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq 1 "$rounds"); do
	if [ $((r % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
	for b in $order; do
		bin=$old; [ "$b" = new ] && bin=$new
		"$bin" bench gateway "$@" --json >"$out/$b-$r.json" 2>/dev/null
	done
done
python3 - "$out" <<'PY'
import collections, glob, json, statistics, sys
res = collections.defaultdict(lambda: collections.defaultdict(list))
for f in glob.glob(sys.argv[1] + "/*.json"):
    build = f.rsplit("/", 1)[1].split("-")[0]
    cells = collections.defaultdict(dict)
    for m in json.load(open(f))["measurements"]:
        cells[(m["rep"], m["concurrency"])][m["variant"]] = m
    for (_, c), v in cells.items():
        for var in ("memory", "redis"):
            if var not in v:
                continue
            for ref in ("proxy", "direct"):
                if ref in v:
                    res[build][f"{var}/{ref} c={c}"].append(v[var]["rps"] / v[ref]["rps"])
            res[build][f"{var} req/s c={c}"].append(v[var]["rps"])
            if "direct" in v:
                res[build][f"{var} added p50 us c={c}"].append(v[var]["p50_us"] - v["direct"]["p50_us"])
            res[build][f"{var} cpu us/req c={c}"].append(v[var]["cpu_us_per_req"])
        if "proxy" in v and "direct" in v:
            res[build][f"proxy/direct c={c}"].append(v["proxy"]["rps"] / v["direct"]["rps"])
            res[build][f"proxy added p50 us c={c}"].append(v["proxy"]["p50_us"] - v["direct"]["p50_us"])
for k in sorted({k for b in res.values() for k in b}):
    cols = []
    for b in ("old", "new"):
        x = res[b][k]
        if x:
            cols.append(f"{b} {statistics.median(x):.3f} (n={len(x)}, {min(x):.3f}..{max(x):.3f})")
    print(f"{k:24} " + "   ".join(cols))
PY

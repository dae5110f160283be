#!/usr/bin/env bash
# Runs the lock benchmark grid of BENCHMARKS.md: every configuration once per
# repetition, repetitions interleaved, one JSON line per run appended to
# $OUT (default ../out/results.jsonl). Needs a Redis to measure against:
#
#   STORE=redis://127.0.0.1:PORT REPS=3 DURATION=4s ./campaign.sh
#   go run ./summarize < ../out/results.jsonl
#
# Each run is a separate process; each worker has its own client.
set -euo pipefail
cd "$(dirname "$0")"
: "${STORE:?set STORE=redis://127.0.0.1:PORT (a Redis you started; not a production one)}"
REPS=${REPS:-3}
DURATION=${DURATION:-4s}
OUT=${OUT:-../out/results.jsonl}
# SECTIONS picks parts of the grid: contended uncontended1 uncontended16 shared
SECTIONS=${SECTIONS:-contended uncontended1 uncontended16 shared}
has() { [[ " $SECTIONS " == *" $1 "* ]]; }
mkdir -p "$(dirname "$OUT")"
go build -o ../out/peers .
BIN=../out/peers

run() {
	echo "+ $*" >&2
	"$BIN" --store "$STORE" --duration "$DURATION" --json "$@" >>"$OUT" || echo "run failed: $*" >&2
}

contended_algos=("llmgate --fair" "llmgate" "poll" "goredis-poll" "redsync" "redislock" "rueidislock")
uncontended_algos=("llmgate" "poll" "goredis-poll" "redislock" "rueidislock")

for rep in $(seq "$REPS"); do
	echo "== repetition $rep" >&2
	if has contended; then
		for w in 8 32; do
			for cs in 0 100us; do
				for a in "${contended_algos[@]}"; do
					# shellcheck disable=SC2086 # "llmgate --fair" splits on purpose
					run --algo $a --workers "$w" --keys 1 --cs "$cs"
				done
			done
		done
	fi
	for a in "${uncontended_algos[@]}"; do
		# One goroutine; worker 0 also times a PING on its own client every 8 cycles.
		if has uncontended1; then run --algo "$a" --workers 1 --keys 1 --ping-every 8; fi
		if has uncontended16; then run --algo "$a" --workers 16 --keys 16; fi
	done
	if has shared; then
		for a in llmgate poll goredis-poll; do
			run --algo "$a" --workers 16 --keys 16 --shared-client
		done
		# 32 goroutines in one process on one key: non-fair queues them locally.
		run --algo llmgate --workers 32 --keys 1 --shared-client
		run --algo llmgate --fair --workers 32 --keys 1 --shared-client
	fi
done

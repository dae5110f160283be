#!/usr/bin/env bash
# Runs the whole test suite on a fresh machine that has only Go installed:
# installs redis-server from Debian packages when it is missing, then runs
# go vet and go test -race. Tests start their own redis-server processes on
# free loopback ports; nothing needs to be running beforehand.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! command -v redis-server >/dev/null 2>&1 && [ ! -x /usr/bin/redis-server ]; then
	echo "test.sh: redis-server is missing; installing it from Debian packages" >&2
	SUDO=""
	if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends redis-server >/dev/null
fi
# The Debian package starts a system redis-server on 6379; tests do not use it.
export REDIS_SERVER="$(command -v redis-server || echo /usr/bin/redis-server)"
"$REDIS_SERVER" --version
# Debian's chromium renders the llmgate sim report in its browser test
# (internal/simrun); with LLMGATE_REQUIRE_CHROMIUM=1 that test fails
# rather than skips without it.
if ! command -v chromium >/dev/null 2>&1; then
	echo "test.sh: chromium is missing; installing it from Debian packages" >&2
	SUDO=""
	if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi
	$SUDO apt-get update -qq
	DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null
fi
export LLMGATE_REQUIRE_CHROMIUM=1

# Each phase says when it starts (seconds since this script began), so a
# slow CI run shows where its time went.
phase() { echo "== $* (at ${SECONDS}s)"; }

phase go vet
go vet ./...
# bench/peers (the peer lock libraries, measured against llmgate's) is a
# module of its own, so that their dependencies stay out of llmgate's.
phase "go vet (bench/peers)"
(cd bench/peers && go vet ./...)
phase staticcheck
# Pinned: a new release can add checks that fail a passing tree.
go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...
(cd bench/peers && go run honnef.co/go/tools/cmd/staticcheck@v0.8.2 ./...)
phase go test -race
# Three things run at once: the tests mostly wait on processes and timers,
# while the fuzzers' instrumented builds and bench/peers' build keep the
# cores busy meanwhile.
# Every fuzz target explores 1000 executions past its seed corpus (FUZZ=0
# skips this; FUZZTIME=30s ./scripts/fuzz.sh explores longer), in a process
# group of its own, so that an early exit stops the fuzzers too.
fuzzpid=""
if [ "${FUZZ:-1}" != 0 ]; then
	fuzzlog="$(mktemp)"
	setsid ./scripts/fuzz.sh >"$fuzzlog" 2>&1 &
	fuzzpid=$!
fi
peerslog="$(mktemp)"
(cd bench/peers && exec setsid go test -race -count=1 -timeout 5m "$@" ./...) >"$peerslog" 2>&1 &
peerspid=$!
trap 'kill -- -"$peerspid" ${fuzzpid:+-"$fuzzpid"} 2>/dev/null || true' EXIT
# Four end-to-end tests at a time, and four packages: two cores stay busy.
rc=0
go test -race -count=1 -p 4 -parallel 4 -timeout 15m "$@" ./... || rc=$?
phase "go test -race (bench/peers, started with the tests)"
wait "$peerspid" || rc=$?
cat "$peerslog"
if [ -n "$fuzzpid" ]; then
	phase "fuzz (started with the tests)"
	wait "$fuzzpid" || rc=$?
	cat "$fuzzlog"
fi
trap - EXIT
rm -f "$peerslog" ${fuzzlog:+"$fuzzlog"}
phase done
exit "$rc"

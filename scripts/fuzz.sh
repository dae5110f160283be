#!/usr/bin/env bash
# Runs every fuzz target for a bounded time (FUZZTIME each, default 2s),
# one target at a time: go test -fuzz takes one target per run. The seed
# corpora already run in the normal test suite; this explores past them.
# Usage: scripts/fuzz.sh [PACKAGE_DIR...]   (default: every package)
set -euo pipefail
cd "$(dirname "$0")/.."
FUZZTIME="${FUZZTIME:-2s}"

if [ "$#" -gt 0 ]; then
	files=$(grep -l '^func Fuzz' $(printf '%s/*_test.go ' "$@"))
else
	files=$(grep -rl --include='*_test.go' '^func Fuzz' . | grep -v '^./bench/')
fi
n=0
for f in $files; do
	dir="./$(dirname "${f#./}")"
	for target in $(grep -o '^func Fuzz[A-Za-z0-9_]*' "$f" | sed 's/^func //'); do
		echo "fuzz $dir $target ($FUZZTIME)"
		go test -run '^$' -fuzz "^${target}\$" -fuzztime "$FUZZTIME" "$dir" >/tmp/fuzz.$$.log 2>&1 || {
			cat /tmp/fuzz.$$.log
			echo "fuzz.sh: $target in $dir failed; the failing input is under $dir/testdata/fuzz/$target" >&2
			rm -f /tmp/fuzz.$$.log
			exit 1
		}
		n=$((n + 1))
	done
done
rm -f /tmp/fuzz.$$.log
echo "fuzz.sh: $n targets, $FUZZTIME each: no failure"

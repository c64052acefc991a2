#!/usr/bin/env bash
# `make bench`: TB.TAKE against the reference Lua token bucket (EVALSHA), PING,
# INCR and a 2-field HSET, on servers this script starts itself (free loopback
# ports, temporary directories, removed afterwards).
#
# Prints a table and the ratios the performance targets are about, and writes
# bench/results.json, bench/results.md and bench/chart.svg.
#
# Knobs (environment or flags passed through to bench/bench.py):
#   BENCH_REPS=3     repetitions (medians and min-max spreads over these)
#   BENCH_SCALE=1    multiplies request counts; 0.1 for a quick smoke run
#   TB_SERVER=...    server binary (default redis-server; valkey-server works)
#   TB_MODULE=...    module to load (default target/release/libredis_tb.so)
#   --no-aof         skip the AOF rows
# A full run takes about 6-9 minutes on 2 cores.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"

for tool in python3 redis-benchmark "${TB_SERVER:-redis-server}"; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "bench: $tool not found (make deps installs the redis tools)" >&2
        exit 1
    fi
done

# Always go through cargo: it rebuilds only when a source changed.
if [[ -z "${TB_MODULE:-}" ]]; then
    cargo build --release --quiet
fi

exec python3 bench/bench.py "$@"

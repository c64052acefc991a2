#!/usr/bin/env bash
# `make bench`: TB.TAKE against the reference Lua token bucket (EVALSHA), the
# peer module redis-cell (CL.THROTTLE), PING, INCR, a 2-field HSET and MSET, on
# servers this script starts itself (free loopback ports, temporary
# directories, removed afterwards).
#
# Prints a table and the ratios the performance targets are about, and writes
# bench/results/results.json, bench/results/results.md and
# bench/results/chart.svg (every part writes under bench/results/, apart from
# the scripts). Then TB.BTAKE with 1,000 and 10,000 waiters on one key
# (bench/btake_bench.py: order, losses, wake latency, CPU and memory per
# waiter; bench/results/btake-results.md). Last, the
# hand-off race (bench/handoff_bench.py): 4,000 clients blocked on one key in
# TB.BTAKE, then in BLPOP, one supply each, time to the last reply and server
# CPU per served waiter on Redis, every fetched Valkey and the binaries in
# TB_BENCH_SERVERS (bench/results/handoff-results.md). Then the lease race
# (bench/lease_bench.py): TB.ACQUIRE + TB.RELEASE against the Lua sorted-set
# semaphore (EVALSHA + ZREM) and our own tb.lua, server time per pair, on the
# same servers (bench/results/lease-results.md). Then the client libraries'
# middleware (bench/middleware_bench.py): the limiter's cost per request against
# a bare route and one plain GET, under uvicorn/Starlette, gunicorn/Flask,
# Express, Fastify and axum (bench/results/middleware-results.md; the frameworks are
# installed on first use under .cache/mw-bench; one that cannot be installed is
# reported as skipped). Then the libraries' in-process answers
# (bench/local_bench.py): a take on the local limiter and a denial from the
# denial cache against one GET round trip, in Python, Node and Rust
# (bench/results/local-results.md and .json). Last, TB.TAKE with TB.TOP's summary on
# and off, in instructions under callgrind (bench/results/top-results.md).
#
# Knobs (environment or flags passed through to bench/bench.py):
#   BENCH_REPS=3     repetitions (medians and min-max spreads over these)
#   BENCH_SCALE=1    multiplies request counts; 0.1 for a quick smoke run
#   TB_SERVER=...    server binary (default redis-server; valkey-server works)
#   TB_MODULE=...    module to load (default target/release/libredis_tb.so)
#   TB_PEER_MODULE=  redis-cell .so to load beside it; unset: built (once, cached
#                    under ~/.cache/redis-tb-bench) by scripts/build-redis-cell.sh;
#                    "none": no CL.THROTTLE rows. If it cannot be built, the bench
#                    says why and runs without those rows.
#   --no-aof         skip the AOF rows
#   BENCH_BASELINE=  the previous build's module, for the row that checks plain
#                    TB.TAKE did not get dearer; unset: built (cached under
#                    ~/.cache/redis-tb-bench/baseline) from the commit before the
#                    last one that changed src/, core/src or a Cargo.toml;
#                    "none": no such row
#   BENCH_BTAKE=0    skip the TB.BTAKE part; BENCH_BTAKE_ARGS=... passes
#                    options to it (e.g. "--quick", "--servers redis")
#   BENCH_HANDOFF=0  skip the hand-off race; BENCH_HANDOFF_ARGS=... passes
#                    options to it (e.g. "--waiters 10000 --rounds 5")
#   BENCH_LEASE=0    skip the lease race; BENCH_LEASE_ARGS=... passes options
#                    to it (e.g. "--servers redis --scale 0.2"); it loads the
#                    bench-floor build (target/bench-floor, built here) unless
#                    TB_LEASE_MODULE names another .so
#   TB_BENCH_SERVERS=/a/redis-server:/b/valkey-server
#                    more servers for the hand-off race and the lease race
#                    (missing ones skipped)
#   BENCH_MIDDLEWARE=0  skip the middleware part; BENCH_MIDDLEWARE_ARGS=...
#                    passes options to it (e.g. "--quick", "--only axum,Express")
#   BENCH_TOP=0      skip TB.TOP's on/off instruction counts (BENCH_TOP_CALLS=5000 calls each)
#   BENCH_LOCAL=0    skip the libraries' local limiter and denial cache against
#                    one GET (bench/local_bench.py); BENCH_LOCAL_ARGS=... passes
#                    options to it (e.g. "--reps 1")
# A full run takes about 15-18 minutes on 2 cores (the hand-off race well under
# one of them, the lease race about a minute on three servers, the middleware
# about four more, plus its installs the first time).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=scripts/bench-common.sh
source scripts/bench-common.sh

require_tools bench "make deps installs the redis tools" python3 redis-benchmark "${TB_SERVER:-redis-server}"
build_module
# The lease race and TB.TAKE's floor row load the bench-only build with TB.FLOOR.*
# (src/testing/bench_floor.rs, src/bucket/floor.rs),
# kept in its own target directory so it never replaces the module users run.
if [[ -z "${TB_LEASE_MODULE:-}" ]]; then
    cargo build --release --quiet --features bench-floor --target-dir target/bench-floor
fi

# The previous build: the module as of the commit before the last one that
# changed it, built once per commit in a worktree of its own outside the tree.
if [[ -z "${BENCH_BASELINE:-}" ]]; then
    # Only what builds the module counts: a commit that adds a core test or
    # a bench script does not make a new build to compare against.
    module_paths=(src core/src core/Cargo.toml Cargo.toml)
    last=$(git rev-list -n 1 HEAD -- "${module_paths[@]}" 2>/dev/null || true)
    base=$( [[ -n "$last" ]] && git rev-list -n 1 "$last~1" -- "${module_paths[@]}" 2>/dev/null || true)
    if [[ -n "$base" ]]; then
        dir="${XDG_CACHE_HOME:-$HOME/.cache}/redis-tb-bench/baseline/$base"
        if [[ ! -f "$dir/target/release/libredis_tb.so" ]]; then
            rm -rf "$dir"
            git worktree add --detach --force "$dir" "$base" >/dev/null 2>&1 \
                && (cd "$dir" && cargo build --release --quiet) || echo "bench: baseline $base could not be built" >&2
            git worktree prune
        fi
        [[ -f "$dir/target/release/libredis_tb.so" ]] && export BENCH_BASELINE="$dir/target/release/libredis_tb.so"
    fi
elif [[ "$BENCH_BASELINE" == none ]]; then
    export BENCH_BASELINE=""
fi

# The peer, redis-cell 0.2.2 from crates.io, built outside the project tree.
if [[ -z "${TB_PEER_MODULE:-}" ]]; then
    peer_log=$(mktemp)
    if peer=$(bash scripts/build-redis-cell.sh 2>"$peer_log"); then
        export TB_PEER_MODULE="$peer"
    else
        echo "bench: redis-cell could not be built; running without the CL.THROTTLE rows:" >&2
        sed 's/^/  /' "$peer_log" >&2
        TB_PEER_MISSING="scripts/build-redis-cell.sh failed: $(tail -n 1 "$peer_log")"
        export TB_PEER_MISSING
    fi
    rm -f "$peer_log"
elif [[ "$TB_PEER_MODULE" == none ]]; then
    export TB_PEER_MODULE="" TB_PEER_MISSING="TB_PEER_MODULE=none"
fi

python3 bench/bench.py "$@"
# Each part runs even when an earlier one found a correctness failure; the
# script then exits 1.
status=0
if [[ "${BENCH_BTAKE:-1}" != 0 ]]; then
    # shellcheck disable=SC2086
    python3 bench/btake_bench.py ${BENCH_BTAKE_ARGS:-} || status=1
fi
if [[ "${BENCH_HANDOFF:-1}" != 0 ]]; then
    # shellcheck disable=SC2086
    python3 bench/handoff_bench.py ${BENCH_HANDOFF_ARGS:-} || status=1
fi
if [[ "${BENCH_LEASE:-1}" != 0 ]]; then
    # shellcheck disable=SC2086
    python3 bench/lease_bench.py ${BENCH_LEASE_ARGS:-} || status=1
fi
if [[ "${BENCH_MIDDLEWARE:-1}" != 0 ]]; then
    # shellcheck disable=SC2086
    python3 bench/middleware_bench.py ${BENCH_MIDDLEWARE_ARGS:-} || status=1
fi
# TB.TOP's summary on against off, in instructions under callgrind, in one run
# (bench/results/top-results.md).
if [[ "${BENCH_TOP:-1}" != 0 ]]; then
    if command -v valgrind >/dev/null && command -v callgrind_control >/dev/null; then
        python3 bench/callgrind_profile.py -n "${BENCH_TOP_CALLS:-5000}" --out .cache/profile-top \
            --only "TB.TAKE allowed,TB.TAKE denied,TB.TAKE allowed (TB.TOP off),TB.TAKE denied (TB.TOP off),TB.TAKE denied on 100 keys,TB.TAKE denied on 100 keys (TB.TOP off)" \
            >/dev/null && cp .cache/profile-top/top.md bench/results/top-results.md \
            && cat bench/results/top-results.md || status=1
    else
        echo "bench: no valgrind (apt-get install valgrind): TB.TOP's on/off rows skipped" >&2
    fi
fi
if [[ "${BENCH_LOCAL:-1}" != 0 ]]; then
    # shellcheck disable=SC2086
    python3 bench/local_bench.py ${BENCH_LOCAL_ARGS:-} || status=1
fi
exit "$status"

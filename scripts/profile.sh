#!/usr/bin/env bash
# Instruction counts per call under callgrind: TB.TAKE (allowed and denied)
# next to PING, INCR, a 2-field HSET, the Lua script via EVALSHA and, when
# scripts/build-redis-cell.sh has built it, redis-cell's CL.THROTTLE; plus where
# the module's instructions go, its allocations per call, and a table of the
# server functions TB.TAKE and CL.THROTTLE reach (compare two servers with
# TB_SERVER=... and --out).
#
# Instruction counts are stable on a noisy machine, so this is the way to
# judge a hot-path change: run it before and after, compare "instr total".
#
#   scripts/profile.sh              # 20000 calls per workload (5-10 minutes)
#   scripts/profile.sh -n 5000      # quicker
#   scripts/profile.sh --only "TB.TAKE allowed,HSET"
#   TB_MODULE=/path/libredis_tb.so scripts/profile.sh   # profile another build
#
# Dumps, report.txt/json and callgrind_annotate output go to .cache/profile/.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# shellcheck source=scripts/bench-common.sh
source scripts/bench-common.sh

require_tools profile "apt-get install valgrind redis-tools redis-server" \
    python3 valgrind callgrind_control callgrind_annotate redis-benchmark "${TB_SERVER:-redis-server}"
build_module

exec python3 bench/callgrind_profile.py "$@"

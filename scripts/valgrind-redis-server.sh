#!/usr/bin/env bash
# redis-server under valgrind memcheck, with the same command line.
# Used by scripts/sanitize.sh as TB_SERVER for the integration tests.
#
# It execs valgrind, so the process the harness started IS the server (the
# harness checks INFO process_id against its child's pid). One log per
# process: $TB_VALGRIND_LOG_DIR/vg-<pid>.log (default /tmp/tb-valgrind).
#
# Redis allocates through the system libjemalloc.so.2 (plain malloc/free
# symbols); --soname-synonyms makes memcheck replace those too, so every heap
# block Redis and the module use is tracked (redzones, leaks).
set -euo pipefail
log_dir=${TB_VALGRIND_LOG_DIR:-/tmp/tb-valgrind}
mkdir -p "$log_dir"
exec valgrind \
    --tool=memcheck \
    --leak-check=full \
    --show-leak-kinds=definite \
    --errors-for-leak-kinds=definite \
    --error-exitcode="${TB_VALGRIND_EXIT:-99}" \
    --error-limit=no \
    --num-callers=40 \
    --soname-synonyms=somalloc=libjemalloc.so* \
    --log-file="$log_dir/vg-%p.log" \
    ${TB_VALGRIND_EXTRA:-} \
    "${TB_VALGRIND_SERVER:-redis-server}" "$@"

#!/usr/bin/env bash
# Memory safety and leaks of the module inside a real redis-server.
#
#   scripts/sanitize.sh [phase ...]          (`make sanitize`; default: suite leaks growth)
#
# Phases:
#   suite   Integration tests (SANITIZE_TESTS: module paths of tests/it, default: the
#           commands take, errors, takeall, refund, peek, top, and waiting::btake,
#           waiting::btake_events, leases::commands) against redis-server under valgrind memcheck. Every memcheck
#           error (invalid read/write/free, uninitialised value, overlap) is
#           reported; one whose stack goes through libredis_tb.so fails the run.
#           The harness SIGKILLs its servers, so this phase cannot see leaks.
#   leaks   One server under valgrind driven through every command path (allowed,
#           denied, each error, corrupt and binary keys, MULTI, EVAL, shadow mode,
#           INFO/COMMAND DOCS, MODULE UNLOAD/LOAD) LEAK_ROUNDS times, then a clean
#           SHUTDOWN so memcheck's leak check runs: any definite leak not in
#           scripts/valgrind.supp, or any other memcheck error, fails.
#   growth  No valgrind: GROWTH_CALLS (default 100000) calls per command path on a
#           plain server, three rounds, buckets expired and then deleted between
#           rounds; INFO memory used_memory must come back to the same value (no
#           per-call growth) and INFO commandstats must show every call ran.
#   asan    (not in the default set) The module built with AddressSanitizer
#           (nightly flag via RUSTC_BOOTSTRAP=1) loaded into redis-server with
#           clang's ASan runtime (Debian libclang-rt-14-dev) LD_PRELOADed, running
#           the same integration tests, then the leak workload on one server with
#           LeakSanitizer and a clean SHUTDOWN (scripts/lsan.supp); any ASan or
#           LSan report fails. Fast (seconds), but build ~2 min from clean.
#
# Env: SANITIZE_TESTS, SANITIZE_THREADS (default 2), LEAK_ROUNDS (default 20),
#      GROWTH_CALLS (default 100000), TB_SERVER_BIN (default redis-server),
#      SANITIZE_SKIP: test names to skip under valgrind (default: the tests
#      whose timing windows, a few ms, a server 20-50x slower cannot meet).
# Output and logs: .cache/sanitize/.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
OUT=$ROOT/.cache/sanitize
MODULE=$ROOT/target/release/libredis_tb.so
SERVER_BIN=${TB_SERVER_BIN:-redis-server}
TESTS=${SANITIZE_TESTS:-commands::take:: commands::errors:: commands::takeall:: commands::refund:: commands::peek:: commands::top:: waiting::btake:: waiting::btake_events:: leases::commands::}
THREADS=${SANITIZE_THREADS:-2}
LEAK_ROUNDS=${LEAK_ROUNDS:-100}
GROWTH_CALLS=${GROWTH_CALLS:-100000}
# Timing-window tests: each asserts an expiry or a refill within a few ms of a
# previous call, which a server under valgrind (20-50x slower) cannot meet.
SKIP=${SANITIZE_SKIP:-a_waiter_is_never_granted_after_its_deadline_nor_denied_before_it short_waits_behind_a_long_one_leave_no_memory_behind expiry_follows_each_allowed_take future_last_refill_counts_as_no_elapsed_time key_expires_when_the_bucket_is_full_again takeall_with_hash_tagged_keys_works_through_a_cluster_client a_flood_of_tb_take_cannot_starve_a_waiter}
PHASES=("$@")
(( ${#PHASES[@]} )) || PHASES=(suite leaks growth)

if ! command -v cargo >/dev/null 2>&1 && [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
    # shellcheck disable=SC1091
    source "${CARGO_HOME:-$HOME/.cargo}/env"
fi
need() {
    command -v "$1" >/dev/null 2>&1 && return
    if [[ $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "--- installing $2"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$2" >/dev/null
    fi
    command -v "$1" >/dev/null 2>&1 || { echo "sanitize.sh: $1 is missing (apt-get install $2)" >&2; exit 1; }
}
need valgrind valgrind
need redis-cli redis-tools

mkdir -p "$OUT"
# Servers this script started; stopped on any exit (an error under set -e too).
STARTED=()
cleanup() {
    local pid running
    running=" $(jobs -p | tr '\n' ' ') "
    for pid in "${STARTED[@]}"; do
        # Only a job of this shell that is still running (never a reused pid).
        [[ $running == *" $pid "* ]] && kill "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT
failures=()
summary=()
now() { date +%s; }

# A TCP port nobody listens on.
free_port() {
    local port
    while :; do
        # Below Linux's ephemeral range (32768+), where a client socket's
        # local port can make bind fail although nothing listens there.
        port=$(( 20000 + RANDOM % 12000 ))
        if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            echo "$port"
            return
        fi
    done
}

# wait_ping PORT PID SECONDS
wait_ping() {
    local deadline=$(( $(now) + $3 ))
    until [[ $(redis-cli -p "$1" PING 2>/dev/null) == PONG ]]; do
        if ! kill -0 "$2" 2>/dev/null; then
            echo "server on port $1 exited while starting" >&2
            return 1
        fi
        if (( $(now) > deadline )); then
            echo "server on port $1 did not answer PING within $3 s" >&2
            return 1
        fi
        sleep 0.2
    done
}

# Memcheck error blocks (not leaks) in the given logs: prints each block, and
# returns the number of blocks whose stack goes through the module.
scan_memcheck_errors() {
    awk '
        /^==[0-9]+== (Invalid (read|write|free)|Mismatched free|Conditional jump|Use of uninitialised|Syscall param|Source and destination overlap|Argument .* of function|Process terminating)/ {
            inblock = 1; block = $0 "\n"; mod = 0; total++; next
        }
        inblock && /^==[0-9]+== *$/ {
            inblock = 0
            if (mod) { modcount++; printf "[MODULE] %s", block } else { printf "[redis]  %s", block }
            next
        }
        inblock { block = block $0 "\n"; if ($0 ~ /libredis_tb/) mod = 1 }
        END { printf "memcheck errors: %d, through libredis_tb.so: %d\n", total, modcount > "/dev/stderr"; exit (modcount > 0) }
    ' "$@"
}

# The command paths, one redis-cli line each (sdssplitargs quoting).
workload() {
    local long
    long=$(printf 'k%.0s' {1..100})
    cat <<EOF
TB.TAKE vk:a 10 1 1
TB.TAKE vk:a 10 1 20
TB.TAKE vk:slow 1 0.001 1
TB.TAKE vk:slow 1 0.001 1
TB.TAKE vk:zero 10 1 0
TB.PEEK vk:a 10 1
TB.PEEK vk:a 10 1 3
TB.PEEK vk:nokey 10 1 0.5
TB.REFUND vk:a 10 1 2
TB.REFUND vk:slow 1 0.001 0.5
TB.REFUND vk:missing 10 1 2
TB.TAKEALL vk:b 5 1 1 vk:c 100 10 1
TB.TAKEALL vk:b 5 1 100 vk:c 100 10 1
TB.TAKEALL vk:b 5 1 1 vk:b 5 1 1
TB.TAKEALL vk:b 5 1
TB.TAKEALL vk:b 5 1 1 vk:c nan 1 1
TB.TAKE vk:a nan 1 1
TB.TAKE vk:a 10 inf 1
TB.TAKE vk:a 10 1 -1
TB.TAKE vk:a "" 1 1
TB.TAKE vk:a 1e400 1 1
TB.TAKE vk:a 10 1
TB.PEEK vk:a 10
SET vk:str x
TB.TAKE vk:str 10 1 1
TB.TAKEALL vk:b 5 1 1 vk:str 10 1 1
HSET vk:bad tokens garbage last_refill 1
TB.TAKE vk:bad 10 1 1
TB.PEEK vk:bad 10 1 1
TB.REFUND vk:bad 10 1 1
TB.TAKEALL vk:b 5 1 1 vk:bad 10 1 1
HSET "vk:\\x00\\xff'\\\\bin" tokens x last_refill 1
TB.TAKE "vk:\\x00\\xff'\\\\bin" 10 1 1
HSET vk:$long tokens 1 last_refill nope
TB.TAKE vk:$long 10 1 1
HSET vk:odd tokens -5 last_refill 99999999999999 extra field
TB.TAKE vk:odd 10 1 1
HSET vk:sci tokens 1e+15 last_refill 0.5
TB.TAKE vk:sci 10 1 1
TB.TAKE vk:huge 1e300 1e-300 1
TB.TAKE vk:tiny 5e-324 5e-324 5e-324
MULTI
TB.TAKE vk:m 10 1 1
TB.PEEK vk:m 10 1
TB.TAKE vk:m x 1 1
EXEC
EVAL "return redis.call('TB.TAKE', KEYS[1], 10, 1, 1)" 1 vk:lua
EVAL "return redis.pcall('TB.TAKE', KEYS[1], 'x', 1, 1)" 1 vk:lua
TB.TAKE vk:w 2 1000 2
TB.BTAKE vk:w 2 1000 2 500
TB.TAKE vk:w 2 0.001 2
TB.BTAKE vk:w 2 0.001 1 3
TB.BTAKE vk:w 2 0.001 1 0.5
TB.BTAKE vk:str 2 1 1 5
TB.BTAKE vk:w 2 0.001 x 5
TB.ACQUIRE vk:l 2 60000
TB.ACQUIRE vk:l 2 1
TB.ACQUIRE vk:l 2 60000
TB.ACQUIRE vk:l 0 1
TB.ACQUIRE vk:l 1 1 x
TB.RELEASE vk:l 1-1
TB.RELEASE vk:l seq
TB.RENEW vk:l 1-1 10
TB.RENEW vk:l 1-1 0
EVAL "local r = redis.call('TB.ACQUIRE', KEYS[1], 5, 60000); redis.call('TB.RENEW', KEYS[1], r[4], 1000); return redis.call('TB.RELEASE', KEYS[1], r[4])" 1 vk:l
TB.ACQUIRE vk:str 1 1
ZADD vk:z 1 a
TB.ACQUIRE vk:z 1 1
TB.RELEASE vk:z 1-1
SWAPDB 0 1
SWAPDB 0 1
FLUSHDB ASYNC
CONFIG SET tb.shadow-mode yes
TB.TAKE vk:slow 1 0.001 5
CONFIG SET tb.shadow-mode no
INFO tb
COMMAND DOCS tb.take tb.takeall tb.acquire tb.release tb.renew
COMMAND GETKEYS TB.TAKEALL a 1 1 1 b 1 1 1
DEL vk:a vk:slow vk:zero vk:b vk:c vk:str vk:bad vk:odd vk:sci vk:huge vk:tiny vk:m vk:lua vk:w vk:l vk:z
EOF
}

# ---------------------------------------------------------------------------
phase_build() {
    echo "--- build the module"
    cargo build --release
}

# ---------------------------------------------------------------------------
phase_suite() {
    local dir=$OUT/valgrind-suite start args=() skips=() t rc
    rm -rf "$dir"; mkdir -p "$dir"
    args=(--test it)
    for t in $SKIP; do skips+=(--skip "$t"); done
    echo "--- suite under valgrind: ${TESTS} (${THREADS} threads); logs in $dir"
    start=$(now)
    set +e
    TB_SERVER="$ROOT/scripts/valgrind-redis-server.sh" \
    TB_VALGRIND_SERVER="$SERVER_BIN" \
    TB_VALGRIND_LOG_DIR="$dir" \
    TB_VALGRIND_EXTRA="--suppressions=$ROOT/scripts/valgrind.supp" \
    TB_START_TIMEOUT_MS=${TB_START_TIMEOUT_MS:-180000} \
    TB_MODULE="$MODULE" \
        cargo test --release --no-fail-fast "${args[@]}" -- --test-threads="$THREADS" $TESTS "${skips[@]}" 2>&1 | tee "$dir/cargo-test.log"
    rc=${PIPESTATUS[0]}
    set -e
    local servers
    servers=$(find "$dir" -name 'vg-*.log' | wc -l)
    # The harness kills servers with SIGKILL: wait until every valgrind is gone.
    echo "suite: $(( $(now) - start )) s, ${servers} servers under valgrind, cargo test exit ${rc}"
    grep -E "^test result:" "$dir/cargo-test.log" | awk '{ p += $4; f += $6 } END { printf "tests under valgrind: %d passed, %d failed\n", p, f }' 
    if (( rc != 0 )); then
        failures+=("suite: integration tests failed under valgrind (see $dir/cargo-test.log)")
    fi
    if ! scan_memcheck_errors "$dir"/vg-*.log > "$dir/errors.txt"; then
        failures+=("suite: memcheck errors in the module (see $dir/errors.txt)")
    fi
    cat "$dir/errors.txt"
    summary+=("suite: $(( $(now) - start )) s, ${servers} servers, tests exit ${rc}, $(grep -c '^\[MODULE\]' "$dir/errors.txt" || true) module errors, $(grep -c '^\[redis\]' "$dir/errors.txt" || true) others")
}

# workload_rounds PORT DIR: the workload (kept in DIR/workload.txt for a
# later run) LEAK_ROUNDS times against the server on PORT, its replies
# appended to DIR/replies.txt: how both leak checks, valgrind's (leaks) and
# LeakSanitizer's (asan), drive their server.
workload_rounds() {
    local i
    workload > "$2/workload.txt"
    for (( i = 0; i < LEAK_ROUNDS; i++ )); do
        redis-cli -p "$1" < "$2/workload.txt" >> "$2/replies.txt" 2>&1
    done
}

# ---------------------------------------------------------------------------
phase_leaks() {
    local dir=$OUT/valgrind-leaks port pid start i rc
    rm -rf "$dir"; mkdir -p "$dir/data"
    port=$(free_port)
    echo "--- leaks: one server under valgrind, ${LEAK_ROUNDS} rounds of every command path, then SHUTDOWN"
    start=$(now)
    TB_VALGRIND_SERVER="$SERVER_BIN" TB_VALGRIND_LOG_DIR="$dir" \
    TB_VALGRIND_EXTRA="--suppressions=$ROOT/scripts/valgrind.supp" \
        "$ROOT/scripts/valgrind-redis-server.sh" --port "$port" --bind 127.0.0.1 \
        --loadmodule "$MODULE" --dir "$dir/data" --save "" --appendonly no \
        --enable-module-command yes \
        --logfile "$dir/server.log" >"$dir/stdio.log" 2>&1 &
    pid=$!
    STARTED+=("$pid")
    wait_ping "$port" "$pid" 180
    workload_rounds "$port" "$dir"
    if grep -q "internal error" "$dir/replies.txt"; then
        failures+=("leaks: a handler panicked (ERR tb: internal error), see $dir/replies.txt")
    fi
    # Unload and load again (a leak per load would show here), then use it.
    for (( i = 0; i < 3; i++ )); do
        redis-cli -p "$port" MODULE UNLOAD tb >> "$dir/module.txt" 2>&1
        redis-cli -p "$port" MODULE LOAD "$MODULE" >> "$dir/module.txt" 2>&1
    done
    redis-cli -p "$port" < "$dir/workload.txt" >> "$dir/replies.txt" 2>&1
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    set +e
    wait "$pid"
    rc=$?
    set -e
    echo "leaks: $(( $(now) - start )) s, valgrind exit ${rc} (99 = memcheck errors or definite leaks)"
    echo "MODULE UNLOAD/LOAD replies: $(sort "$dir/module.txt" | uniq -c | tr '\n' ' ')"
    grep -E "definitely lost|indirectly lost|ERROR SUMMARY|suppressed:" "$dir"/vg-*.log || true
    local lost
    lost=$(grep -E "definitely lost:" "$dir"/vg-*.log | awk '{ gsub(/,/, "", $4); s += $4 } END { print s + 0 }')
    # Each definite-leak record, by where it was allocated: from the module's
    # RedisModule_OnLoad (once per MODULE LOAD: lost when the module is
    # unloaded), elsewhere through the module (per call: fails), or Redis's own.
    local kinds per_call per_load redis_own
    kinds=$(awk '/are definitely lost in loss record/ { b = 1; m = 0; l = 0; next }
        b && /^==[0-9]+== *$/ { if (l) load++; else if (m) call++; else own++; b = 0 }
        b && /libredis_tb/ { m = 1 }
        b && /RedisModule_OnLoad/ { l = 1 }
        END { print call + 0, load + 0, own + 0 }' "$dir"/vg-*.log)
    read -r per_call per_load redis_own <<< "$kinds"
    if ! scan_memcheck_errors "$dir"/vg-*.log > "$dir/errors.txt"; then
        failures+=("leaks: memcheck errors in the module (see $dir/errors.txt)")
    fi
    if (( per_call > 0 )); then
        failures+=("leaks: ${per_call} definite leak records allocated by the module outside OnLoad (see $dir/vg-*.log)")
    fi
    if (( rc != 0 && rc != 99 )); then
        failures+=("leaks: the server under valgrind ended with exit ${rc} (crash?), see $dir/server.log")
    fi
    echo "definite leak records: ${per_call} per call (module), ${per_load} per MODULE LOAD (lost on UNLOAD), ${redis_own} Redis's own"
    summary+=("leaks: $(( $(now) - start )) s, $(( LEAK_ROUNDS + 1 )) rounds x $(wc -l < "$dir/workload.txt") commands + 3 unload/load, ${lost} bytes definitely lost (unsuppressed): ${per_call} records per call, ${per_load} per MODULE LOAD, ${redis_own} Redis's own; valgrind exit ${rc}")
}

# ---------------------------------------------------------------------------
info_field() { redis-cli -p "$1" INFO "$2" | tr -d '\r' | awk -F: -v f="$3" '$1 == f { print $2 }'; }

# resp N ARG... : N commands in the wire protocol; "__i__" in an argument becomes
# the call's number (7 digits, so every command has the same length), so each
# call can name a new key. (seq + sed: mawk's gsub is far too slow for this.)
resp() {
    local n=$1 arg template=""
    shift
    for arg in "$@"; do
        arg=${arg//__i__/@@@@@@@}
        template+='\r\n$'"${#arg}"'\r\n'"${arg}"
    done
    # sed writes the line's own \n after the final \r; \1 is the number.
    template="*$#${template}"'\r'
    template=${template//@@@@@@@/'\1'}
    seq -f '%07g' 0 $(( n - 1 )) | sed -E "s|(.*)|${template}|"
}

# growth_round PORT: GROWTH_CALLS calls of each path; buckets expire, then FLUSHALL.
# redis-cli --pipe sends them all and counts the replies (error replies included).
growth_round() {
    local port=$1 n=$GROWTH_CALLS
    {
        # New buckets that expire 1 ms after their take (capacity 1, 1000/s).
        resp "$n" TB.TAKE "g:new:__i__" 1 1000 1
        # One hot bucket written on every call.
        resp "$n" TB.TAKE g:hot 1e12 1 1
        # Denied calls, peeks, refunds, multi-key takes.
        resp "$n" TB.TAKE g:empty 1 0.000001 1
        resp "$n" TB.PEEK "g:peek:__i__" 10 1
        resp "$n" TB.REFUND g:hot 1e12 1 1
        resp "$n" TB.TAKEALL "g:all:__i__" 1 1000 1 g:b 1e12 1 1
        # Waits that time out after 1 ms (each holds the pipe for its wait,
        # so fewer of them): nothing may stay behind per waiter that left.
        resp $(( n / 20 )) TB.BTAKE g:empty 1 0.000001 1 1
        # Error replies: the corrupt-bucket message is built per call.
        resp "$n" TB.TAKE g:corrupt 10 1 1
        resp "$n" TB.TAKE g:x nan 1 1
        resp "$n" TB.TAKEALL g:c 1 1 1 g:c 1 1 1
        # 1 ms leases on one key: each grant removes those that ended.
        resp "$n" TB.ACQUIRE g:lease 1000000 1
        resp "$n" TB.RELEASE g:lease "1-__i__"
    } | redis-cli -p "$port" --pipe --pipe-timeout 120 > "$OUT/growth/pipe.txt" 2>&1 || true
    # (--pipe exits 1 when any reply is an error, as a third of these are.)
    local result
    result=$(grep -E "^errors:" "$OUT/growth/pipe.txt" || echo "no reply summary")
    echo "  $result"
    if [[ $result != *"replies: $(( n * 11 + n / 20 ))" ]]; then
        failures+=("growth: expected $(( n * 11 + n / 20 )) replies, got: $result")
    fi
    # Let the 1 ms buckets expire by themselves (active expiry), then delete the rest.
    local deadline=$(( $(now) + 60 ))
    while (( $(redis-cli -p "$port" DBSIZE) > 10 )) && (( $(now) < deadline )); do sleep 0.5; done
    redis-cli -p "$port" FLUSHALL SYNC >/dev/null
    redis-cli -p "$port" HSET g:corrupt tokens garbage last_refill 1 >/dev/null
    redis-cli -p "$port" MEMORY PURGE >/dev/null 2>&1 || true
}

phase_growth() {
    local dir=$OUT/growth port pid start mem=() rss=() r calls
    rm -rf "$dir"; mkdir -p "$dir"
    port=$(free_port)
    echo "--- growth: ${GROWTH_CALLS} calls per path per round, 3 rounds, no valgrind"
    start=$(now)
    "$SERVER_BIN" --port "$port" --bind 127.0.0.1 --loadmodule "$MODULE" --dir "$dir" \
        --save "" --appendonly no --logfile "$dir/server.log" \
        --latency-tracking no >"$dir/stdio.log" 2>&1 &
    # (Latency tracking off: its per-command histograms, freed by CONFIG
    # RESETSTAT and allocated again by the next call, would move used_memory.)
    pid=$!
    STARTED+=("$pid")
    wait_ping "$port" "$pid" 30
    redis-cli -p "$port" HSET g:corrupt tokens garbage last_refill 1 >/dev/null
    # Warm-up: allocator caches, dict tables, the reply buffers reach their steady size.
    GROWTH_CALLS=$(( GROWTH_CALLS / 10 )) growth_round "$port"
    redis-cli -p "$port" CONFIG RESETSTAT >/dev/null
    mem+=("$(info_field "$port" memory used_memory)")
    rss+=("$(info_field "$port" memory used_memory_rss)")
    for r in 1 2 3; do
        growth_round "$port"
        mem+=("$(info_field "$port" memory used_memory)")
        rss+=("$(info_field "$port" memory used_memory_rss)")
        echo "round $r: used_memory ${mem[$r]} (warm ${mem[0]}), rss ${rss[$r]} (warm ${rss[0]})"
    done
    redis-cli -p "$port" INFO commandstats | tr -d '\r' | grep -i "cmdstat_tb" | tee "$dir/commandstats.txt"
    calls=$(awk -F'[=,]' '{ s += $2 } END { print s + 0 }' "$dir/commandstats.txt")
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait "$pid" || true
    local expected=$(( (GROWTH_CALLS * 11 + GROWTH_CALLS / 20) * 3 ))
    local d1=$(( mem[1] - mem[0] )) d3=$(( mem[3] - mem[1] ))
    echo "growth: ${calls} module calls (expected ${expected}); used_memory warm->round1 ${d1} B, round1->round3 ${d3} B"
    # A leak of even 1 byte per call would add >= GROWTH_CALLS * 11 bytes per
    # round (and 7 bytes per abandoned waiter, as once, 35,000).
    local limit=$(( GROWTH_CALLS * 11 / 8 ))
    if (( calls < expected )); then
        failures+=("growth: only ${calls} of ${expected} calls reached the module")
    fi
    if (( d3 > limit || d3 < -limit || d1 > 4 * limit )); then
        failures+=("growth: used_memory moved by ${d1} B then ${d3} B over ${expected} calls")
    fi
    summary+=("growth: $(( $(now) - start )) s, ${calls} calls, used_memory ${mem[*]} B, rss ${rss[*]} B")
}

# ---------------------------------------------------------------------------
phase_asan() {
    local dir=$OUT/asan start rc runtime asan_target=$ROOT/target/asan args=() t
    rm -rf "$dir"; mkdir -p "$dir"
    runtime=$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.asan-x86_64.so 2>/dev/null | sort -V | tail -n1 || true)
    if [[ -z $runtime && $(id -u) == 0 ]] && command -v apt-get >/dev/null 2>&1; then
        echo "--- installing libclang-rt-14-dev (clang's ASan runtime)"
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libclang-rt-14-dev >/dev/null || true
        runtime=$(ls /usr/lib/llvm-*/lib/clang/*/lib/linux/libclang_rt.asan-x86_64.so 2>/dev/null | sort -V | tail -n1 || true)
    fi
    [[ -n $runtime ]] || { failures+=("asan: no libclang_rt.asan-x86_64.so (apt-get install libclang-rt-14-dev)"); return; }
    echo "--- asan: module built with -Zsanitizer=address, runtime $runtime"
    start=$(now)
    # --target keeps build scripts and proc macros uninstrumented.
    RUSTC_BOOTSTRAP=1 RUSTFLAGS="-Zsanitizer=address" \
        cargo build --release --target x86_64-unknown-linux-gnu --target-dir "$asan_target"
    local module=$asan_target/x86_64-unknown-linux-gnu/release/libredis_tb.so
    echo "asan build: $(( $(now) - start )) s"
    cat > "$dir/server.sh" <<EOF
#!/usr/bin/env bash
# redis-server with the ASan runtime preloaded (the module is instrumented, the server not).
export LD_PRELOAD=$runtime
# LeakSanitizer off: Redis frees little at exit by design; leaks are the valgrind phase's job.
export ASAN_OPTIONS=detect_leaks=0:abort_on_error=0:halt_on_error=1:log_path=$dir/asan
exec "$SERVER_BIN" "\$@"
EOF
    chmod +x "$dir/server.sh"
    args=(--test it)
    set +e
    TB_SERVER="$dir/server.sh" TB_MODULE="$module" \
        cargo test --release "${args[@]}" -- --test-threads="$THREADS" $TESTS > "$dir/cargo-test.log" 2>&1
    rc=$?
    set -e
    grep -E "^test result|FAILED|panicked" "$dir/cargo-test.log" | head -n 20 || true
    # The harness SIGKILLs its servers, so LeakSanitizer (which runs at exit)
    # gets one server of its own: the leak workload, then a clean SHUTDOWN.
    local port pid
    port=$(free_port)
    LD_PRELOAD=$runtime \
    ASAN_OPTIONS=detect_leaks=1:halt_on_error=1:log_path=$dir/lsan \
    LSAN_OPTIONS=suppressions=$ROOT/scripts/lsan.supp:print_suppressions=1 \
        "$SERVER_BIN" --port "$port" --bind 127.0.0.1 --loadmodule "$module" \
        --dir "$dir" --save "" --appendonly no --logfile "$dir/server.log" >"$dir/stdio.log" 2>&1 &
    pid=$!
    STARTED+=("$pid")
    wait_ping "$port" "$pid" 30
    workload_rounds "$port" "$dir"
    redis-cli -p "$port" SHUTDOWN NOSAVE >/dev/null 2>&1 || true
    wait "$pid" || true
    local leaks
    leaks=$(cat "$dir"/lsan.* 2>/dev/null | grep -cE "^(Direct|Indirect) leak" || true)
    echo "LeakSanitizer: ${leaks} unsuppressed leak records after ${LEAK_ROUNDS} rounds of the workload"
    if (( leaks > 0 )); then failures+=("asan: LeakSanitizer found ${leaks} leak records (see $dir/lsan.*)"); fi
    local reports
    reports=$(cat "$dir"/asan.* "$dir"/lsan.* 2>/dev/null | grep -c "ERROR: AddressSanitizer" || true)
    if (( rc != 0 )); then failures+=("asan: integration tests failed (see $dir/cargo-test.log)"); fi
    if (( reports > 0 )); then failures+=("asan: ${reports} AddressSanitizer reports (see $dir/asan.*)"); fi
    summary+=("asan: $(( $(now) - start )) s, tests exit ${rc}, ${reports} ASan reports, ${leaks} LSan leak records")
}

# ---------------------------------------------------------------------------
total_start=$(now)
phase_build
for phase in "${PHASES[@]}"; do
    case $phase in
        suite | leaks | growth | asan) "phase_$phase" ;;
        *) echo "sanitize.sh: unknown phase $phase (suite leaks growth asan)" >&2; exit 2 ;;
    esac
done

echo "--- sanitize summary ($(( $(now) - total_start )) s)"
printf '%s\n' "${summary[@]}"
if (( ${#failures[@]} )); then
    printf 'FAILED: %s\n' "${failures[@]}" >&2
    exit 1
fi
echo "sanitize: ok"

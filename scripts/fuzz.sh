#!/usr/bin/env bash
# Fuzzes redis-tb's pure code with libFuzzer (cargo-fuzz): argument parsing,
# stored-state decoding and the bucket arithmetic. See fuzz/README.md.
#
#   scripts/fuzz.sh [seconds-per-target]     (default 60; `make fuzz`)
#
# Env: FUZZ_TARGETS="parse_args arithmetic" to run a subset;
#      FUZZ_KEEP_GOING=1 to run the remaining targets after a crash.
#
# Builds the targets (overflow checks and debug assertions on), runs each for
# the given time starting from the committed seeds (fuzz/corpus/<target>/,
# never written to) plus a scratch corpus kept in .cache/fuzz/ between runs,
# and fails on the first crash, printing the failing input and its repro.
# Works on stable Rust: RUSTC_BOOTSTRAP=1 lets it accept cargo-fuzz's -Z flags.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
SECONDS_PER_TARGET=${1:-60}
TARGETS=${FUZZ_TARGETS:-parse_args decode_state arithmetic}
CACHE=$ROOT/.cache/fuzz

if ! [[ $SECONDS_PER_TARGET =~ ^[0-9]+$ ]] || (( SECONDS_PER_TARGET < 1 )); then
    echo "usage: scripts/fuzz.sh [seconds-per-target]" >&2
    exit 2
fi

if ! command -v cargo >/dev/null 2>&1 && [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
    # shellcheck disable=SC1091
    source "${CARGO_HOME:-$HOME/.cargo}/env"
fi
if ! cargo fuzz --version >/dev/null 2>&1; then
    echo "--- installing cargo-fuzz (once)"
    cargo install cargo-fuzz --locked
fi
# libFuzzer is C++, built by libfuzzer-sys.
if ! command -v c++ >/dev/null 2>&1; then
    echo "fuzz.sh: a C++ compiler is needed (apt-get install g++)" >&2
    exit 1
fi

export RUSTC_BOOTSTRAP=1
# No sanitizer: the fuzzed code is safe Rust with no unsafe block, so ASan
# would only halve the speed. Overflow checks come from cargo-fuzz's default
# build mode (-Cdebug-assertions -Coverflow-checks) and fuzz/Cargo.toml.
FUZZ=(cargo fuzz)
BUILD_FLAGS=(--sanitizer none)

cd "$ROOT/fuzz"
echo "--- build ($(cargo fuzz --version))"
start=$(date +%s)
"${FUZZ[@]}" build "${BUILD_FLAGS[@]}"
echo "build: $(( $(date +%s) - start )) s"

status=0
summary=()
for target in $TARGETS; do
    scratch=$CACHE/corpus/$target
    artifacts=$CACHE/artifacts/$target
    mkdir -p "$scratch" "$artifacts"
    log=$CACHE/$target.log
    echo "--- $target: ${SECONDS_PER_TARGET} s"
    # The scratch corpus comes first: libFuzzer writes new inputs only there.
    set +e
    "${FUZZ[@]}" run "${BUILD_FLAGS[@]}" "$target" "$scratch" "corpus/$target" -- \
        -max_total_time="$SECONDS_PER_TARGET" -timeout=10 -rss_limit_mb=2048 \
        -max_len=512 -print_final_stats=1 -artifact_prefix="$artifacts/" \
        >"$log" 2>&1
    rc=$?
    set -e
    execs=$(awk '/^stat::number_of_executed_units:/ { print $2 }' "$log" | tail -n1)
    cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -n1 | awk '{print $2}')
    corpus_size=$(find "$scratch" -type f | wc -l)
    if (( rc != 0 )); then
        status=1
        summary+=("$target: CRASH after ${execs:-?} execs (exit $rc)")
        echo "$target FAILED; log: $log"
        grep -E 'repro:|panicked at|^[a-z].*(overflow|assert)|ERROR: libFuzzer|Test unit written|Base64:' "$log" -A2 | head -n 40 || true
        if [[ ${FUZZ_KEEP_GOING:-0} != 1 ]]; then
            break
        fi
    else
        summary+=("$target: ok, ${execs:-?} execs in ${SECONDS_PER_TARGET} s, coverage ${cov:-?} edges, scratch corpus ${corpus_size} inputs")
    fi
done

echo "--- fuzz summary"
printf '%s\n' "${summary[@]}"
if (( status != 0 )); then
    echo "reproduce: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -s none <target> <artifact file>" >&2
fi
exit "$status"

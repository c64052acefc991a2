#!/usr/bin/env bash
# Runs the client examples' test suites (Rust, Python, Node), each against its
# own throwaway redis-server with the module. Every suite runs even if an
# earlier one failed; the exit status is non-zero if any failed.
#
#   examples/run-all.sh            builds the module (cargo build --release) first
#   TB_MODULE=/abs/path.so examples/run-all.sh    uses that module as it is
#
# Needs redis-server, cargo, python3 (with venv) and node >= 20 with npm; the
# first run installs from crates.io, PyPI and the npm registry, later runs use
# what is already installed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"

if [ -z "${TB_MODULE:-}" ]; then
    echo "== building the module (cargo build --release)"
    (cd "$here/.." && cargo build --release --quiet) || { echo "module build failed"; exit 1; }
    TB_MODULE="$here/../target/release/libredis_tb.so"
fi
TB_MODULE="$(realpath "$TB_MODULE")" || exit 1
export TB_MODULE

passed=0 failed=0 summary=()
for suite in rust python node; do
    echo
    echo "== $suite: examples/$suite/run-tests.sh"
    start=$SECONDS
    if "$here/$suite/run-tests.sh"; then
        result=PASS; passed=$((passed + 1))
    else
        result=FAIL; failed=$((failed + 1))
    fi
    summary+=("$(printf '%-7s %s (%ds)' "$suite" "$result" $((SECONDS - start)))")
    echo "== $suite: $result"
done

echo
echo "== client examples"
printf '   %s\n' "${summary[@]}"
echo "examples: $passed passed, $failed failed"
[ "$failed" -eq 0 ]

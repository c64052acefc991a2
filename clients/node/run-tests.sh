#!/usr/bin/env bash
# Tests of the Node client library (clients/node) against real servers:
#   - dev dependencies from package-lock.json (npm ci; skipped while the lock is unchanged),
#   - the module: TB_MODULE (absolute path; default <repo>/target/release/libredis_tb.so,
#     built with `cargo build --release` at the repository root if missing),
#   - the server: TB_SERVER (default redis-server on PATH),
#   - node --test over test/*.test.js: every API test on a server with the module and one
#     without (function and script backends), 3-master clusters with and without it,
#     fail-open (stopped, SIGSTOP), migration script -> module, Express/Fastify over HTTP,
#     npm install/pack of the package (the README's tarball install, then tsc --strict and
#     every js block of the README as written),
#     tsc on index.d.ts; the shared conformance suite (clients/conformance/cases.json) on
#     every backend and topology; without a server: clients/conformance/vectors/local.json (the
#     local limiter), behaviour.json, and lib/engine.js's decisions; against real servers:
#     restarts between calls, outages with the local limiter, the denial cache under a flood;
#   - the conformance suite again with the lowest ioredis declared (test/lowest: 5.0.0).
# Ends with node's summary (# tests/# pass/# fail ... lines, as .ci/run reads them) and
# "N passed, M failed"; exits non-zero on any failure.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$here"

export TB_SERVER=${TB_SERVER:-redis-server}
if ! command -v "$TB_SERVER" >/dev/null 2>&1; then
    echo "run-tests.sh: $TB_SERVER not found (bash $root/scripts/ensure-deps.sh installs redis-server)" >&2
    exit 1
fi
if [[ -z "${TB_MODULE:-}" ]]; then
    export TB_MODULE=$root/target/release/libredis_tb.so
    if [[ ! -f "$TB_MODULE" ]]; then
        echo "--- building the module (cargo build --release)"
        (cd "$root" && cargo build --release)
    fi
fi
if [[ ! -f "$TB_MODULE" ]]; then
    echo "run-tests.sh: TB_MODULE=$TB_MODULE does not exist" >&2
    exit 1
fi

# npm ci starts from a clean node_modules; skip it while the lock file is the one installed.
# Two installs: the dev dependencies (the newest ioredis, 6.0.0), and test/lowest, the lowest
# ioredis the package declares (peerDependencies: >=5, so 5.0.0).
for dir in . test/lowest; do
    if ! cmp -s "$dir/package-lock.json" "$dir/node_modules/.installed-package-lock.json" 2>/dev/null; then
        (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error)
        cp "$dir/package-lock.json" "$dir/node_modules/.installed-package-lock.json"
    fi
done

echo "--- node $(node --version), $("$TB_SERVER" --version | cut -d' ' -f1-3), module $TB_MODULE"
tap=$(mktemp)
tap_lowest=$(mktemp)
trap 'rm -f "$tap" "$tap_lowest"' EXIT
status=0
node --test --test-concurrency="${TB_TEST_FILES:-4}" --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=tap --test-reporter-destination="$tap" \
    "$@" test/*.test.js || status=$?
echo "--- the conformance suite again with the lowest declared ioredis"
TB_IOREDIS=$here/test/lowest/node_modules/ioredis \
    node --test --test-reporter=spec --test-reporter-destination=stdout \
    --test-reporter=tap --test-reporter-destination="$tap_lowest" \
    test/conformance.test.js || status=$?
cat "$tap_lowest" >>"$tap"
sum() { sed -n "s/^# $1 \\([0-9]*\\)\$/\\1/p" "$tap" | awk '{ s += $1 } END { print s + 0 }'; }
passed=$(sum pass)
failed=$(sum fail)
cancelled=$(sum cancelled)
failed=$(( ${failed:-0} + ${cancelled:-0} ))
# node's own summary lines of both runs (what .ci/run adds up), then one plain line.
grep -E '^# (tests|suites|pass|fail|cancelled|skipped|todo) [0-9]+$' "$tap" || true
echo "${passed:-0} passed, ${failed} failed"
if [[ $status -eq 0 && ( -z "$passed" || "$passed" -eq 0 || "$failed" -ne 0 ) ]]; then
    status=1
fi
exit $status

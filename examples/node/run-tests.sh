#!/usr/bin/env bash
# Installs the locked dependencies from the npm registry (npm ci) and runs the
# tests against a real redis-server with the module
# (TB_MODULE, default ../../target/release/libredis_tb.so).
set -euo pipefail
cd "$(dirname "$0")"
# npm ci starts from a clean node_modules; skip it when the lock file has not
# changed since the last install (npm records that in node_modules/.package-lock.json).
if ! cmp -s package-lock.json node_modules/.installed-package-lock.json 2>/dev/null; then
    npm ci --no-audit --no-fund --loglevel=error
    cp package-lock.json node_modules/.installed-package-lock.json
fi
exec node --test --test-reporter=spec "$@" test/*.test.js

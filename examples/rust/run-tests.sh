#!/usr/bin/env bash
# Unit tests, then the integration tests against a real redis-server with the
# module (TB_MODULE, default ../../target/release/libredis_tb.so).
set -euo pipefail
cd "$(dirname "$0")"
cargo test --quiet "$@"

#!/usr/bin/env bash
# redis-tb-client: format, lint, build, then every test against real servers
# (redis-server with and without the module, a 3-master cluster each way).
#
#   TB_MODULE  absolute path of the module (default <repo>/target/release/libredis_tb.so,
#              built with `cargo build --release` at the repository root if missing)
#   TB_SERVER  server binary (default redis-server on PATH)
#
# Exits non-zero on any failure; the last line is "N passed, M failed".
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$here"

export TB_MODULE="${TB_MODULE:-$root/target/release/libredis_tb.so}"
export TB_SERVER="${TB_SERVER:-redis-server}"
if [[ ! -f "$TB_MODULE" ]]; then
  echo "--- building the module: $TB_MODULE is missing"
  (cd "$root" && cargo build --release)
fi
TB_MODULE="$(realpath "$TB_MODULE")"
if ! command -v "$TB_SERVER" >/dev/null; then
  echo "no $TB_SERVER (try: bash $root/scripts/ensure-deps.sh)" >&2
  exit 1
fi

echo "--- cargo fmt --check"
cargo fmt --check
echo "--- cargo clippy -D warnings (all features, the library without them, and with metrics alone)"
cargo clippy --locked --all-targets --all-features -- -D warnings
cargo clippy --locked --lib --no-default-features -- -D warnings
cargo clippy --locked --lib --no-default-features --features metrics -- -D warnings
cargo build --locked --all-features
echo "--- the sync-only library (no features, or metrics alone) pulls in no tokio and no futures"
if cargo tree --locked -e normal --no-default-features --prefix none | grep -E '^(tokio|futures|opentelemetry)'; then
  echo "the default features depend on the crates above" >&2
  exit 1
fi
if cargo tree --locked -e normal --no-default-features --features metrics --prefix none | grep -E '^(tokio|futures)'; then
  echo "the feature metrics depends on the crates above" >&2
  exit 1
fi

# A fresh crate with a path dependency on this one, built in the same target
# dir: it must see lua/tb.lua byte for byte through the `lua` symlink, and
# its own `redis` dependency (the newest 1.x) must fit the limiter's types.
echo "--- path dependency from a fresh crate ships lua/tb.lua; its own redis fits"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/src"
cat >"$tmp/Cargo.toml" <<TOML
[package]
name = "redis-tb-client-pathdep-check"
version = "0.0.0"
edition = "2021"
publish = false
[workspace]
[dependencies]
redis-tb-client = { path = "$here", features = ["axum"] }
# A user's own redis 1.x (what cargo add redis picks; without its default
# features so that the copied lock has every crate): its types must fit.
redis = { version = "1", default-features = false }
# The README's quick start shows the library's warnings through env_logger.
env_logger = { version = "0.11", default-features = false }
TOML
cat >"$tmp/src/main.rs" <<'RS'
/// Compiled, not run: a user's own `redis` connections and clients fit.
#[allow(dead_code)]
fn fits(client: redis::Client) -> redis::RedisResult<redis_tb_client::RateLimiter<redis::Connection>> {
    let limiter = redis_tb_client::RateLimiter::new(client.get_connection()?);
    Ok(limiter.with_blocking_client(client))
}

fn main() {
    let path = std::env::args().nth(1).expect("path of lua/tb.lua");
    let repo = std::fs::read_to_string(&path).expect("read lua/tb.lua");
    assert_eq!(redis_tb_client::LUA_LIBRARY, repo, "the dependency's Lua text differs from {path}");
    println!("path dependency: {} bytes of lua/tb.lua, identical", repo.len());
}
RS
cp Cargo.lock "$tmp/Cargo.lock"
(cd "$tmp" && CARGO_TARGET_DIR="$here/target" cargo run --quiet --offline -- "$root/lua/tb.lua")

# The README's quick start, as written, in the same fresh crate, against a
# real server with the module (only the URL is changed to its port).
echo "--- README quick start runs as written"
port="$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
"$TB_SERVER" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$tmp" \
  --loadmodule "$TB_MODULE" --daemonize yes --pidfile "$tmp/quickstart.pid" --logfile "$tmp/quickstart.log"
trap 'kill "$(cat "$tmp/quickstart.pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$tmp"' EXIT
for _ in $(seq 50); do redis-cli -p "$port" ping >/dev/null 2>&1 && break; sleep 0.1; done
snippet="$(awk '/^## Quick start/ {on=1} on && /^```rust/ {code=1; next} code && /^```/ {exit} code {print}' README.md)"
{
  echo 'fn main() -> Result<(), Box<dyn std::error::Error>> {'
  printf '%s\n' "${snippet//redis:\/\/127.0.0.1\//redis://127.0.0.1:$port/}"
  echo '    Ok(())'
  echo '}'
} >"$tmp/src/main.rs"
out="$(cd "$tmp" && CARGO_TARGET_DIR="$here/target" cargo run --quiet --offline)"
echo "$out"
grep -q '^backend: Some(Module)' <<<"$out"
grep -q '^RateLimit: "default";r=19;t=1' <<<"$out"
kill "$(cat "$tmp/quickstart.pid")"

echo "--- cargo test (TB_MODULE=$TB_MODULE, TB_SERVER=$TB_SERVER)"
log="$tmp/test.log"
set +e
cargo test --locked --all-features --no-fail-fast -- --test-threads "${TB_TEST_THREADS:-8}" 2>&1 | tee "$log"
status=${PIPESTATUS[0]}

# The lowest redis version Cargo.toml allows ("1" -> 1.0.0), next to the
# newest in Cargo.lock: the same suite, in its own target dir; the lock is
# put back whatever happens.
lowest="$(sed -n 's/^redis = { version = "\([0-9]*\)".*/\1.0.0/p' Cargo.toml)"
echo "--- cargo test with the lowest declared redis ($lowest)"
cp Cargo.lock "$tmp/Cargo.lock.newest"
trap 'cp "$tmp/Cargo.lock.newest" "$here/Cargo.lock"; kill "$(cat "$tmp/quickstart.pid" 2>/dev/null)" 2>/dev/null || true; rm -rf "$tmp"' EXIT
cargo update --quiet -p redis --precise "$lowest"
CARGO_TARGET_DIR="$here/target/lowest" cargo test --locked --all-features --no-fail-fast -- --test-threads "${TB_TEST_THREADS:-8}" 2>&1 | tee -a "$log"
lowest_status=${PIPESTATUS[0]}
cp "$tmp/Cargo.lock.newest" Cargo.lock
((status == 0)) && status=$lowest_status
set -e
awk '/^test result:/ { p += $4; f += $6 } END { printf "%d passed, %d failed\n", p, f }' "$log"
exit "$status"

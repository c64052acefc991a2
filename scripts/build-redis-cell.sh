#!/usr/bin/env bash
# Build redis-cell 0.2.2 (CL.THROTTLE, https://crates.io/crates/redis-cell), the
# peer `make bench` races TB.TAKE against, outside the project tree.
#
# cargo fetches the crate's published source from crates.io through a
# throwaway project that depends on it (nothing of redis-cell enters this
# repository); the crate is then built in release mode from cargo's registry
# copy, in its own target directory under the cache, and the .so is copied to
#
#   ${REDIS_CELL_CACHE:-~/.cache/redis-tb-bench/redis-cell}/libredis_cell.so
#
# Idempotent: when that file exists and its stamp names the same version and
# rustc, nothing is fetched or built. On success prints the .so path on
# stdout; on failure prints why on stderr and exits non-zero (bench.sh then
# runs without the CL.THROTTLE rows).
set -euo pipefail

VERSION=0.2.2
CACHE="${REDIS_CELL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/redis-tb-bench/redis-cell}"
SO="$CACHE/libredis_cell.so"
STAMP="$CACHE/.stamp"

die() { echo "build-redis-cell: $*" >&2; exit 1; }

command -v cargo >/dev/null 2>&1 || die "cargo not found"
want_stamp="redis-cell $VERSION; $(rustc --version 2>/dev/null || echo 'rustc ?')"
if [[ -f "$SO" && -f "$STAMP" && "$(cat "$STAMP")" == "$want_stamp" ]]; then
    echo "$SO"
    exit 0
fi

mkdir -p "$CACHE"
fetcher="$CACHE/fetch"
mkdir -p "$fetcher/src"
cat >"$fetcher/Cargo.toml" <<EOF
[package]
name = "redis-cell-fetch"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
redis-cell = "=$VERSION"

[workspace]
EOF
echo "" >"$fetcher/src/lib.rs"
echo "build-redis-cell: cargo fetch redis-cell $VERSION" >&2
if ! (cd "$fetcher" && cargo fetch --quiet) >&2; then
    die "cargo fetch of redis-cell $VERSION failed (no network to crates.io?)"
fi

cargo_home="${CARGO_HOME:-$HOME/.cargo}"
src=""
for d in "$cargo_home"/registry/src/*/redis-cell-"$VERSION"; do
    [[ -f "$d/Cargo.toml" ]] && src="$d"
done
[[ -n "$src" ]] || die "redis-cell-$VERSION source not found under $cargo_home/registry/src"

# Build from a copy: cargo's registry sources are meant to stay read-only, and
# the crate has no Cargo.lock of its own (one is generated in the copy).
build="$CACHE/src"
rm -rf "$build"
cp -a "$src" "$build"
echo "build-redis-cell: cargo build --release in $build (warnings expected)" >&2
log="$CACHE/build.log"
if ! (cd "$build" && CARGO_TARGET_DIR="$CACHE/target" cargo build --release) >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    die "cargo build of redis-cell $VERSION failed (full log: $log)"
fi
built="$CACHE/target/release/libredis_cell.so"
[[ -f "$built" ]] || die "the build produced no $built"
cp "$built" "$SO.tmp"
mv "$SO.tmp" "$SO"
echo "$want_stamp" >"$STAMP"
echo "$SO"

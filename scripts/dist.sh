#!/usr/bin/env bash
# The module's release artifacts (`make dist`), written to DIST_DIR (default dist/):
#
#   redis-tb-<version>-linux-<arch>.tar.gz   redis-tb.so, redis-tb.conf, LICENSE, INSTALL,
#                                            SHA256SUMS, in one folder of the same name
#   redis-tb_<version>_<arch>.deb            the same module and snippet for Debian's
#                                            redis-server, built with dpkg-deb
#   redis_tb-<version>.tar.gz                the Python library's sdist (clients/python)
#   redis_tb-<version>-py3-none-any.whl      its wheel, built from that sdist
#   redis-tb-<version>.tgz                   the Node library (`npm pack` of clients/node)
#   redis-tb-core-<version>.crate            the module's pure core (core/), `cargo package`
#   redis-tb-client-<version>.crate          the Rust library (clients/rust), `cargo package`
#                                            verified against the core's .crate above
#   SHA256SUMS                               all of the above
#
# usage: scripts/dist.sh            build the artifacts
#        scripts/dist.sh --names    print the artifact names, one a line, build nothing
#                                   (tests/it/release.rs compares them with the version)
#
# The three libraries each hold a symlink to lua/tb.lua (the one copy). Each is built from a
# staged copy of its tracked files in a temporary directory, with the link replaced by the
# file's text, so every package carries the real tb.lua and nothing is written into the
# checkout. The Python build tools (build, setuptools, pinned in PY_TOOLS below) come from
# PyPI into a venv of dist's own, target/dist-tools, made on the first run; `cargo package`
# reads the crates.io index and the crates the client's Cargo.lock names.
#
# <version> is the root Cargo.toml's package version, the one place it is set.
# <arch> is Debian's name for the machine (dpkg --print-architecture: amd64, arm64),
# in both names, so the tarball and the .deb for one machine say the same thing.
#
# Environment:
#   TB_MODULE   the module to package (default target/release/libredis_tb.so, which
#               `make dist` builds first)
#   DIST_DIR    where to write (default dist/ at the repository root)
#   DEB_MAINTAINER  the .deb's Maintainer field
#   CRATE_TARGET_DIR  where `cargo package` builds the crates to verify them (default
#               clients/rust/target, so the client's dependencies are built once)
#
# The module's artifacts depend only on the module and the tracked files: file times are the
# last commit's (SOURCE_DATE_EPOCH), owners are root, and gzip writes no name or time. The
# wheel follows SOURCE_DATE_EPOCH too (setuptools' zip times), the sdist is packed again
# with it, and npm and cargo write fixed times of their own.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

# The version from Cargo's own reading of the manifest, not a pattern over its text.
VERSION="$(cargo metadata --no-deps --format-version 1 --manifest-path "$ROOT/Cargo.toml" \
    | python3 -c 'import json, sys
print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "redis-tb"))')"
ARCH="$(dpkg --print-architecture)"
TARBALL_BASE="redis-tb-$VERSION-linux-$ARCH"
# A pre-release (Cargo's 0.2.0-rc.1) must sort before its release, which in Debian takes
# a tilde (0.2.0~rc.1); a hyphen would be read as a Debian revision.
DEB_VERSION="${VERSION/-/\~}"
DEB="redis-tb_${DEB_VERSION}_$ARCH.deb"
# The names each packaging tool gives. Python normalizes the version (PEP 440: 0.2.0-rc.1 is
# 0.2.0rc1), which dist checks after the build rather than guess here.
SDIST="redis_tb-$VERSION.tar.gz"
WHEEL="redis_tb-$VERSION-py3-none-any.whl"
NPM_TGZ="redis-tb-$VERSION.tgz"
CORE_CRATE="redis-tb-core-$VERSION.crate"
CLIENT_CRATE="redis-tb-client-$VERSION.crate"
ARTIFACTS=("$TARBALL_BASE.tar.gz" "$DEB" "$SDIST" "$WHEEL" "$NPM_TGZ" "$CORE_CRATE" "$CLIENT_CRATE")

if [[ "${1:-}" == "--names" ]]; then
    printf '%s\n' "${ARTIFACTS[@]}"
    exit 0
elif [[ $# -gt 0 ]]; then
    echo "usage: $0 [--names]" >&2
    exit 2
fi

MODULE="${TB_MODULE:-$ROOT/target/release/libredis_tb.so}"
DIST_DIR="${DIST_DIR:-$ROOT/dist}"
MAINTAINER="${DEB_MAINTAINER:-redis-tb authors <redis-tb@invalid>}"
if [[ ! -f "$MODULE" ]]; then
    echo "dist: no module at $MODULE; build it first: cargo build --release (make dist does)" >&2
    exit 1
fi
for tool in objdump strip dpkg-deb sha256sum python3 npm git; do
    command -v "$tool" >/dev/null 2>&1 || {
        echo "dist: $tool not found (make deps installs it)" >&2
        exit 1
    }
done

# Set unless the caller chose one; a tree without git history gets a fixed date.
SOURCE_DATE_EPOCH="${SOURCE_DATE_EPOCH:-$(git -C "$ROOT" log -1 --format=%ct 2>/dev/null || echo 1767225600)}"
export SOURCE_DATE_EPOCH

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
umask 022

# Debian strips shipped libraries (policy 10.1); the symbols only name functions in a
# backtrace, and the module's panics are turned into error replies, not traces.
so="$work/redis-tb.so"
strip --strip-unneeded -o "$so" "$MODULE"
# Executable, unlike most shared libraries: Redis 7 refuses to load a module file without
# execute permission ("It does not have execute permissions").
chmod 0755 "$so"

# The glibc the module needs is the highest GLIBC_x.y version among the symbols it
# imports: the dynamic loader refuses the module on a glibc without that version.
GLIBC="$(objdump -T "$so" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/^GLIBC_//' | sort -uV | tail -n1)"
if [[ -z "$GLIBC" ]]; then
    echo "dist: found no GLIBC_ symbol version in $MODULE" >&2
    exit 1
fi

# MODULE LIST's ver: major * 10000 + minor * 100 + patch (src/server/load.rs).
IFS=. read -r major minor patch <<<"${VERSION%%-*}"
VER_NUMBER=$((10#$major * 10000 + 10#$minor * 100 + 10#$patch))

# Which common distributions' glibc is new enough, from the measured version, so INSTALL
# cannot go stale when the toolchain raises it.
distros=""
while IFS=: read -r distro distro_glibc; do
    if [[ "$(printf '%s\n%s\n' "$GLIBC" "$distro_glibc" | sort -V | head -n1)" == "$GLIBC" ]]; then
        verdict="loads"
    else
        verdict="too old"
    fi
    distros+="$(printf '      %-14s glibc %-5s %s' "$distro" "$distro_glibc" "$verdict")"$'\n'
done <<'EOF'
Debian 11:2.31
Debian 12:2.36
Debian 13:2.41
Ubuntu 20.04:2.31
Ubuntu 22.04:2.35
Ubuntu 24.04:2.39
RHEL 8:2.28
RHEL 9:2.34
EOF

touch_all() {
    find "$1" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
}

# -- the tarball ------------------------------------------------------------------
tree="$work/$TARBALL_BASE"
mkdir "$tree"
cp "$so" "$tree/redis-tb.so"
install -m 0644 "$ROOT/packaging/redis-tb.conf" "$tree/redis-tb.conf"
install -m 0644 "$ROOT/LICENSE" "$tree/LICENSE"
install_text="$(<"$ROOT/packaging/INSTALL.in")"
install_text="${install_text//@VERSION@/$VERSION}"
install_text="${install_text//@ARCH@/$ARCH}"
install_text="${install_text//@GLIBC@/$GLIBC}"
install_text="${install_text//@VER_NUMBER@/$VER_NUMBER}"
install_text="${install_text//@DISTROS@/${distros%$'\n'}}"
printf '%s\n' "$install_text" >"$tree/INSTALL"
(cd "$tree" && sha256sum redis-tb.so redis-tb.conf LICENSE INSTALL >SHA256SUMS)
touch_all "$tree"

# -- the .deb ---------------------------------------------------------------------
# Debian's own redis modules live in /usr/lib/redis/modules (redis-redisearch), and
# redis-server.service may map code from /usr/lib only. The snippet is under /etc, so it
# is a conffile: an admin's edits (load arguments) survive upgrades, and `dpkg -P`
# removes it.
stage="$work/deb"
install -d -m 0755 "$stage/DEBIAN" "$stage/usr/lib/redis/modules" "$stage/etc/redis/modules" \
    "$stage/usr/share/doc/redis-tb"
cp "$so" "$stage/usr/lib/redis/modules/redis-tb.so"
install -m 0644 "$ROOT/packaging/redis-tb.conf" "$stage/etc/redis/modules/redis-tb.conf"
gzip -9n <"$ROOT/CHANGELOG.md" >"$stage/usr/share/doc/redis-tb/changelog.gz"
# Debian's copyright file format (DEP-5), with the license text in full.
{
    echo "Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/"
    echo "Upstream-Name: redis-tb"
    echo
    echo "Files: *"
    echo "Copyright: 2026 the redis-tb authors"
    echo "License: MIT"
    sed -n '/^Permission is hereby granted/,$p' "$ROOT/LICENSE" | sed 's/^$/./; s/^/ /'
} >"$stage/usr/share/doc/redis-tb/copyright"
chmod 0644 "$stage/usr/share/doc/redis-tb/"*

echo /etc/redis/modules/redis-tb.conf >"$stage/DEBIAN/conffiles"
# For `dpkg --verify`; a conffile's sum is kept by dpkg itself, so /etc is not listed.
(cd "$stage" && find usr -type f -print0 | sort -z | xargs -0 md5sum) \
    >"$stage/DEBIAN/md5sums"
installed_kb="$(du -sk --exclude=DEBIAN "$stage" | cut -f1)"
# libc6 from the measured glibc; libgcc-s1 for libgcc_s.so.1 (the unwinder: the release
# profile unwinds panics into error replies). Every libgcc-s1 has the GCC_ versions used.
# Valkey is not in Debian 12, so the server is a recommendation, not a dependency.
cat >"$stage/DEBIAN/control" <<EOF
Package: redis-tb
Version: $DEB_VERSION
Architecture: $ARCH
Maintainer: $MAINTAINER
Installed-Size: $installed_kb
Depends: libc6 (>= $GLIBC), libgcc-s1
Recommends: redis-server (>= 5:7.0) | valkey-server
Section: database
Priority: optional
Description: token-bucket rate limiter module for Redis and Valkey
 TB.TAKE and its siblings keep a token bucket per key inside the server and
 decide on the server's clock; TB.ACQUIRE, TB.RELEASE and TB.RENEW cap how
 many things run at once with leases. Installs the module in
 /usr/lib/redis/modules and a snippet that loads it,
 /etc/redis/modules/redis-tb.conf, for redis.conf to include.
EOF
chmod 0644 "$stage/DEBIAN/control" "$stage/DEBIAN/conffiles" "$stage/DEBIAN/md5sums"
touch_all "$stage"

# -- the libraries ----------------------------------------------------------------
# stage_tracked DIR DEST: the tracked files of DIR (as in the work tree, edits included)
# copied to DEST with symlinks read through (cp -rL), so tb.lua arrives as text.
stage_tracked() {
    local dir="$1" dest="$2"
    mkdir -p "$dest"
    (cd "$ROOT/$dir" && git ls-files -z . | xargs -0 cp -rL --parents -t "$dest")
    touch_all "$dest"
}
libs="$work/libs"
mkdir "$libs"

# Python: `python -m build` makes the sdist, then the wheel from the unpacked sdist, so the
# sdist is proven to build. --no-isolation: the venv already holds the pinned setuptools,
# so a build downloads nothing and always uses the same tools.
PY_TOOLS=(build==1.6.1 setuptools==84.2.1 wheel==0.48.0)
tools="$ROOT/target/dist-tools"
if ! "$tools/bin/python" -m pip freeze 2>/dev/null | grep -qx "setuptools==84.2.1"; then
    rm -rf "$tools"
    python3 -m venv "$tools"
    "$tools/bin/python" -m pip install --quiet --disable-pip-version-check "${PY_TOOLS[@]}"
fi
stage_tracked clients/python "$work/python"
"$tools/bin/python" -m build --no-isolation --outdir "$libs" "$work/python" >"$work/python.log" 2>&1 || {
    cat "$work/python.log" >&2
    exit 1
}
# setuptools writes the sdist's PKG-INFO files with the time of the build, and gzip's header
# too; packed again like the module's tarball, the sdist depends on the sources only.
mkdir "$work/sdist"
tar -xzf "$libs/$SDIST" -C "$work/sdist"
touch_all "$work/sdist"
tar -C "$work/sdist" --sort=name --owner=0 --group=0 --numeric-owner \
    --mtime="@$SOURCE_DATE_EPOCH" -cf - "${SDIST%.tar.gz}" | gzip -9n >"$libs/$SDIST"

# Node: the staged copy holds dist/tb.lua (the text) and no tb.lua link, which is what the
# package's own prepack script leaves in a checkout (clients/node/scripts/pack-lua.js);
# its scripts are skipped, so the stage is packed as it is.
stage_tracked clients/node "$work/node"
mkdir -p "$work/node/dist"
rm "$work/node/tb.lua"
cp "$ROOT/lua/tb.lua" "$work/node/dist/tb.lua"
(cd "$work/node" && npm pack --ignore-scripts --silent --pack-destination "$libs" >/dev/null)

# Rust: core/ and clients/rust staged as one workspace, so `cargo package` packages both
# and verifies the client against the core's .crate (Cargo's local registry overlay for
# the crates it packages together) without publishing anything. The client's path to the
# core changes from ../../core to ../core there; its Cargo.lock becomes the workspace's (and
# gains the core's dev-dependencies, so not --locked).
crates="$work/crates"
stage_tracked core "$crates/core"
stage_tracked clients/rust "$crates/client"
sed -i 's|path = "../../core"|path = "../core"|; /^\[workspace\]$/d' "$crates/client/Cargo.toml"
cp "$crates/client/Cargo.lock" "$crates/Cargo.lock"
printf '[workspace]\nmembers = ["core", "client"]\nresolver = "2"\n' >"$crates/Cargo.toml"
crate_target="${CRATE_TARGET_DIR:-$ROOT/clients/rust/target}"
(cd "$crates" && cargo package --workspace --allow-dirty --quiet \
    --target-dir "$crate_target") || {
    echo "dist: cargo package failed" >&2
    exit 1
}
cp "$crate_target/package/$CORE_CRATE" "$crate_target/package/$CLIENT_CRATE" "$libs/"

for name in "$SDIST" "$WHEEL" "$NPM_TGZ" "$CORE_CRATE" "$CLIENT_CRATE"; do
    if [[ ! -f "$libs/$name" ]]; then
        echo "dist: the library build wrote no $name; it wrote: $(ls "$libs")" >&2
        exit 1
    fi
done

# -- out ----------------------------------------------------------------------------
mkdir -p "$DIST_DIR"
# Only this version's files: dist/ may hold another version's, which SHA256SUMS then omits.
for name in "${ARTIFACTS[@]}"; do
    rm -f "$DIST_DIR/$name"
done
rm -f "$DIST_DIR/SHA256SUMS"
tar -C "$work" --sort=name --owner=0 --group=0 --numeric-owner \
    --mtime="@$SOURCE_DATE_EPOCH" -cf - "$TARBALL_BASE" | gzip -9n >"$DIST_DIR/$TARBALL_BASE.tar.gz"
# --root-owner-group: files owned by root in the package without fakeroot, so the build
# works the same as a normal user.
dpkg-deb --root-owner-group --build "$stage" "$DIST_DIR/$DEB" >/dev/null
cp "$libs/"* "$DIST_DIR/"
(cd "$DIST_DIR" && sha256sum "${ARTIFACTS[@]}" >SHA256SUMS)

for name in "${ARTIFACTS[@]}" SHA256SUMS; do
    echo "dist: $DIST_DIR/$name"
done
echo "dist: the module needs glibc >= $GLIBC"

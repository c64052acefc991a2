#!/usr/bin/env bash
# `make test`: every check, as named steps, in this order.
#
#   scripts/test.sh [step ...]        (default: every step; `make test`)
#
#   paths        scripts/check-paths.py: the paths the docs and comments name exist;
#                scripts/check-map.py: the library map in docs/clients.md names what its files define
#   deps         scripts/ensure-deps.sh and scripts/fetch-servers.sh: tools, Valkey binaries
#   lint         rustfmt --check and clippy -D warnings (module, core, Rust client, fuzz)
#   build        the release module and the fault-injection build (target/fault)
#   rust         cargo test --workspace on Redis 7.0: the core's unit, property and vector
#                tests, the layer rules, and every integration test (tests/it)
#   valkey-8.1   the integration tests (tests/it) again on Valkey 8.1, the same .so (but for
#                the release checks, which `rust` runs)
#   valkey-9.1   and on Valkey 9.1
#   python       clients/python/run-tests.sh
#   node         clients/node/run-tests.sh
#   rust-client  clients/rust/run-tests.sh
#   fuzz         scripts/fuzz.sh, FUZZ_SECONDS (default 10) per target
#
# The integration tests spend their time waiting on servers (a run of the whole program uses
# about 16 s of CPU in 190 s), so they run TB_TEST_THREADS (default 8) at a time, not one per
# core: every wait in them is on a condition with a generous deadline, so a busier machine
# makes them slower, not red.
#
# A failing step does not stop the ones after it (but nothing runs after a failed `deps` or
# `build`, which every later step needs): one run shows every failure. Each step's output
# goes to the terminal and to .cache/test/<step>.log; the run ends with one line per step
# (ok or FAILED, and its time) and exits non-zero if any step failed.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
ROOT=$PWD
LOGS=$ROOT/.cache/test
ALL=(paths deps lint build rust valkey-8.1 valkey-9.1 python node rust-client fuzz)
# Steps after which nothing else can run.
NEEDED=" deps build "

if ! command -v cargo >/dev/null 2>&1 && [[ -f "${CARGO_HOME:-$HOME/.cargo}/env" ]]; then
    # shellcheck disable=SC1091
    source "${CARGO_HOME:-$HOME/.cargo}/env"
fi
export TB_MODULE=${TB_MODULE:-$ROOT/target/release/libredis_tb.so}
export TB_SERVER=${TB_SERVER:-redis-server}
export TB_TEST_THREADS=${TB_TEST_THREADS:-8}

step_paths() {
    python3 scripts/check-paths.py --self-test
    python3 scripts/check-paths.py
    python3 scripts/check-map.py --self-test
    python3 scripts/check-map.py
}

step_deps() {
    bash scripts/ensure-deps.sh
    bash scripts/fetch-servers.sh >/dev/null
}

step_lint() {
    cargo fmt --all -- --check
    # The Rust client and the fuzz targets are workspaces of their own, which --all does not reach.
    cargo fmt --manifest-path clients/rust/Cargo.toml -- --check
    cargo fmt --manifest-path fuzz/Cargo.toml -- --check
    cargo clippy --workspace --all-targets -- -D warnings
    cargo clippy --all-targets --features bench-floor -- -D warnings
}

# `cargo test` does not rebuild the crate's cdylib, so the module is built first or the
# integration tests would load a stale one. tests/it/server/write_failures.rs also needs the
# test-only fault-injection build, kept in its own target directory so it never replaces the
# module users run.
step_build() {
    cargo build --release
    cargo build --features fault-injection --target-dir target/fault
}

step_rust() {
    cargo test --workspace -- --test-threads "$TB_TEST_THREADS"
}

# The same .so, unchanged, in each Valkey (fetched by `deps`): the unit and property tests do
# not depend on the server, so only the integration program runs again, but for the release
# checks (tests/it/release.rs: the packages installed as a user would, minutes of pip, npm
# and cargo), which the `rust` step runs once. `--workspace` keeps the features of the
# `rust` step's build (the core's dev-dependencies unify some), so the program is not built
# again.
valkey() {
    local server=$ROOT/.cache/servers/valkey-$1/valkey-server
    echo "integration tests on $("$server" --version)"
    TB_SERVER=$server cargo test --workspace --test it -- --skip release:: \
        --test-threads "$TB_TEST_THREADS"
}
step_valkey-8.1() { valkey 8.1; }
step_valkey-9.1() { valkey 9.1; }

step_python() { bash clients/python/run-tests.sh; }
step_node() { bash clients/node/run-tests.sh; }
step_rust-client() { bash clients/rust/run-tests.sh; }
step_fuzz() { bash scripts/fuzz.sh "${FUZZ_SECONDS:-10}"; }

steps=("$@")
(( ${#steps[@]} )) || steps=("${ALL[@]}")
for step in "${steps[@]}"; do
    if ! declare -F "step_$step" >/dev/null; then
        echo "scripts/test.sh: no step '$step' (steps: ${ALL[*]})" >&2
        exit 2
    fi
done

mkdir -p "$LOGS"
results=()
failed=0
for step in "${steps[@]}"; do
    echo "=== step $step"
    start=$SECONDS
    set +e
    ( set -euo pipefail; "step_$step" ) 2>&1 | tee "$LOGS/$step.log"
    status=${PIPESTATUS[0]}
    set -e
    took=$(( SECONDS - start ))
    if (( status == 0 )); then
        results+=("$(printf '%-12s ok      %4ds' "$step" "$took")")
    else
        failed=1
        results+=("$(printf '%-12s FAILED  %4ds  (log: .cache/test/%s.log)' "$step" "$took" "$step")")
        if [[ $NEEDED == *" $step "* ]]; then
            results+=("(the steps after $step need it: not run)")
            break
        fi
    fi
done

echo "=== steps"
printf '%s\n' "${results[@]}"
exit "$failed"

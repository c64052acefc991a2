# shellcheck shell=bash
# What scripts/bench.sh and scripts/profile.sh share, sourced by both (not run
# on its own): both check the same way for the tools they need, and both time
# the module that cargo builds unless TB_MODULE names another.

# require_tools WHO HINT TOOL...: exits 1, saying "WHO: TOOL not found (HINT)",
# at the first TOOL not on PATH.
require_tools() {
    local who=$1 hint=$2 tool
    shift 2
    for tool in "$@"; do
        if ! command -v "$tool" >/dev/null 2>&1; then
            echo "$who: $tool not found ($hint)" >&2
            exit 1
        fi
    done
}

# Always through cargo when TB_MODULE is unset: it rebuilds only when a
# source changed, so the figures are never those of a stale build.
build_module() {
    if [[ -z "${TB_MODULE:-}" ]]; then
        cargo build --release --quiet
    fi
}

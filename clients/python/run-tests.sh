#!/usr/bin/env bash
# The Python client's tests against real servers: creates clients/python/.venv
# (once), installs requirements-test.txt from PyPI and the package from this
# checkout (a real, non-editable install), then runs pytest.
#   TB_SERVER  server binary (default: redis-server on PATH)
#   TB_MODULE  absolute path of the module (default: <repo>/target/release/libredis_tb.so,
#              built with `cargo build --release` at the repo root if missing)
# Extra arguments go to pytest (e.g. -k cluster). Exits non-zero on failure.
set -euo pipefail
cd "$(dirname "$0")"
HERE=$PWD
ROOT=$(cd ../.. && pwd)
PYTHON=${PYTHON:-python3}

if ! command -v "${TB_SERVER:-redis-server}" >/dev/null; then
    bash "$ROOT/scripts/ensure-deps.sh"
fi
if [ -z "${TB_MODULE:-}" ]; then
    export TB_MODULE=$ROOT/target/release/libredis_tb.so
    [ -f "$TB_MODULE" ] || (cd "$ROOT" && cargo build --release)
fi

# Debian's python3 lacks ensurepip until python3-venv is installed.
if [ ! -x .venv/bin/python ]; then
    rm -rf .venv
    if ! "$PYTHON" -m venv .venv 2>/dev/null; then
        rm -rf .venv
        apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
        "$PYTHON" -m venv .venv
    fi
fi
if ! cmp -s requirements-test.txt .venv/.installed-requirements; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements-test.txt
    cp requirements-test.txt .venv/.installed-requirements
fi
# The package itself, every run, from the checkout (not editable: what users get).
.venv/bin/python -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$HERE"

export PYTHONDONTWRITEBYTECODE=1 TB_PY_INSTALLED=1
# Run from tests/ so `import redis_tb` is the installed copy, not src/.
cd tests
exec ../.venv/bin/python -m pytest -p no:cacheprovider -c ../pyproject.toml --rootdir .. "$@"

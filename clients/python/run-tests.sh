#!/usr/bin/env bash
# The Python client's tests against real servers: creates clients/python/.venv
# and .venv-lowest (once), installs requirements-test.txt from PyPI and the package from this
# checkout (a real, non-editable install), then runs pytest.
#   TB_SERVER  server binary (default: redis-server on PATH)
#   TB_MODULE  absolute path of the module (default: <repo>/target/release/libredis_tb.so,
#              built with `cargo build --release` at the repo root if missing)
# The suite runs twice: with the newest redis-py (requirements-test.txt) and
# with the lowest that pyproject.toml allows (requirements-lowest.txt).
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
make_venv() {  # make_venv DIR REQUIREMENTS: DIR with REQUIREMENTS and this package installed
    local venv=$1 reqs=$2
    if [ ! -x "$venv/bin/python" ]; then
        rm -rf "$venv"
        if ! "$PYTHON" -m venv "$venv" 2>/dev/null; then
            rm -rf "$venv"
            apt-get update -qq && apt-get install -y -qq python3-venv >/dev/null
            "$PYTHON" -m venv "$venv"
        fi
    fi
    if ! cmp -s "$reqs" "$venv/.installed-requirements"; then
        "$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$reqs"
        cp "$reqs" "$venv/.installed-requirements"
    fi
    # The package itself, every run, from the checkout (not editable: what users get).
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$HERE"
    rm -rf "$HERE/build"
}
make_venv .venv requirements-test.txt
make_venv .venv-lowest requirements-lowest.txt

export PYTHONDONTWRITEBYTECODE=1 TB_PY_INSTALLED=1
# Run from tests/ so `import redis_tb` is the installed copy, not src/.
cd tests
# Four worker processes (pytest-xdist): the tests mostly wait on their own servers, each on
# a free port of its own, so they share nothing.
PYTEST=(-m pytest -p no:cacheprovider -c ../pyproject.toml --rootdir .. -n "${TB_TEST_FILES:-4}")
echo "== redis-py $(../.venv/bin/python -c 'import redis; print(redis.__version__)') (the newest pinned)"
../.venv/bin/python "${PYTEST[@]}" "$@"
# The lowest redis-py pyproject.toml allows: the same suite but for the
# packaging tests (they do not depend on redis-py's version).
echo "== redis-py $(../.venv-lowest/bin/python -c 'import redis; print(redis.__version__)') (the lowest allowed)"
../.venv-lowest/bin/python "${PYTEST[@]}" --ignore=test_package.py --ignore=test_readme.py "$@"

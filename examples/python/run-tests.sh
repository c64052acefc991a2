#!/usr/bin/env bash
# Creates examples/python/.venv (once), installs requirements.txt from PyPI,
# and runs the tests against a real redis-server with the module
# (TB_MODULE, default ../../target/release/libredis_tb.so).
set -euo pipefail
cd "$(dirname "$0")"
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
    "$PYTHON" -m venv .venv
fi
# Reinstall only when requirements.txt changed since the last install.
if ! cmp -s requirements.txt .venv/.installed-requirements; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
    cp requirements.txt .venv/.installed-requirements
fi
export PYTHONDONTWRITEBYTECODE=1
exec .venv/bin/python -m pytest -p no:cacheprovider "$@"

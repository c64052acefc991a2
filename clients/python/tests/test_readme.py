"""Every ```python block of README.md runs as written (each in a fresh
interpreter, from an empty directory), against a server with the module
and one without it, at REDIS_URL."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import REPO

README = (REPO / "clients" / "python" / "README.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```python\n(.*?)^```", README, re.M | re.S)


def test_the_readme_has_the_quick_starts():
    assert len(BLOCKS) >= 4 and "RateLimiter(client)" in BLOCKS[0]


@pytest.mark.parametrize("server", ["module_server", "plain_server"])
@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_a_readme_block_runs_as_written(request, server, index, tmp_path):
    server = request.getfixturevalue(server)
    env = dict(os.environ, REDIS_URL=f"redis://127.0.0.1:{server.port}")
    out = subprocess.run([sys.executable, "-c", BLOCKS[index]], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "Traceback" not in out.stderr

"""The package as installed from the checkout: the Lua text ships, the
versions agree, a wheel built from the checkout holds the text."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import redis_tb

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent
REPO = HERE.parents[2]
LUA = (REPO / "lua" / "tb.lua").read_text(encoding="utf-8")


def test_versions_agree():
    cargo = re.search(r'^version\s*=\s*"([^"]+)"', (REPO / "Cargo.toml").read_text(), re.M).group(1)
    pyproject = re.search(r'^version\s*=\s*"([^"]+)"', (PACKAGE / "pyproject.toml").read_text(), re.M).group(1)
    assert cargo == pyproject == redis_tb.__version__ == metadata.version("redis-tb")


def test_source_is_a_symlink_to_the_one_lua_file():
    link = PACKAGE / "src" / "redis_tb" / "tb.lua"
    assert link.is_symlink() and os.readlink(link) == "../../../../lua/tb.lua"


def test_installed_package_ships_the_text():
    installed = Path(redis_tb.__file__).resolve().parent
    if os.environ.get("TB_PY_INSTALLED") == "1":  # run-tests.sh: a real (non-editable) install
        assert "site-packages" in str(installed), installed
        assert not (installed / "tb.lua").is_symlink()
    assert redis_tb.lua_library() == LUA
    assert redis_tb.lua_script() == LUA.split("\n", 1)[1]
    assert redis_tb.lua_library().startswith("#!lua name=tb\n")


def test_wheel_from_the_checkout_holds_the_text(tmp_path):
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(tmp_path), str(PACKAGE)], check=True)
    wheel = next(tmp_path.glob("redis_tb-0.1.0-*.whl"))
    with zipfile.ZipFile(wheel) as z:
        assert z.read("redis_tb/tb.lua").decode() == LUA
        assert "redis_tb/py.typed" in z.namelist()


def test_fresh_venv_install(tmp_path):
    """pip install of the checkout into a new venv (build isolation, redis
    from PyPI), then import it there: the Lua text is in site-packages."""
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(PACKAGE)],
                   check=True)
    out = subprocess.run(
        [str(py), "-c", "import redis_tb, pathlib; f = pathlib.Path(redis_tb.__file__).parent / 'tb.lua';"
                        "print(f.is_symlink(), redis_tb.__file__); print(redis_tb.lua_library(), end='')"],
        check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    first, text = out.split("\n", 1)
    assert first.startswith("False ") and str(venv) in first and "site-packages" in first
    assert text == LUA


def test_the_wheel_installs_into_a_fresh_venv_and_limits(tmp_path, module_server):
    """pip install of the wheel alone (redis from PyPI), used from an empty
    directory against a real server."""
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                    "--disable-pip-version-check", "-w", str(tmp_path / "dist"), str(PACKAGE)], check=True)
    wheel = next((tmp_path / "dist").glob("redis_tb-0.1.0-*.whl"))
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    py = venv / "bin" / "python"
    subprocess.run([str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", str(wheel)], check=True)
    module_server.client().flushall()
    code = ("import redis, redis_tb; lim = redis_tb.RateLimiter(redis.Redis(port=%d));"
            "print(lim.take('w', 5, 1).remaining, lim.backend)" % module_server.port)
    out = subprocess.run([str(py), "-c", code], check=True, capture_output=True, text=True, cwd=tmp_path / "dist")
    assert out.stdout.split() == ["4", "module"]

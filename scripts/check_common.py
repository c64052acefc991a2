"""What scripts/check-paths.py and scripts/check-map.py share: where the
repository is, and how a check reports what it found."""

from __future__ import annotations

import os
import subprocess


def repository_root() -> str:
    """The top of the git checkout these scripts are in."""
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run(
        ["git", "-C", here, "rev-parse", "--show-toplevel"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()


def report(problems: list[str], failed: str, passed: str) -> int:
    """Prints each problem, then `failed` if there is one, else `passed`: the exit status."""
    for p in problems:
        print(p)
    print(failed if problems else passed)
    return 1 if problems else 0

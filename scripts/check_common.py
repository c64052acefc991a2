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


def report(problems: list[str], checked: int, failed: str, passed: str) -> int:
    """Prints each problem, then the summary, `failed` if there is one, else
    `passed` (templates of `{problems}` and `{checked}`, the counts): the
    exit status."""
    for p in problems:
        print(p)
    summary = failed if problems else passed
    print(summary.format(problems=len(problems), checked=checked))
    return 1 if problems else 0

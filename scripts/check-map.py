#!/usr/bin/env python3
"""Fail when the library map in docs/clients.md names something its files do not define.

usage: python3 scripts/check-map.py [--root DIR]
       python3 scripts/check-map.py --self-test

The map is the table under the heading "## The same map in every library":
columns concept | Python | Node | Rust | file. The file cell holds one part
per language, in that order, split by `<br>`; each part lists that
language's files in backticks (or `-`: none). Every name in backticks in a
language's cell must be defined in one of that language's files of the same
row. Of a dotted name (`Decision.headers`, `RateLimiter#waitTake`,
`Exchange::resend`, `limiter_methods!`) only the last part is looked for.
What counts as a definition:

  Python  def / async def / class NAME, or NAME = ... (self.NAME too)
  Node    function / class / const / let / var NAME, or a method: a line
          that starts with NAME( and does not end with `;` (a call)
  Rust    fn / struct / enum / trait / type / const / static / mod NAME,
          or macro_rules! NAME

A ticked file name (`errors.js`) is a reference, not a name. Words outside
backticks are prose and not checked. Output: one line per
name not found (`docs/clients.md:LINE: Python names 'X', not defined in
clients/python/...`), then a count and exit 1; or one OK line and exit 0.
"""

from __future__ import annotations

import os
import re
import sys
import tempfile

import check_common

# What the check says when it finds problems, and when it finds none.
FAILED = "check-map: {problems} problem(s), {checked} names checked"
PASSED = "check-map: OK, the {checked} names of the library map are defined where it says"

MAP_FILE = "docs/clients.md"
HEADING = "## The same map in every library"
LANGUAGES = ("Python", "Node", "Rust")

DEFINITIONS = {
    "Python": [
        r"^\s*(?:async\s+)?(?:def|class)\s+{name}\b",
        r"^\s*(?:self\.)?{name}\s*(?::[^=\n]*)?=(?!=)",
    ],
    "Node": [
        r"\b(?:function\*?|class|const|let|var)\s+{name}\b",
        r"^\s*(?:static\s+)?(?:async\s+)?{name}\s*\((?![^\n]*;\s*$)",
    ],
    "Rust": [
        r"\b(?:fn|struct|enum|trait|type|const|static|mod)\s+{name}\b",
        r"\bmacro_rules!\s*{name}\b",
    ],
}

TICKED = re.compile(r"`([^`]+)`")
FILE_NAME = re.compile(r"\.(?:py|js|rs)$")


def table_rows(text: str):
    """(line number, [cells]) for each body row of the map's table."""
    lines = text.split("\n")
    try:
        start = lines.index(HEADING)
    except ValueError:
        return None
    rows, seen_table = [], False
    for number, line in enumerate(lines[start + 1 :], start + 2):
        if line.startswith("## "):
            break
        if not line.startswith("|"):
            if seen_table:
                break
            continue
        seen_table = True
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if cells[0] == "concept" or set(cells[0]) <= set("-: "):
            continue  # the header and its rule
        rows.append((number, cells))
    return rows


def names(cell: str) -> list[str]:
    """The names a language's cell gives: the last part of each ticked word."""
    out = []
    for ticked in TICKED.findall(cell):
        if FILE_NAME.search(ticked):
            continue
        name = re.split(r"\.|#|::", ticked.strip())[-1].rstrip("!").removesuffix("()")
        if name and name != "-":
            out.append(name)
    return out


def defined(language: str, name: str, texts: list[str]) -> bool:
    patterns = [re.compile(p.format(name=re.escape(name)), re.M) for p in DEFINITIONS[language]]
    return any(p.search(text) for p in patterns for text in texts)


def check(root: str) -> tuple[list[str], int]:
    """(problems, number of names checked) for the repository at `root`."""
    path = os.path.join(root, MAP_FILE)
    with open(path, encoding="utf-8") as f:
        rows = table_rows(f.read())
    if not rows:
        return [f"{MAP_FILE}:1: no table under '{HEADING}'"], 0
    problems, checked = [], 0
    for number, cells in rows:
        if len(cells) != 2 + len(LANGUAGES):
            problems.append(f"{MAP_FILE}:{number}: {len(cells)} cells, not {2 + len(LANGUAGES)}")
            continue
        parts = cells[-1].split("<br>")
        if len(parts) != len(LANGUAGES):
            problems.append(f"{MAP_FILE}:{number}: the file cell has {len(parts)} parts, not {len(LANGUAGES)}")
            continue
        for language, cell, part in zip(LANGUAGES, cells[1:-1], parts):
            files = [p for p in TICKED.findall(part) if p != "-"]
            texts = []
            for name in files:
                try:
                    with open(os.path.join(root, name), encoding="utf-8") as f:
                        texts.append(f.read())
                except OSError:
                    problems.append(f"{MAP_FILE}:{number}: {language} file '{name}' does not exist")
            for name in names(cell):
                checked += 1
                if not defined(language, name, texts):
                    where = ", ".join(files) or "no file"
                    problems.append(f"{MAP_FILE}:{number}: {language} names '{name}', not defined in {where}")
    return problems, checked


# ---------------------------------------------------------- the self-test

# A map with one true name per language and one of each kind of mistake.
SELF_TEST_FILES = {
    MAP_FILE: f"""# Clients

{HEADING}

| concept | Python | Node | Rust | file |
|---|---|---|---|---|
| good | `Limiter.take`, `MAX` | `Limiter#take`, `helper` | `Limiter::take`, `rules!`, `Kind` | `py/a.py`<br>`js/a.js`<br>`rs/a.rs`, `rs/b.rs` |
| renamed | `OldName` (prose is not read) | `called` (see `b.js`) | - | `py/a.py`<br>`js/a.js`<br>- |
| wrong file | `Limiter` | `Limiter` | `Limiter` | `py/b.py`<br>`js/gone.js`<br>`rs/b.rs` |

## Next
| not | the | map | | |
""",
    "py/a.py": "MAX = 3\n\nclass Limiter:\n    def take(self):\n        pass\n",
    "py/b.py": "limiter = None\n",
    "js/a.js": "class Limiter {\n  async take(n,\n    m) {\n  }\n}\nconst helper = 1;\ncalled(1);\n",
    "rs/a.rs": "pub struct Limiter;\nimpl Limiter {\n    pub fn take(&self) {}\n}\n",
    "rs/b.rs": "macro_rules! rules { () => {} }\npub(crate) enum Kind {}\n",
}

SELF_TEST_PROBLEMS = {
    f"{MAP_FILE}:8: Python names 'OldName', not defined in py/a.py",
    f"{MAP_FILE}:8: Node names 'called', not defined in js/a.js",
    f"{MAP_FILE}:9: Python names 'Limiter', not defined in py/b.py",
    f"{MAP_FILE}:9: Node file 'js/gone.js' does not exist",
    f"{MAP_FILE}:9: Node names 'Limiter', not defined in js/gone.js",
    f"{MAP_FILE}:9: Rust names 'Limiter', not defined in rs/b.rs",
}


def self_test() -> int:
    with tempfile.TemporaryDirectory() as root:
        for name, text in SELF_TEST_FILES.items():
            os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
            with open(os.path.join(root, name), "w", encoding="utf-8") as f:
                f.write(text)
        problems, checked = check(root)
    failures = [f"not caught: {p}" for p in sorted(SELF_TEST_PROBLEMS - set(problems))]
    failures += [f"caught, but good: {p}" for p in sorted(set(problems) - SELF_TEST_PROBLEMS)]
    for failure in failures:
        print(f"check-map self-test: {failure}")
    if failures:
        return 1
    print(f"check-map self-test: OK, caught the {len(SELF_TEST_PROBLEMS)} mistakes among {checked} names")
    return 0


def main(argv: list[str]) -> int:
    if argv == ["--self-test"]:
        return self_test()
    if argv[:1] == ["--root"] and len(argv) == 2:
        root = argv[1]
    elif argv:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    else:
        root = check_common.repository_root()
    problems, checked = check(root)
    return check_common.report(problems, checked, FAILED, PASSED)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

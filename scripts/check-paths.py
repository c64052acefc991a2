#!/usr/bin/env python3
"""Fail when the docs or a source comment name a repository path that does not exist.

usage: python3 scripts/check-paths.py [--root DIR] [--list]
       python3 scripts/check-paths.py --self-test

What is read (files git knows: tracked, or new and not ignored; symlinks are
not read, their targets are):
  - every .md file outside bench/ (bench's pages are tables the bench scripts
    generate) and every Cargo.toml: the whole text;
  - in .rs, .js, .ts files the `//` and `/* */` comments, in .py and .sh files
    the `#` comments, in .lua files the `--` and `--[[ ]]` comments; string
    literals and code are not read. Lock files, JSON, node_modules/, target/
    and .cache/ are never read.

What is a mention: a run of path characters (letters, digits, `_ . - / ~ @ +`
and the template marks `< > { } * $`) that names a .rs .py .js .ts .lua .md
.sh .toml file, or a folder (ends in `/`, e.g. `src/wait/`, and has a segment
with a lower-case letter: `HTTP/` or `429/` are prose). A Markdown link
`[x](docs/a.md#anchor)` is a mention of `docs/a.md`. Not mentions: URLs
(`http:`, `https:`, anything with `://`), absolute paths (`/usr/...`),
`~/...`, templates and globs (`<`, `>`, `{`, `}`, `*`, `$`, a `...`
segment), the placeholder `path/to/...`, build output and installs (a
`target`, `.cache`, `.venv*`, `node_modules`, `dist` or `__pycache__`
segment), and the names in NOT_PATHS below.

When a mention is true:
  - with a slash: it exists relative to the directory of the file that names
    it or to any directory above it, up to the repository root, or to the
    `src/` folder of any of those (a package's module paths, e.g.
    `redis_tb/asgi.py` in clients/python/README.md); `..` may not leave the
    repository;
  - without a slash (`bucket.rs`): some file of that name exists anywhere.

The layout map: MAP_FILE's code block just below the line LAYOUT_MARKER must
name every .rs file under src/ and core/src/: either the file itself or a
folder that holds it (`src/wait/`), as the first word of a line (the left
column). `src/` or `core/src/` alone covers nothing.

Output: one line per stale mention (`file:line: names 'path', which does not
exist`) and per file the map leaves out, then a count and exit 1; or one OK
line and exit 0. `--list` also prints every mention and what it resolved to.
`--self-test` checks the checker on a throwaway git repository.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

import check_common

# What the check says when it finds problems, and when it finds none.
FAILED = "check-paths: {problems} stale mention(s) or map gap(s), {checked} mentions checked"
PASSED = "check-paths: OK, {checked} path mentions checked, the layout map names every src/ file"

LAYOUT_MARKER = "<!-- layout map: checked by scripts/check-paths.py -->"
# Where the map of src/ and core/src/ is: the README links to it.
MAP_FILE = "docs/development.md"

FILE_EXTENSIONS = ("rs", "py", "js", "ts", "lua", "md", "sh", "toml")

# Words that look like file names but name something else. Keep it short;
# every entry says why it is not a path.
NOT_PATHS = {
    "Node.js": "the JavaScript runtime's name",
}

# A folder segment that is build output or an install, never tracked.
BUILD_OUTPUT = re.compile(r"^(target|\.cache|\.venv.*|node_modules|dist|__pycache__)$")

# The comment syntax of each source language (see extract_comments).
SOURCE_LANGUAGES = {
    ".rs": "rust",
    ".js": "js",
    ".ts": "js",
    ".py": "hash",
    ".sh": "shell",
    ".lua": "lua",
}

URL = re.compile(r"(?:\b[A-Za-z][A-Za-z0-9+.-]*://|\bhttps?:|\bmailto:)\S*")
TOKEN = re.compile(r"[A-Za-z0-9_.~/@+<>{}*$-]+")
FILE_NAME = re.compile(r"\.(?:" + "|".join(FILE_EXTENSIONS) + r")$")
FOLDER = re.compile(r"^(?:\.{1,2}/)*[A-Za-z0-9_.@+-]+(?:/[A-Za-z0-9_.@+-]+)*/$")
TEMPLATE = re.compile(r"[<>{}*$]")
# What may follow a folder name: the end of the word.
FOLDER_END = re.compile(r"$|[\s`'\")\]>,.;:!?]")


# ---------------------------------------------------------------- the files


def git_files(root: str) -> tuple[list[str], set[str]]:
    """Files git knows (tracked, or new and not ignored) that exist, and symlinks among them."""
    out = subprocess.run(
        ["git", "-C", root, "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout.decode()
    files, links = [], set()
    for name in sorted(set(filter(None, out.split("\0")))):
        full = os.path.join(root, name)
        if os.path.islink(full):
            links.add(name)
            files.append(name)
        elif os.path.isfile(full):
            files.append(name)
    return files, links


class Tree:
    """What exists: the files git knows, their folders, and symlinks into the repository."""

    def __init__(self, root: str, files: list[str]):
        self.root = os.path.realpath(root)
        self.paths: set[str] = set()
        self.names: set[str] = set()
        for name in files:
            self.paths.add(name)
            self.names.add(os.path.basename(name))
            parent = os.path.dirname(name)
            while parent:
                self.paths.add(parent)
                parent = os.path.dirname(parent)

    def exists(self, rel: str) -> bool:
        rel = os.path.normpath(rel)
        if rel == ".":
            return True
        if rel == ".." or rel.startswith("../"):
            return False  # outside the repository
        if rel in self.paths:
            return True
        # Through a symlink (clients/rust/lua -> ../../lua): where it really is.
        real = os.path.realpath(os.path.join(self.root, rel))
        if real != os.path.join(self.root, rel) and real.startswith(self.root + os.sep):
            return os.path.relpath(real, self.root) in self.paths
        return False


def documents(files: list[str], links: set[str]) -> list[tuple[str, str]]:
    """(path, how to read it) for every file whose text or comments are checked."""
    out = []
    for name in files:
        if name in links:
            continue
        parts = name.split("/")
        if any(BUILD_OUTPUT.match(p) or p == "vendor" for p in parts[:-1]):
            continue
        base = parts[-1]
        ext = os.path.splitext(base)[1]
        if ext == ".md":
            if not (parts[0] == "bench" and "results" in name):  # tables `make bench` writes
                out.append((name, "text"))
        elif base == "Cargo.toml":
            out.append((name, "text"))
        elif ext in SOURCE_LANGUAGES and not base.endswith(".min.js"):
            out.append((name, SOURCE_LANGUAGES[ext]))
    return out


# ---------------------------------------------------------- the comments
#
# Each reader returns the text with everything that is not comment text
# replaced by spaces (newlines kept), so line numbers stay true and a token
# never joins code to comment.


_NOT_NEWLINE = re.compile(r"[^\n]+")


def _keep(text: str, spans: list[tuple[int, int]]) -> str:
    out, last = [], 0
    for start, end in spans:
        out.append(_NOT_NEWLINE.sub(lambda m: " " * len(m.group(0)), text[last:start]))
        out.append(text[start:end])
        last = end
    out.append(_NOT_NEWLINE.sub(lambda m: " " * len(m.group(0)), text[last:]))
    return "".join(out)


# The rest of a quoted string, backslash escapes included: one-line ones end
# at the end of the line if unterminated, the others may span lines.
_REST = {
    "'": re.compile(r"(?:[^'\\\n]|\\.)*'?"),
    '"': re.compile(r'(?:[^"\\\n]|\\.)*"?'),
    '"\n': re.compile(r'(?:[^"\\]|\\.)*"?', re.S),
    "`": re.compile(r"(?:[^`\\]|\\.)*`?", re.S),
    "'''": re.compile(r"(?:[^\\]|\\.)*?(?:'''|$)", re.S),
    '"""': re.compile(r'(?:[^\\]|\\.)*?(?:"""|$)', re.S),
}


def _skip_quoted(s: str, i: int, quote: str, multiline: bool = False) -> int:
    """Index just past the string that opens at s[i] with `quote`."""
    key = quote + "\n" if multiline and quote == '"' else quote
    return _REST[key].match(s, i + len(quote)).end()


def _line_end(s: str, i: int) -> int:
    j = s.find("\n", i)
    return len(s) if j < 0 else j


def _line_comment(s: str, spans: list, i: int, opener: int, marks: str) -> int:
    """Records the comment that opens at s[i] with `opener` characters and runs to the end
    of the line: the index of that end."""
    j = _line_end(s, i)
    spans.append(_comment_body(s, i + opener, j, marks))
    return j


def _past(s: str, close: str, start: int) -> int:
    """Index just past the first `close` from `start`, or the end of `s` if there is none."""
    j = s.find(close, start)
    return len(s) if j < 0 else j + len(close)


def _comment_body(s: str, start: int, end: int, marks: str) -> tuple[int, int]:
    """Drop the extra marker characters a doc comment opens with (`///`, `//!`, `/**`, `##`)."""
    while start < end and s[start] in marks:
        start += 1
    return start, end


_RUST_NEXT = re.compile(r"//|/\*|\"|'|(?<![A-Za-z0-9_])(?:b|c)?r(#*)\"")
_RUST_CHAR = re.compile(r"'(?:\\(?:x[0-9a-fA-F]{2}|u\{[0-9a-fA-F]{1,6}\}|.)|[^\\'\n])'")
_RUST_BLOCK = re.compile(r"/\*|\*/")


def rust_comments(s: str) -> str:
    spans, i, n = [], 0, len(s)
    while m := _RUST_NEXT.search(s, i):
        i, tok = m.start(), m.group(0)
        if tok == "//":
            i = _line_comment(s, spans, i, 2, "/!")
        elif tok == "/*":  # block comments nest
            depth, j = 1, i + 2
            while depth and (b := _RUST_BLOCK.search(s, j)):
                depth += 1 if b.group(0) == "/*" else -1
                j = b.end()
            if depth:
                j = n
            spans.append(_comment_body(s, i + 2, j - 2 if not depth else j, "*!"))
            i = j
        elif tok == '"':
            i = _skip_quoted(s, i, '"', multiline=True)
        elif tok == "'":
            c = _RUST_CHAR.match(s, i)
            i = c.end() if c else i + 1  # else a lifetime or a label
        else:  # a raw string: r"...", r#"..."#, br"..."
            close = '"' + m.group(1)
            i = _past(s, close, m.end())
    return _keep(s, spans)


_PY_NEXT = re.compile(r"#|(?<![A-Za-z0-9_])[rbfuRBFU]{0,2}('''|\"\"\"|'|\")")


def hash_comments(s: str) -> str:
    """Python: `#` to the end of the line, outside strings (docstrings are strings)."""
    spans, i = [], 0
    while m := _PY_NEXT.search(s, i):
        i = m.start()
        if m.group(0) == "#":
            i = _line_comment(s, spans, i, 1, "#!")
        else:
            i = _skip_quoted(s, m.start(1), m.group(1))
    return _keep(s, spans)


_SHELL_NEXT = re.compile(r"[\n\\'\"#]|<<(?!<)")
_HEREDOC = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")


def shell_comments(s: str) -> str:
    """Shell: `#` that starts a word, outside quotes and here-documents."""
    spans, i, n = [], 0, len(s)
    heredocs: list[str] = []
    while m := _SHELL_NEXT.search(s, i):
        i, c = m.start(), m.group(0)
        if c == "\n":
            i += 1
            for word in heredocs:  # skip each body, up to its terminator line
                while i < n:
                    j = _line_end(s, i)
                    line, i = s[i:j], j + 1
                    if line.strip() == word:
                        break
            heredocs = []
        elif c == "\\":
            i += 2
        elif c == "'":
            j = s.find("'", i + 1)
            i = n if j < 0 else j + 1
        elif c == '"':
            i = _skip_quoted(s, i, '"', multiline=True)
        elif c == "#":
            if i == 0 or s[i - 1] in " \t\n;&|(":
                i = _line_comment(s, spans, i, 1, "#!")
            else:
                i += 1  # `$#`, `${#x}`, `a#b`
        else:
            h = _HEREDOC.match(s, i)
            if h:
                heredocs.append(h.group(2))
                i = h.end()
            else:
                i += 2
    return _keep(s, spans)


_JS_NEXT = re.compile(r"//|/\*|['\"`{}/]")
_JS_REGEX_BEFORE = set("(,=:[!&|?{};+-*%<>~^")
_JS_REGEX_WORDS = {
    "return", "typeof", "case", "do", "else", "in", "of", "new", "delete", "void", "throw", "yield", "await"
}
_JS_TEMPLATE = re.compile(r"(?:[^`\\$]|\\.|\$(?!\{))*", re.S)
_JS_REGEX = re.compile(r"(?:[^/\\\[\n]|\\.|\[(?:[^\]\\\n]|\\.)*\]?)*/?")


def js_comments(s: str) -> str:
    """JavaScript/TypeScript: `//` and `/* */`, outside strings, templates and regexes."""
    spans, i, n = [], 0, len(s)
    braces: list[int] = []  # for each open `${`, the brace depth it opened at
    depth = 0
    while m := _JS_NEXT.search(s, i):
        i, c = m.start(), m.group(0)
        if c == "//":
            i = _line_comment(s, spans, i, 2, "/")
        elif c == "/*":
            j = s.find("*/", i + 2)
            j = n if j < 0 else j
            spans.append(_comment_body(s, i + 2, j, "*"))
            i = j + 2
        elif c in "'\"":
            i = _skip_quoted(s, i, c)
        elif c == "`" or (c == "}" and braces and braces[-1] == depth):
            if c == "}":
                braces.pop()
            i = _JS_TEMPLATE.match(s, i + 1).end()  # template text, up to its end or a `${`
            if s.startswith("${", i):
                braces.append(depth)
                i += 2
            else:
                i += 1
        elif c == "{":
            depth += 1
            i += 1
        elif c == "}":
            depth -= 1
            i += 1
        elif _js_regex_allowed(s, i):  # c == "/"
            i = _JS_REGEX.match(s, i + 1).end()
        else:
            i += 1
    return _keep(s, spans)


def _js_regex_allowed(s: str, i: int) -> bool:
    j = i - 1
    while j >= 0 and s[j] in " \t\r\n":
        j -= 1
    if j < 0 or s[j] in _JS_REGEX_BEFORE:
        return True
    k = j
    while k >= 0 and _IDENT.match(s[k]):
        k -= 1
    return s[k + 1 : j + 1] in _JS_REGEX_WORDS


_IDENT = re.compile(r"[A-Za-z0-9_$]")
_LUA_NEXT = re.compile(r"--|['\"]|\[=*\[")
_LUA_LONG = re.compile(r"\[(=*)\[")


def lua_comments(s: str) -> str:
    """Lua: `--` to the end of the line and `--[[ ]]`, outside strings and long strings."""
    spans, i, n = [], 0, len(s)
    while m := _LUA_NEXT.search(s, i):
        i, c = m.start(), m.group(0)
        if c == "--":
            long = _LUA_LONG.match(s, i + 2)
            if long:
                close = "]" + long.group(1) + "]"
                j = s.find(close, long.end())
                j = n if j < 0 else j
                spans.append((long.end(), j))
                i = j + len(close)
            else:
                i = _line_comment(s, spans, i, 2, "-")
        elif c in "'\"":
            i = _skip_quoted(s, i, c)
        else:  # a long string [[ ]], [==[ ]==]
            close = "]" + m.group(0)[1:-1] + "]"
            i = _past(s, close, m.end())
    return _keep(s, spans)


READERS = {
    "text": lambda s: s,
    "rust": rust_comments,
    "js": js_comments,
    "hash": hash_comments,
    "shell": shell_comments,
    "lua": lua_comments,
}


def extract_comments(text: str, how: str) -> str:
    return READERS[how](text)


# ---------------------------------------------------------- the mentions


def mentions(text: str):
    """(line number, token) for each path named in `text`."""
    for number, line in enumerate(text.split("\n"), 1):
        if "/" not in line and "." not in line:
            continue
        line = URL.sub(" ", line)
        for m in TOKEN.finditer(line):
            token = m.group(0).rstrip(".")
            if token.endswith("/") and not FOLDER_END.match(line, m.end()):
                continue  # `pass/# fail`: a word glued to more text, not a folder
            if path_like(token):
                yield number, token


def path_like(token: str) -> bool:
    if not token or token in NOT_PATHS:
        return False
    if FILE_NAME.search(token):
        stem = os.path.basename(token)
        if stem.startswith(".") and stem[1:] in FILE_EXTENSIONS:
            return False  # `.rs`, `.md`: an extension, not a file
    elif not (FOLDER.match(token) and re.search(r"[a-z]", token)):
        return False
    if token.startswith(("/", "~", "@")) or "//" in token:
        return False
    if TEMPLATE.search(token):
        return False
    segments = token.rstrip("/").split("/")
    if "..." in segments or any(BUILD_OUTPUT.match(p) for p in segments):
        return False
    if "path/to/" in token + "/":
        return False
    if not re.search(r"[A-Za-z]", FILE_NAME.sub("", segments[-1])):
        return False  # `1.2.md`, `0.5.js`: numbers, not names
    return True


def resolve(tree: Tree, where: str, token: str) -> bool:
    """True if `token`, named in the file `where`, exists (see the rules at the top)."""
    name = token.rstrip("/")
    if "/" not in token:
        return name in tree.names
    folder = os.path.dirname(where)
    while True:
        for base in (folder, os.path.join(folder, "src")):
            if tree.exists(os.path.join(base, name)):
                return True
        if not folder:
            return False
        folder = os.path.dirname(folder)


# ---------------------------------------------------------- the layout map


def layout_map(readme: str):
    """(line number of the block's opening fence, {entry: line}) or None without the marker."""
    lines = readme.split("\n")
    try:
        start = next(i for i, line in enumerate(lines) if line.strip() == LAYOUT_MARKER)
    except StopIteration:
        return None
    fence = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("```")), None)
    if fence is None:
        return None
    entries = {}
    for i in range(fence + 1, len(lines)):
        line = lines[i]
        if line.startswith("```"):
            break
        if line[:1].strip():
            entries[line.split()[0].rstrip(",:")] = i + 1
    return fence + 1, entries


MAP_ROOTS = ("src/", "core/src/")


def map_gaps(files: list[str], entries: dict[str, int]) -> list[str]:
    """The .rs files under src/ and core/src/ that no map entry names or holds."""
    folders = {e for e in entries if e.endswith("/") and e not in MAP_ROOTS}
    gaps = []
    for name in files:
        if not (name.endswith(".rs") and name.startswith(MAP_ROOTS)):
            continue
        if name in entries:
            continue
        if any(name.startswith(f) for f in folders):
            continue
        gaps.append(name)
    return gaps


# ---------------------------------------------------------- the check


def check(root: str, listing=None) -> tuple[list[str], int]:
    """(problems, number of mentions checked) for the repository at `root`."""
    files, links = git_files(root)
    tree = Tree(root, files)
    problems, checked = [], 0
    for name, how in documents(files, links):
        try:
            with open(os.path.join(root, name), encoding="utf-8") as f:
                text = f.read()
        except (UnicodeDecodeError, OSError):
            continue
        for number, token in mentions(extract_comments(text, how)):
            checked += 1
            ok = resolve(tree, name, token)
            if listing is not None:
                listing.append(f"{name}:{number}: {token} {'ok' if ok else 'MISSING'}")
            if not ok:
                problems.append(f"{name}:{number}: names '{token}', which does not exist")

    map_path = os.path.join(root, MAP_FILE)
    text = open(map_path, encoding="utf-8").read() if os.path.exists(map_path) else ""
    found = layout_map(text)
    if found is None:
        problems.append(f"{MAP_FILE}:1: no layout map: no ``` block below the line {LAYOUT_MARKER}")
    else:
        line, entries = found
        for gap in map_gaps(files, entries):
            folder = os.path.dirname(gap) + "/"
            also = f" (name it or its folder '{folder}')" if folder not in MAP_ROOTS else ""
            problems.append(f"{MAP_FILE}:{line}: the layout map leaves out '{gap}'{also}")
    return problems, checked


# ---------------------------------------------------------- the self-test


# A throwaway repository with one good and one stale mention of each kind;
# SELF_TEST_STALE lists exactly what the check must report. The file names
# say which is which: every `*gone*` name is stale, every other one exists or
# is not a mention at all.
SELF_TEST_FILES = {
    "README.md": f"""# fake

A [good link](docs/guide.md#top) and a [stale link](docs/gone.md#top).
Bare names: `real.rs` is good, `ghost_gone.rs` is stale. Slashed: `src/real.rs`
and `src/gone.rs`. Folders: `src/nested/` and `src/gone/`.
Not paths: https://example.com/x/gone.md, /usr/lib/gone.rs, ~/gone.md,
`target/release/gone.rs`, `clients/<lang>/gone.md`, `src/*.rs`, Node.js, `.rs`,
`path/to/gone.md`, `docs/.../gone.md`, HTTP/ and 429/, read/write, pass/# fail.
""",
    MAP_FILE: f"""# Development

{LAYOUT_MARKER}
```
src/real.rs        the real thing; src/ and src/forgotten.rs here are no entries
src/nested/        covers src/nested/inner.rs
```
""",
    "docs/guide.md": "See [the README](../README.md) and `../docs/gone-too.md`.\n",
    "pkg/README.md": (
        "Relative to here: `mod.py` and [up](../README.md); to the package's src/:\n"
        "`fake/mod.py`; stale: `fake/gone.py`, `src/gone/`.\n"
    ),
    "pkg/src/fake/mod.py": "# names fake/mod.py (good: relative to pkg/src) and ../../gone.md\n",
    "src/real.rs": (
        "// good: src/nested/inner.rs; stale: src/rust_gone.rs\n"
        "/* block: nested/inner.rs is good relative to src/, block_gone.rs is stale */\n"
        'fn f() -> &\'static str { "src/in_a_string_gone.rs is no comment" }\n'
        "fn g<'a>(x: &'a str) -> char { '\"' } // after a lifetime and a char: lifetime_gone.rs\n"
        'const R: &str = r#"// raw_gone.rs is a string"#; /* outer /* nested */ nested_gone.rs */\n'
    ),
    "src/nested/inner.rs": "//! in the map through its folder; names real.rs (good)\n",
    "src/forgotten.rs": "/// no map entry: a gap\n",
    "tool.py": (
        "# good: docs/guide.md; stale: docs/py_gone.md\n"
        "x = 'docs/string_gone.md'  # trailing: py_trailing_gone.py\n"
        '"""a docstring names docs/docstring_gone.md: a string"""\n'
        "y = f\"{x}#not_a_comment_gone.py\"\n"
    ),
    "app.js": (
        "// good: tool.py; stale: js_gone.js\n"
        "const re = /\\/\\/regex_gone.js/; const t = `${re}// template_gone.js`;\n"
        "/* block: app.js, block_js_gone.js */ const u = 'quote_gone.js';\n"
    ),
    "tb.lua": (
        "-- good: tool.py; stale: lua_gone.lua\n"
        "local s = '-- not a comment: string_gone.lua'\n"
        "--[[ long: docs/guide.md and long_gone.md ]]\n"
        "local l = [[ -- long_string_gone.lua ]]\n"
    ),
    "run.sh": (
        "#!/usr/bin/env bash\n"
        "echo \"# not a comment: sh_string_gone.sh\" # stale: sh_gone.sh\n"
        "cat <<EOF\n# heredoc_gone.sh is in a here-document\nEOF\n"
        "n=$# # good: run.sh, tb.lua\n"
    ),
    "scripts/check-paths.py": "# named by the layout map's marker line\n",
    "Cargo.toml": '[package]\nname = "fake"\n# stale: src/toml_gone.rs; good: src/real.rs\n',
    "bench/results.md": "Generated by the bench, not read: gone.md\n",
    "bench/README.md": "Read: bench_gone.md\n",
    "lib-link": None,  # a symlink to src/, through which the next file names one
    "linked.md": "Through a symlink: `lib-link/real.rs`; stale: `lib-link/gone.rs`.\n",
}

SELF_TEST_STALE = {
    "README.md:3: names 'docs/gone.md', which does not exist",
    "README.md:4: names 'ghost_gone.rs', which does not exist",
    "README.md:5: names 'src/gone.rs', which does not exist",
    "README.md:5: names 'src/gone/', which does not exist",
    "docs/guide.md:1: names '../docs/gone-too.md', which does not exist",
    "pkg/README.md:2: names 'fake/gone.py', which does not exist",
    "pkg/README.md:2: names 'src/gone/', which does not exist",
    "pkg/src/fake/mod.py:1: names '../../gone.md', which does not exist",
    "src/real.rs:1: names 'src/rust_gone.rs', which does not exist",
    "src/real.rs:2: names 'block_gone.rs', which does not exist",
    "src/real.rs:4: names 'lifetime_gone.rs', which does not exist",
    "src/real.rs:5: names 'nested_gone.rs', which does not exist",
    "tool.py:1: names 'docs/py_gone.md', which does not exist",
    "tool.py:2: names 'py_trailing_gone.py', which does not exist",
    "app.js:1: names 'js_gone.js', which does not exist",
    "app.js:3: names 'block_js_gone.js', which does not exist",
    "tb.lua:1: names 'lua_gone.lua', which does not exist",
    "tb.lua:3: names 'long_gone.md', which does not exist",
    "run.sh:2: names 'sh_gone.sh', which does not exist",
    "Cargo.toml:3: names 'src/toml_gone.rs', which does not exist",
    "linked.md:1: names 'lib-link/gone.rs', which does not exist",
    "bench/README.md:1: names 'bench_gone.md', which does not exist",
    f"{MAP_FILE}:4: the layout map leaves out 'src/forgotten.rs'",
}


def _fake_repository(root: str, files: dict) -> None:
    for name, text in files.items():
        os.makedirs(os.path.join(root, os.path.dirname(name)), exist_ok=True)
        if text is None:
            os.symlink("src", os.path.join(root, name))
            continue
        with open(os.path.join(root, name), "w", encoding="utf-8") as f:
            f.write(text)
    subprocess.run(["git", "init", "-q", root], check=True)
    subprocess.run(["git", "-C", root, "add", "."], check=True)


def _run(root: str) -> tuple[int, str]:
    """The script itself on `root`: its exit status and output."""
    run = subprocess.run(
        [sys.executable, os.path.abspath(__file__), "--root", root], capture_output=True, text=True
    )
    return run.returncode, run.stdout


def self_test() -> int:
    failures = []
    with tempfile.TemporaryDirectory() as root:
        _fake_repository(root, SELF_TEST_FILES)
        problems, checked = check(root)
        got = set(problems)
        failures += [f"not caught: {p}" for p in sorted(SELF_TEST_STALE - got)]
        failures += [f"caught, but good: {p}" for p in sorted(got - SELF_TEST_STALE)]
        if len(problems) != len(got):
            failures.append("a problem was reported twice")
        status, out = _run(root)
        lines = out.splitlines()
        summary = f"check-paths: {len(got)} "
        if status != 1 or set(lines[:-1]) != got or not lines[-1].startswith(summary):
            failures.append(f"a stale repository: exit {status}, output ending {lines[-1:]}")

        # Without the marker the map cannot be found: a failure too.
        with open(os.path.join(root, MAP_FILE), "w", encoding="utf-8") as f:
            f.write(SELF_TEST_FILES[MAP_FILE].replace(LAYOUT_MARKER, ""))
        if not any("no layout map" in p for p in check(root)[0]):
            failures.append(f"a {MAP_FILE} without the layout map marker passed")

    # A repository whose every mention is true passes, exit 0.
    clean = {
        "README.md": "See `src/a.rs` and [b](src/b/).\n",
        MAP_FILE: f"{LAYOUT_MARKER}\n```\nsrc/a.rs  a\nsrc/b/    b\n```\n",
        "src/a.rs": "// names b/c.rs\n",
        "src/b/c.rs": "",
        "scripts/check-paths.py": "",
    }
    with tempfile.TemporaryDirectory() as root:
        _fake_repository(root, clean)
        status, out = _run(root)
        if status != 0 or not out.startswith("check-paths: OK, 6 path mentions checked"):
            failures.append(f"a clean repository: exit {status}, output {out!r}")

    for failure in failures:
        print(f"check-paths self-test: {failure}")
    if failures:
        return 1
    print(
        f"check-paths self-test: OK, caught the {len(SELF_TEST_STALE)} stale mentions and map gaps"
        f" among {checked} mentions, and nothing else"
    )
    return 0


def main(argv: list[str]) -> int:
    if argv == ["--self-test"]:
        return self_test()
    root, listing = None, None
    args = list(argv)
    while args:
        arg = args.pop(0)
        if arg == "--root" and args:
            root = args.pop(0)
        elif arg == "--list":
            listing = []
        else:
            print(__doc__.split("\n\n")[1], file=sys.stderr)
            return 2
    problems, checked = check(root or check_common.repository_root(), listing)
    for line in listing or ():
        print(line)
    return check_common.report(problems, checked, FAILED, PASSED)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

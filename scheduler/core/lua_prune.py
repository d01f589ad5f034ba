"""Drop the top-level locals of included Lua libs that a transition never uses.

Redis runs a script's whole text on every call, so each `local function` of every included lib
is a closure built per call (and garbage for Lua's collector): enqueue.lua pulled in ~80 of them
to use ~20 (docs/performance.md section 13). The expanded text (scheduler.core.scripts._expand)
marks each lib with `-- begin <lib>` / `-- end <lib>`; inside those marks every top-level
statement must be a `local` declaration of one name at column 0 (a unit runs until the next
one; `local a, b = ...`, a global statement or an indented line outside a unit is refused).
A unit is kept when its name appears, as a word, in the code of the script's own text or of a
kept unit: comments (`-- ...`, `--[[ ... ]]`) are left out, string literals kept (a `--` inside
one starts no comment), so a name only in a comment keeps nothing; an unterminated string or
long bracket is refused (Lua would refuse it too).
"""

from __future__ import annotations

import re

_UNIT = re.compile(r"local\s+(?:function\s+)?([A-Za-z_]\w*)")
_MANY = re.compile(r"local\s+[A-Za-z_]\w*\s*,")  # `local a, b = ...`: one unit, two names
_BEGIN = re.compile(r"-- begin lib/[\w/]+\.lua$")  # the marks scripts._expand writes
_END = re.compile(r"-- end lib/[\w/]+\.lua$")
_WORD = re.compile(r"[A-Za-z_]\w*")
# Column-0 lines inside a lib that continue the current unit: its closing line (`end`, `}`,
# `)` as a whole token: `endpoint = 1` is a statement), comments.
_CONTINUES = re.compile(r"(end\b|[})]|--)")
# The next comment or string literal after a run of other characters, leftmost first: a `--`
# inside a string is no comment, a quote inside a comment starts no string. `bad`: an opening
# never closed. (The leading run: one match per piece, not a try at every character.)
_PIECE = re.compile(
    r"""[^-\["']*(?:(?P<comment>--\[(?P<lc>=*)\[.*?\](?P=lc)\]|--(?!\[=*\[)[^\n]*)"""
    r"""|\[(?P<ls>=*)\[.*?\](?P=ls)\]|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'"""
    r"""|(?P<bad>--\[=*\[|\[=*\[|["'])|[-\[]|\Z)""",
    re.S,
)


def code(text: str) -> str:
    """`text` with its comments blanked (their line breaks kept: line i is still line i)."""
    out: list[str] = []
    pos = 0
    for m in _PIECE.finditer(text):
        kind = m.lastgroup
        if kind == "comment":
            out += [text[pos : m.start(kind)], " ", "\n" * m.group(kind).count("\n")]
            pos = m.end()
        elif kind == "bad":
            line = text.count("\n", 0, m.start(kind)) + 1
            raise ValueError(f"line {line}: {m.group(kind)!r} is never closed")
    out.append(text[pos:])
    return "".join(out)


def prune(text: str) -> str:
    """`text` without the unused lib units; raises ValueError on a lib top-level statement
    that is not a `local` declaration (it could not be dropped or kept safely)."""
    lines = text.split("\n")
    codes = code(text).split("\n")  # what names are read from
    units: list[list[int | str]] = []  # [name, first line, last line]
    in_lib: set[int] = set()
    depth = 0
    reading = False  # inside a unit (its continuation lines extend it)
    for i, line in enumerate(lines):
        if _BEGIN.match(line):
            depth, reading = depth + 1, False
            continue
        if _END.match(line):
            depth, reading = depth - 1, False
            continue
        if depth == 0:
            continue
        in_lib.add(i)
        m = _UNIT.match(line)
        if m and _MANY.match(line):
            raise ValueError(f"lib line {i + 1} declares several names: {line[:60]!r}")
        if m:
            units.append([m.group(1), i, i])
            reading = True
        elif not codes[i].strip():  # blank, or a comment
            if reading:
                units[-1][2] = i
        elif line[0].isspace() and reading:
            units[-1][2] = i  # the unit's body
        elif line[0].isspace() or not _CONTINUES.match(line):
            raise ValueError(f"lib line {i + 1} is not a local declaration: {line[:60]!r}")
        elif reading:
            units[-1][2] = i
    texts: dict[str, list[str]] = {}
    for name, first, last in units:
        texts.setdefault(str(name), []).append("\n".join(codes[int(first) : int(last) + 1]))
    own = "\n".join(line for i, line in enumerate(codes) if i not in in_lib)
    kept: set[str] = set()
    todo = [w for w in _WORD.findall(own) if w in texts]
    while todo:
        name = todo.pop()
        if name in kept:
            continue
        kept.add(name)
        for body in texts[name]:
            todo.extend(w for w in _WORD.findall(body) if w in texts and w not in kept)
    drop: set[int] = set()
    for name, first, last in units:
        if name not in kept:
            drop.update(range(int(first), int(last) + 1))
    return "\n".join(line for i, line in enumerate(lines) if i not in drop)

"""Every script's main function keeps well inside Lua's limit on local variables.

Lua (5.1 in Redis) allows 200 active locals per function (LUAI_MAXVARS); a script past it is
refused when compiled, at SCRIPT LOAD or its first EVAL: "main function has more than 200
local variables" (Lua 5.2+: "too many local variables"). The included libs' top-level locals
(scheduler/core/lua_prune.py keeps those a script uses) count in each script's main function,
so a change to a lib can break a script that was not touched: claim.lua once stood at 199.
"""

from __future__ import annotations

import re

import pytest
import redis
from redis.exceptions import ResponseError

from scheduler.core.lua_prune import code
from scheduler.core.scripts import TRANSITIONS, source

# 30 below Lua's 200: a change that adds a few locals fails here, with the count and this
# remedy, before a server refuses the script (scope a phase's locals in a `do ... end` block).
HEADROOM_MAX = 170

# On the text without comments: long strings and strings (their words are no keywords), names,
# any other character.
_TOKEN = re.compile(
    r"""\[(=*)\[.*?\]\1\]|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'|[A-Za-z_]\w*|\S""", re.S
)


def _tokens(text: str) -> list[str]:
    return [m.group(0) for m in _TOKEN.finditer(code(text))]


def count_locals(text: str) -> tuple[int, int]:
    """(top-level, peak) locals of the main function of the script `text`: `top-level` the names
    declared at its nesting depth 0 (`local a, b` two, `local function f` one); `peak` the most
    active at once, what Lua limits: with a block's (do, if, while, for, repeat) while it runs,
    and a `for`'s 3 hidden control variables. A nested function's locals are its own."""
    toks = _tokens(text)
    blocks: list[tuple[str, int]] = []  # (opening keyword, active locals at its start)
    active = top = peak = 0
    in_fn = 0  # nested function bodies open
    loop_vars = 0  # locals a `for` declares at its `do`
    for i, t in enumerate(toks):
        if t == "local" and in_fn == 0:
            names, j = 1, i + 1
            if toks[j] != "function":
                while toks[j + 1] == ",":
                    names, j = names + 1, j + 2
            active += names
            top += names if not blocks else 0
        elif t == "for":
            names, j = 1, i + 1
            while toks[j + 1] == ",":
                names, j = names + 1, j + 2
            loop_vars = 3 + names
            blocks.append((t, active))
        elif t == "do" and blocks and blocks[-1][0] in ("for", "while"):
            kind, start = blocks.pop()
            blocks.append(("loop", start))  # its `do`: not a block of its own
            active += loop_vars if kind == "for" and in_fn == 0 else 0
        elif t in ("function", "do", "while", "if", "repeat"):
            blocks.append((t, active))
            in_fn += t == "function"
        elif t in ("elseif", "else") and in_fn == 0:
            active = blocks[-1][1]  # the branch before it ends
        elif t in ("end", "until"):
            kind, start = blocks.pop()
            if kind == "function":
                in_fn -= 1
            elif in_fn == 0:
                active = start
        peak = max(peak, active)
    assert not blocks, f"unclosed blocks: {blocks}"
    return top, peak


def _script(top: int, block: str = "") -> str:
    return "".join(f"local v{i} = {i}\n" for i in range(top)) + block + "return 1\n"


def _in_block(n: int) -> str:
    return "".join(f"  local b{i} = {i}\n" for i in range(n))


# (script, top-level, peak): each pair straddles Lua's limit, by the rule it exercises.
CASES = {
    "top-level": (_script(200), 200, 200),
    "top-level, one more": (_script(201), 201, 201),
    "one statement, several names": (
        _script(0, "local " + ", ".join(f"m{i}" for i in range(201)) + "\n"),
        201,
        201,
    ),
    "blocks in turn": (
        _script(
            150, f"do\n{_in_block(50)}end\nif KEYS then\n{_in_block(50)}else\n{_in_block(50)}end\n"
        ),
        150,
        200,
    ),
    "a block, one more": (_script(150, f"repeat\n{_in_block(51)}until true\n"), 150, 201),
    "numeric for": (_script(195, "for i = 1, 2 do local a = i end\n"), 195, 200),
    "numeric for, one more": (_script(196, "for i = 1, 2 do local a = i end\n"), 196, 201),
    "generic for, one more": (_script(196, "for k, v in pairs({}) do end\n"), 196, 201),
    "a nested function's own": (
        _script(199, f"local function f()\n{_in_block(150)}end\nwhile false do f() end\n"),
        200,
        200,
    ),
    "comments and strings": (
        _script(200, "-- local c1 = 'end'\n--[[ local c2\nend ]]\nlocal s = 'do'\n"),
        201,
        201,
    ),
}


@pytest.mark.parametrize("case", CASES)
def test_the_counter_agrees_with_lua(case: str, private: redis.Redis) -> None:
    text, top, peak = CASES[case]
    assert count_locals(text) == (top, peak)
    if peak <= 200:
        private.script_load(text)
    else:
        with pytest.raises(ResponseError, match="more than 200 local variables"):
            private.script_load(text)


@pytest.mark.parametrize("clock", ["server", "test"])
@pytest.mark.parametrize("name", TRANSITIONS)
def test_every_script_keeps_headroom(name: str, clock: str) -> None:
    top, peak = count_locals(source(name, clock))
    assert top <= peak <= HEADROOM_MAX, f"{name}: {top} top-level locals, {peak} at once"

"""The sent Lua text leaves out its libs' unused top-level locals (scheduler.core.lua_prune)."""

from __future__ import annotations

import pytest

from scheduler.core.lua_prune import code, prune
from scheduler.core.scripts import TRANSITIONS, _expand, lua_dir, source

LIB = """\
-- begin lib/a.lua
-- a lib's own comment
local LIMIT = { a = 1,
  b = 2 }
local function used(x)
  return helper(x) + LIMIT.a
end
local function helper(x)
  return x
end

local function unused()
  return 'never'
end
-- end lib/a.lua
"""


def test_keeps_what_the_script_uses_and_what_that_uses() -> None:
    out = prune(LIB + "return used(1)\n")
    assert "local function used" in out
    assert "local function helper" in out  # reached through used
    assert "local LIMIT" in out and "  b = 2 }" in out  # a multi-line table kept whole
    assert "unused" not in out
    assert out.endswith("return used(1)\n")


def test_a_name_only_in_a_lib_comment_keeps_nothing() -> None:
    out = prune(LIB.replace("-- a lib's own comment", "-- see unused()") + "return 1\n")
    assert "local function used" not in out and "local function unused" not in out


def test_a_lib_statement_that_is_not_a_local_is_refused() -> None:
    with pytest.raises(ValueError, match="not a local declaration"):
        prune(LIB.replace("local function unused", "redis.log(1)\nlocal function unused"))


def test_a_comment_that_looks_like_a_mark_does_not_end_the_lib() -> None:
    # Were it read as the lib's end, `unused` below it would be the script's own text (kept).
    text = LIB.replace(
        "local function unused", "-- end lib/a.lua as a sentence\nlocal function unused"
    )
    assert "local function unused" not in prune(text + "return used(1)\n")


@pytest.mark.parametrize(
    "line",
    [
        "local tinsert, tconcat = table.insert, table.concat",  # one unit, two names
        "endpoint = 5",  # a global statement, not a unit's closing `end`
        "  redis.setresp(3)",  # an indented statement outside any unit
    ],
)
def test_what_cannot_be_kept_or_dropped_safely_is_refused(line: str) -> None:
    text = LIB.replace("-- a lib's own comment", line)
    with pytest.raises(ValueError):
        prune(text + "return used(1)\n")


@pytest.mark.parametrize("name", TRANSITIONS)
def test_every_transition_is_smaller_and_keeps_its_own_text(name: str) -> None:
    full = _expand(lua_dir(), f"{name}.lua", set(), (f"{name}.lua",), "server")
    sent = source(name)
    assert len(sent) < len(full)
    own = (lua_dir() / f"{name}.lua").read_text()
    body = [line for line in own.splitlines() if line and not line.startswith("-- @include")]
    assert [line for line in sent.splitlines() if line in set(body)] != []
    for line in body:
        assert line in sent  # the transition's own lines are never dropped


def test_a_name_only_in_a_comment_keeps_nothing() -> None:
    # In the script's own text or in a kept unit's body, as a line or a block comment.
    for note in ("-- unused() is not called", "--[[ nor\nunused() here ]]", "--[==[ unused ]==]"):
        out = prune(LIB.replace("  return x\n", f"  {note}\n  return x\n") + f"{note}\nused(1)\n")
        assert "local function used" in out and "local function unused" not in out, note


def test_a_unit_called_is_kept_whatever_comments_say() -> None:
    # After a comment on its line, after a block comment that ends there, and beside a string
    # holding `--` (no comment starts inside a string).
    for call in (
        "-- x\nunused()",
        "--[[ x ]] unused()",
        "local s = 'a -- b' .. unused()",
        'local s = "a [[ --" .. unused()',
        "local s = [[ -- ]] .. unused()",
    ):
        assert "local function unused" in prune(LIB + call + "\n"), call


def test_a_string_or_long_bracket_never_closed_is_refused() -> None:
    for text in ("local s = 'a\nunused()", "--[[ never closed\nunused()", "local s = [==[ x ]]"):
        with pytest.raises(ValueError, match="never closed"):
            prune(LIB + text + "\n")


def test_comments_blanked_keep_the_line_numbers() -> None:
    text = "a -- b\n--[[ c\nd ]] e 'f -- g'\n"
    assert code(text) == "a  \n \n e 'f -- g'\n"

"""docs/cli.md, the operator's CLI reference, is what scheduler/cli/reference.py writes from
click's command tree today: a new command or option, or a changed help text or default, fails
here until the page is refreshed. And the page names every visible command and option (each
once under its command's heading), with the exit-code table of scheduler/core/exits.py."""

from __future__ import annotations

import re
from pathlib import Path

import click

from scheduler.cli import reference
from scheduler.cli.main import main
from scheduler.core import exits

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "cli.md"


def test_the_page_is_up_to_date() -> None:
    assert PAGE.read_text() == reference.render(), f"docs/cli.md is stale: {reference.REFRESH}"


def _sections(text: str) -> dict[str, str]:
    parts = re.split(r"^## (scheduler(?: [\w-]+)*)$", text, flags=re.M)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_command_and_option_is_on_the_page() -> None:
    sections = _sections(reference.render())
    missing = []
    for path, cmd in reference._commands(main, ["scheduler"]):
        body = sections.get(" ".join(path))
        if body is None:
            missing.append(" ".join(path))
            continue
        ctx = click.Context(cmd, info_name=path[-1])
        shown = [p for p in cmd.get_params(ctx) if isinstance(p, click.Option) and not p.hidden]
        for param in shown:
            row = re.compile(rf"^\| (`|<code>)[^`<]*{re.escape(param.opts[0])}\b", re.M)
            if param is not cmd.get_help_option(ctx) and not row.search(body):
                missing.append(f"{' '.join(path)} {param.opts[0]}")
    assert len(sections) >= 30  # every group and subcommand (the walk found them)
    assert "scheduler enqueue" in sections and "scheduler workers stop" in sections
    assert missing == []


def test_options_the_audit_found_undocumented_are_there_with_defaults() -> None:
    sections = _sections(reference.render())
    assert re.search(r"\| `--max-attempts INTEGER RANGE` \| Attempts.* \| `5` \|",
                     sections["scheduler enqueue"])  # fmt: skip
    assert "| `--stale-lease DURATION` |" in sections["scheduler doctor"]
    assert "`5m`" in sections["scheduler doctor"]
    assert (
        "<code>--log-level [debug&#124;info&#124;warning&#124;error]</code>"
        in sections["scheduler worker"]
    )
    assert "`--version`" in sections["scheduler"]
    for option in ("--debounce", "--key-ttl", "--timeout-ms", "--rate-key", "--strict"):
        assert f"`{option}" in sections["scheduler enqueue"], option


def test_the_exit_codes_are_the_one_table() -> None:
    page = reference.render()
    table = page[page.index("## Exit codes") :].split("\n\n## ", 1)[0]
    for code, _ in exits.EXIT_CODES:
        assert re.search(rf"^\| {code} \| ", table, re.M), code
    assert "128+N" in table


def test_markup_in_help_is_escaped_and_code_kept() -> None:
    """A cron's `* * *` must not turn into emphasis, `|` must not split a table cell, a
    backticked span stays as written (in a cell, one with a `|` is HTML: GitHub needs the `|`
    escaped, and MkDocs would show a backslash in a code span)."""
    assert reference._text("'* * * */10' a_b [0, x] <id>") == (
        "'\\* \\* \\* \\*/10' a\\_b \\[0, x\\] &lt;id>"
    )
    cell = reference._text("skip | `quiet|stop` `a_b`", in_table=True)
    assert cell == "skip \\| <code>quiet&#124;stop</code> `a_b`"
    assert reference._text("`a_b*`") == "`a_b*`"


def test_every_url_option_shows_url_as_its_metavar() -> None:
    """`demo --url` showed TEXT where every other command's --url shows URL."""
    shown: dict[str, str] = {}
    for path, cmd in reference._commands(main, ["scheduler"]):
        ctx = click.Context(cmd, info_name=path[-1])
        for param in cmd.get_params(ctx):
            if isinstance(param, click.Option) and "--url" in param.opts:
                record = param.get_help_record(ctx)
                shown[" ".join(path)] = record[0] if record else ""
    assert "scheduler demo" in shown and "scheduler stats" in shown  # the walk found them
    assert {c: names for c, names in shown.items() if names != "--url URL"} == {}

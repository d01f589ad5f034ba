"""The docs site: `mkdocs build --strict` passes on the real config, fails on a broken API
reference, and the README-include hook copies sections (not files) and fails on a missing one.
`make test` builds it, so CI fails on a broken reference."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _hooks() -> ModuleType:
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs/guide/_hooks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocstrings")
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1"},
    )  # fmt: skip


def test_the_site_builds_strict(tmp_path: Path) -> None:
    run = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert run.returncode == 0, run.stderr
    api = (tmp_path / "site/api/index.html").read_text()
    assert "Accept a job; returns its id." in api  # Queue.enqueue's docstring, rendered
    workers = (tmp_path / "site/guide/workers/index.html").read_text()
    assert "registry" in workers  # the README section, included at build time


@pytest.mark.parametrize(("target", "ok"), [("scheduler.Queue", True),
                                            ("scheduler.NoSuchThing", False)])  # fmt: skip
def test_a_broken_api_reference_fails_the_build(tmp_path: Path, target: str, ok: bool) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(f"# API\n\n::: {target}\n")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        "site_name: t\nplugins:\n  - mkdocstrings:\n      handlers:\n        python:\n"
        f"          paths: [{str(ROOT)!r}]\n"
    )
    run = _build(config, tmp_path / "site")
    assert (run.returncode == 0) is ok, run.stderr


def test_include_takes_one_section_and_relinks(tmp_path: Path) -> None:
    hooks = _hooks()
    text = hooks._section("README.md", "## Recurring schedules")
    assert text.startswith("## Recurring schedules")
    assert "\n## " not in text  # stops at the next section of the same level
    linked = hooks._relink("see [the doc](docs/security.md#tls) and [`lua/`](lua)",
                           "README.md", "guide/x.md")  # fmt: skip
    assert linked == "see [the doc](../security.md#tls) and `lua/` (`lua` in the repository)"
    with pytest.raises(ValueError, match="no heading"):
        hooks._section("README.md", "## No such section")


def test_links_to_the_readme_and_its_anchors_land_on_the_front_page() -> None:
    """The front page is the README: a guide page's `../../README.md#workers` (right on GitHub)
    and an included `(#workers)` whose heading is not in the section were dead links on the
    site (the strict build did not see them: -q, and anchors were not validated)."""
    hooks = _hooks()
    own = hooks._readme_links("see [W](../../README.md#workers), [S](../security.md)",
                              "guide/workers.md")  # fmt: skip
    assert own == "see [W](../index.md#workers), [S](../security.md)"
    text = "## Using it\n\n[Workers](#workers), [here](#using-it)"
    assert hooks._reanchor(text, "guide/getting-started.md") == (
        "## Using it\n\n[Workers](../index.md#workers), [here](#using-it)"
    )
    assert "anchors: warn" in (ROOT / "mkdocs.yml").read_text()


def test_make_test_builds_the_docs_strict() -> None:
    make = shutil.which("make")
    if make is None:
        pytest.skip("no make")
    out = subprocess.run([make, "-n", "test"], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout  # fmt: skip
    (build,) = [line for line in out.splitlines() if "mkdocs build" in line]
    assert "--strict" in build
    # --quiet drops the warnings before strict counts them: the build passed with five.
    assert "--quiet" not in build.split() and "-q" not in build.split()


def test_the_api_reference_names_every_public_name() -> None:
    """getting-started.md promises the reference "lists every public type and method": each
    name `from scheduler import *` gives has its own entry (JobOutcome, open_queue and
    open_queue_async had none)."""
    import scheduler

    api = (ROOT / "docs/api/index.md").read_text()
    missing = [n for n in scheduler.__all__ if f"\n::: scheduler.{n}\n" not in api]
    assert not missing, f"docs/api/index.md has no entry for {missing}"

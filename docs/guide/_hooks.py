"""MkDocs hook: `<!-- include README.md "## Heading" -->` in a page is replaced by that README
section (up to the next heading of the same or a higher level), so the guide reuses the README
instead of copying it. Links into docs/ are rewritten relative to the page; other repository
paths become plain text. The site's front page (docs/index.md) is the README itself, so a link to
README.md, and an included `#anchor` whose heading is not in the section, point there. A missing
file or heading fails the build."""

from __future__ import annotations

import os
import posixpath
import re
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
_DIRECTIVE = re.compile(r'<!-- include (\S+) "(#+ [^"]+)" -->')
_LINK = re.compile(r"\[([^\]]*)\]\(([^)#:\s]+)(#[^)]*)?\)")
_ANCHOR = re.compile(r"\]\(#([^)\s]+)\)")
_HEADING = re.compile(r"^#+ (.+)$", re.M)


def _section(path: str, heading: str) -> str:
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        lines = f.read().splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    in_fence, start, end = False, None, len(lines)
    for i, line in enumerate(lines):
        if line.startswith("```"):
            in_fence = not in_fence
        if in_fence or not line.startswith("#"):
            continue
        depth = len(line) - len(line.lstrip("#"))
        if start is None and line.strip() == heading:
            start = i
        elif start is not None and depth <= level:
            end = i
            break
    if start is None:
        raise ValueError(f"include: no heading {heading!r} in {path}")
    return "\n".join(lines[start:end])


def _relink(text: str, src: str, page: str) -> str:
    src_dir, page_dir = posixpath.dirname(src), posixpath.dirname(page)

    def fix(m: re.Match[str]) -> str:
        text, target = m.group(1), posixpath.normpath(posixpath.join(src_dir, m.group(2)))
        if target == "README.md":  # the front page
            target = "docs/index.md"
        if target.startswith("docs/"):
            rel = posixpath.relpath(target[len("docs/") :], page_dir or ".")
            return f"[{text}]({rel}{m.group(3) or ''})"
        return text if text.strip("`") == target else f"{text} (`{target}` in the repository)"

    return _LINK.sub(fix, text)


def _slug(heading: str) -> str:
    """The toc extension's default anchor of a heading."""
    return re.sub(r"[-\s]+", "-", re.sub(r"[^\w\s-]", "", heading.strip().lower()))


def _reanchor(text: str, page: str) -> str:
    """An included `(#anchor)` names a README heading: outside this section it is on the front
    page (a guide page that includes `## Using it` has no `#workers`)."""
    here = {_slug(h) for h in _HEADING.findall(text)}
    front = posixpath.relpath("index.md", posixpath.dirname(page) or ".")

    def fix(m: re.Match[str]) -> str:
        anchor = m.group(1)
        return m.group(0) if anchor in here else f"]({front}#{anchor})"

    return _ANCHOR.sub(fix, text)


def _readme_links(markdown: str, page: str) -> str:
    """The page's own links to README.md (right on GitHub) go to the front page, the README."""
    page_dir = posixpath.dirname(page)

    def fix(m: re.Match[str]) -> str:
        if posixpath.normpath(posixpath.join("docs", page_dir, m.group(2))) != "README.md":
            return m.group(0)
        front = posixpath.relpath("index.md", page_dir or ".")
        return f"[{m.group(1)}]({front}{m.group(3) or ''})"

    return _LINK.sub(fix, markdown)


def on_page_markdown(markdown: str, page: Any, **_: Any) -> str:
    uri = page.file.src_uri

    def repl(m: re.Match[str]) -> str:
        text = _relink(_section(m.group(1), m.group(2)), m.group(1), uri)
        return text if uri == "index.md" else _reanchor(text, uri)

    return _DIRECTIVE.sub(repl, _readme_links(markdown, uri))

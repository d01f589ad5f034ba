"""Text safety for everything the operator tools and the worker print.

Stored job data is untrusted: anyone holding the producer credential writes task names,
payloads and worker fields, and any handler's exception message (often payload text) becomes
`last_error`. So every output path (CLI tables and JSON, log lines, later the web UI) passes
text through `clean`, and every message that may hold a Redis URL through `redact`."""

from __future__ import annotations

import re
from typing import Any

# C0 and C1 controls, DEL, bidi embeddings / overrides / isolates and marks, line and paragraph
# separators, surrogates (undecodable bytes read with errors='surrogateescape'), and the
# invisible format characters (Unicode category Cf: soft hyphen, zero-width space / joiners,
# word joiner, BOM, tag characters): no invisible character makes two ids print alike.
_UNSAFE = (
    "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
    "\xad\u0600-\u0605\u06dd\u070f\u0890\u0891\u08e2\u180e\u200b-\u200d\u2060-\u2064"
    "\u206a-\u206f\ufeff\ufff9-\ufffb\U000110bd\U000110cd\U00013430-\U0001343f"
    "\U0001bca0-\U0001bca3\U0001d173-\U0001d17a\U000e0001\U000e0020-\U000e007f"
)
_UNSAFE_RE = re.compile(f"[{_UNSAFE}]")
_UNSAFE_KEEP_LINES_RE = re.compile("[\x00-\x08\x0b-\x1f" + _UNSAFE[len("\x00-\x1f") :] + "]")


def _visible(m: re.Match[str]) -> str:
    code = ord(m.group())
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the original undecodable byte
        return f"\\x{code - 0xDC00:02x}"
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def clean(text: object, *, keep_newlines: bool = False) -> str:
    """`text` with every control character shown as an escape (`ESC` -> `\\x1b`, U+202E ->
    `\\u202e`, an undecodable byte -> `\\xff`), so it cannot move the cursor, clear the screen,
    retitle the terminal, reorder the line or fake a new line. keep_newlines keeps `\\n` and
    `\\t` for text meant to span lines (a traceback); carriage returns are escaped always."""
    s = text if isinstance(text, str) else str(text)
    if s.isascii() and s.isprintable():
        return s
    return (_UNSAFE_KEEP_LINES_RE if keep_newlines else _UNSAFE_RE).sub(_visible, s)


def _visible_text(value: Any) -> Any:
    if isinstance(value, str) and not value.isascii():
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    return value


def visible_bytes(value: Any) -> Any:
    """JSON-ready data with undecodable bytes (lone surrogates) shown as `\\xff` text; JSON
    output escapes control characters itself (ensure_ascii). A copy made with a stack, not
    recursion: a payload nested ~500 levels deep (accepted) must not end the CLI's --json."""
    root: list[Any] = [None]
    todo: list[tuple[Any, Any, Any]] = [(value, root, 0)]  # (value, its container, its place)
    while todo:
        v, into, at = todo.pop()
        if isinstance(v, dict):
            d: dict[Any, Any] = {}
            for k, item in v.items():
                k = _visible_text(k)
                d[k] = None  # the keys' order kept; filled below
                todo.append((item, d, k))
            into[at] = d
        elif isinstance(v, list | tuple):
            items: list[Any] = [None] * len(v)
            todo.extend((item, items, i) for i, item in enumerate(v))
            into[at] = items
        else:
            into[at] = _visible_text(v)
    return root[0]


# Any argument named like a secret (password=, ssl_password=, auth_token=, ...): redis-py passes
# unknown query arguments on to the connection. The name is matched possessively and checked
# afterwards, and a URL's password found with find/rfind, so hostile text (a handler's error
# message in a log line) costs linear time, never a regex backtracking over it.
_SECRET_NAME = re.compile(r"(?i)pass|pwd|secret|token")
_QUERY_ARG = re.compile(r"([?&;][^=&;\s#?]*+=)[^&;\s]*+")
_TOKENS = re.compile(r"(\s+)")
_SPACE = re.compile(r"\s")
REDACTED = "***"


def is_secret_name(name: str) -> bool:
    """True for an option name whose value must never be shown (`ssl_password`, `token`)."""
    return _SECRET_NAME.search(name) is not None


def _password_span(token: str) -> tuple[int, int] | None:
    """scheme://user:password@: from the password up to the LAST '@' of the token, so a
    password holding '@', or an unencoded '/', '?' or '#', is hidden whole (a URL with no
    password but a later '@' may lose some host text too: over-redacting is fine)."""
    start, at = token.find("://") + 3, token.rfind("@")
    user, colon, _ = token[start:at].partition(":")
    if start < 3 or at < start or not colon:  # no URL, or no password
        return None
    if any(c in user for c in "/?#"):  # not a user name: hide it all
        return start, at
    return start + len(user) + 1, at


def _hide_secrets(token: str) -> str:
    """The token with the union of its secret spans replaced by ***: the URL's password and
    each secret query value, both found on the original text (one pass must not hide what the
    other needs to see: a query password holding '@' looked like a URL password's end)."""
    spans = [(m.end(1), m.end()) for m in _QUERY_ARG.finditer(token) if is_secret_name(m[1])]
    pw = _password_span(token) if "@" in token else None
    if pw is not None:
        spans.append(pw)
    if not spans:
        return token
    out: list[str] = []
    pos = 0
    for lo, hi in sorted(spans):
        if hi <= pos:
            continue
        lo = max(lo, pos)
        if lo > pos or not out:
            out.append(token[pos:lo])
            out.append(REDACTED)
        pos = hi
    out.append(token[pos:])
    return "".join(out)


def _spaced_passwords(text: str) -> str:
    """`text` with each URL password holding whitespace hidden (urlsplit, so redis-py, takes
    `redis://app:pa ss@host`; the words redact() splits would show it): from the first ':'
    after '://' up to the last '@' before the host's end (its first '/' or line end). Linear:
    those spans never overlap (each ends before the next '://')."""
    out: list[str] = []
    done = scan = 0
    while (mark := text.find("://", scan)) != -1:
        start = mark + 3
        end = text.find("/", start)
        end = len(text) if end < 0 else end
        end = line_end if (line_end := text.find("\n", start, end)) >= 0 else end
        at = text.rfind("@", start, end)
        colon = text.find(":", start, at) if at >= 0 else -1
        if colon >= 0 and _SPACE.search(text, start, at) is not None:
            out += [text[done : colon + 1], REDACTED]
            done = at
        scan = end
    return "".join(out) + text[done:] if out else text


def redact(text: str) -> str:
    """`text` with every URL password replaced by ***: `rediss://app:s3cret@host` ->
    `rediss://app:***@host`, `?ssl_password=s3cret` -> `?ssl_password=***`. For URLs and
    for whole messages that may quote one."""
    if "=" not in text and not ("@" in text and "://" in text):
        return text
    text = _spaced_passwords(text) if "@" in text else text
    return "".join(_hide_secrets(t) if ("=" in t or "@" in t) else t for t in _TOKENS.split(text))


def safe(text: object) -> str:
    """One line of untrusted text ready to print: credentials redacted, controls escaped."""
    return clean(redact(text if isinstance(text, str) else str(text)))

"""Text safety for everything the operator tools and the worker print.

Stored job data is untrusted: anyone holding the producer credential writes task names,
payloads and worker fields, and any handler's exception message (often payload text) becomes
`last_error`. So every output path (CLI tables and JSON, log lines, later the web UI) passes
text through `clean`, and every message that may hold a Redis URL through `redact`."""

from __future__ import annotations

import re
from typing import Any

# C0 and C1 controls, DEL, bidi embeddings / overrides / isolates and marks, line and paragraph
# separators, and surrogates (undecodable bytes read with errors='surrogateescape').
_UNSAFE = "\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069\ud800-\udfff"
_UNSAFE_RE = re.compile(f"[{_UNSAFE}]")
_UNSAFE_KEEP_LINES_RE = re.compile("[\x00-\x08\x0b-\x1f" + _UNSAFE[len("\x00-\x1f") :] + "]")


def _visible(m: re.Match[str]) -> str:
    code = ord(m.group())
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape: the original undecodable byte
        return f"\\x{code - 0xDC00:02x}"
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def clean(text: object, *, keep_newlines: bool = False) -> str:
    """`text` with every control character shown as an escape (`ESC` -> `\\x1b`, U+202E ->
    `\\u202e`, an undecodable byte -> `\\xff`), so it cannot move the cursor, clear the screen,
    retitle the terminal, reorder the line or fake a new line. keep_newlines keeps `\\n` and
    `\\t` for text meant to span lines (a traceback); carriage returns are escaped always."""
    s = text if isinstance(text, str) else str(text)
    if s.isascii() and s.isprintable():
        return s
    return (_UNSAFE_KEEP_LINES_RE if keep_newlines else _UNSAFE_RE).sub(_visible, s)


def visible_bytes(value: Any) -> Any:
    """JSON-ready data with undecodable bytes (lone surrogates) shown as `\\xff` text; JSON
    output escapes control characters itself (ensure_ascii)."""
    if isinstance(value, str):
        if value.isascii():
            return value
        return value.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")
    if isinstance(value, dict):
        return {visible_bytes(k): visible_bytes(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [visible_bytes(v) for v in value]
    return value


# scheme://user:password@ (the password may hold '@', up to the last one before the path) and
# a password=... query argument, which redis-py's from_url accepts too.
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://[^:/?#@\s]*:)[^/?#\s]*@")
_QUERY_PASSWORD = re.compile(r"(?i)([?&](?:password|pass|pwd)=)[^&\s#]*")
REDACTED = "***"


def redact(text: str) -> str:
    """`text` with every URL password replaced by ***: `rediss://app:s3cret@host` ->
    `rediss://app:***@host`. For URLs and for whole messages that may quote one."""
    if "@" not in text and "=" not in text:
        return text
    text = _URL_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}@", text)
    return _QUERY_PASSWORD.sub(lambda m: f"{m.group(1)}{REDACTED}", text)


def safe(text: object) -> str:
    """One line of untrusted text ready to print: credentials redacted, controls escaped."""
    return clean(redact(text if isinstance(text, str) else str(text)))

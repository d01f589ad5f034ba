"""Stored text the doctor reads and writes: a dead reason cut to what lua/repair.lua takes,
and the fields whose bytes are not UTF-8 (read with errors='surrogateescape')."""

# lua/repair.lua refuses a dead reason over this many bytes (UTF-8, as Redis stores it).
REASON_MAX_BYTES = 200


def cut_bytes(text: str, limit: int = REASON_MAX_BYTES) -> str:
    """`text` cut to at most `limit` bytes of UTF-8 (undecodable bytes, read as lone
    surrogates, count as the one byte each they are stored as), never inside a character."""
    if text.isascii():
        return text[:limit]
    size = 0
    for n, ch in enumerate(text):
        size += _utf8_size(ch)
        if size > limit:
            return text[:n]
    return text


def _utf8_size(ch: str) -> int:
    try:
        return len(ch.encode("utf-8", "surrogateescape"))
    except UnicodeEncodeError:  # a lone surrogate no byte was read as: the client's 3 bytes
        return 3


def _has_undecodable(text: str) -> bool:
    return not text.isascii() and any("\udc80" <= ch <= "\udcff" for ch in text)


def undecodable_fields(fields: dict[str, str]) -> list[str]:
    """Names of the fields whose name or value held bytes that are not UTF-8."""
    return sorted(k for k, v in fields.items() if _has_undecodable(k) or _has_undecodable(v))

"""Job ids made by the client (so enqueue_many returns them without a round trip, and a re-sent
enqueue names the same job): short, sortable by creation time, unique without coordination."""

from __future__ import annotations

import binascii
import os
import random
import threading
import time

# A private generator seeded from the OS, not `secrets` per id (one getrandom syscall each:
# ~1.4 us of the old 2.8 us): user code calling random.seed() cannot make ids repeat, and a
# forked child reseeds (below), so parent and child never draw the same bits.
_rng = random.Random(os.urandom(32))
# The (ms, sequence) of this process's last id: the next one sorts after it. A sequence that
# wrapped within one ms (a 16-bit counter from a random start: ~5% of 3,000-id batches) made
# later ids sort first, so jobs due at the same ms were claimed out of enqueue order.
_last = [0, 0]
# Its read-modify-write is one step for threads: a thread paused between reading and writing
# it wrote back an older value, so another thread's next id in that ms sorted before its last.
_lock = threading.Lock()


def _reseed() -> None:
    global _lock
    _rng.seed(os.urandom(32))
    _lock = threading.Lock()  # one a parent's thread held at the fork would never be released


os.register_at_fork(after_in_child=_reseed)

# base64 with its 64 symbols in ASCII order: the text of big-endian bytes sorts as the bytes do.
_B64 = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
_SORTED64 = b"-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"
_TO_SORTED = bytes.maketrans(_B64, _SORTED64)
_b2a = binascii.b2a_base64
_time_ns = time.time_ns


def new_job_id() -> str:
    """16 characters of `-0-9A-Z_a-z`: 96 bits, big-endian, in order-preserving base64 (so ids
    sort by creation time): creation ms (44 bits, to year 2527; the first character is a digit
    until 2065 and never '-'), a per-process sequence (16 bits: jobs due at the same ms are
    claimed in enqueue order, since the due set orders ties by id) and 36 random bits. Made by
    the client, so enqueue_many returns ids without a round trip and a re-sent enqueue names
    the same job. Reserved for a partition tag: a prefix ending in '.' (not in this alphabet),
    e.g. `p3.` + the 16 characters. Caller-given ids stay valid (keys.check_job_id)."""
    with _lock:
        ms = _time_ns() // 1_000_000
        last_ms, seq = _last
        if ms > last_ms:
            # A random start (two processes at one ms rarely share a number), in the lower
            # half: 32,768 more ids fit in this ms before the next rule.
            seq = _rng.getrandbits(15)
        else:  # the same ms, or the clock stepped back: still after the last id
            ms, seq = last_ms, seq + 1
            if seq > 0xFFFF:  # 65,536 in one ms: borrow the next ms rather than wrap
                ms, seq = ms + 1, 0
        _last[0], _last[1] = ms, seq
    n = ms << 52 | seq << 36 | _rng.getrandbits(36)
    return _b2a(n.to_bytes(12, "big"), newline=False).translate(_TO_SORTED).decode()


class MadeId(str):
    """An id a client made for a job (a partitioned queue's, tagged with its partition), not
    one the caller chose: a debounced job takes it (codec refuses a caller's: every call with
    it would be a re-send)."""

    __slots__ = ()

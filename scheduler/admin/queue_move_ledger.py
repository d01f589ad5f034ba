"""What one `scheduler queue move` run remembers between its batches, kept on disk: the ids it
moved, each source partition's idempotency keys by the job id they name, and the keys a batch
carried (scheduler/admin/queue_move_keys.py). Held in memory these grew with the queue: about
200 bytes a moved job, 400 with a key, so a 10-million-job move needed gigabytes. SQLite's
private temporary database (the empty file name) keeps a bounded page cache in memory, spills the
rest to a temporary file and deletes it when the connection closes or is collected."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterable, Sequence

CHUNK = 500  # ids or keys a statement names: under SQLite's bound parameters (999 before 3.32)

_SCHEMA = """
CREATE TABLE moved (id TEXT PRIMARY KEY) WITHOUT ROWID;
CREATE TABLE named (part TEXT, jid TEXT, key TEXT, PRIMARY KEY (part, jid, key)) WITHOUT ROWID;
CREATE TABLE carried (part TEXT, key TEXT, PRIMARY KEY (part, key)) WITHOUT ROWID;
CREATE TABLE indexed (part TEXT PRIMARY KEY) WITHOUT ROWID;
"""


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), CHUNK):
        yield items[i : i + CHUNK]


def _marks(n: int) -> str:
    return ",".join("?" * n)


class MoveLedger:
    """One run's scratch store; opened at its first write (a dry run opens none)."""

    def __init__(self) -> None:
        self._db: sqlite3.Connection | None = None

    @property
    def db(self) -> sqlite3.Connection:
        if self._db is None:
            # Scratch data, rebuilt by a rerun from Redis: no journal, no fsync.
            db = sqlite3.connect("", isolation_level=None)
            db.execute("PRAGMA journal_mode = OFF")
            db.execute("PRAGMA synchronous = OFF")
            db.executescript(_SCHEMA)
            self._db = db
        return self._db

    def close(self) -> None:
        if self._db is not None:
            self._db.close()
            self._db = None

    def add_moved(self, ids: Iterable[str]) -> None:
        self.db.executemany("INSERT OR IGNORE INTO moved VALUES (?)", ((i,) for i in ids))

    def any_moved(self) -> bool:
        row = None if self._db is None else self._db.execute("SELECT 1 FROM moved").fetchone()
        return row is not None

    def moved_of(self, ids: Sequence[str]) -> set[str]:
        """Those of `ids` this run moved."""
        found: set[str] = set()
        for part in _chunks(ids):
            sql = f"SELECT id FROM moved WHERE id IN ({_marks(len(part))})"
            found.update(row[0] for row in self.db.execute(sql, part))
        return found

    def moved_of_set(self, ids: set[str]) -> set[str]:
        return self.moved_of(sorted(ids))

    def indexed(self, part: str) -> bool:
        row = self.db.execute("SELECT 1 FROM indexed WHERE part = ?", (part,)).fetchone()
        return row is not None

    def index(self, part: str, named: Iterable[tuple[str, str]]) -> None:
        """`part`'s (key, job id it names) pairs, streamed in."""
        rows = ((part, jid, key) for key, jid in named)
        self.db.executemany("INSERT OR IGNORE INTO named VALUES (?, ?, ?)", rows)
        self.db.execute("INSERT OR IGNORE INTO indexed VALUES (?)", (part,))

    def named_of(self, part: str, ids: Sequence[str]) -> list[tuple[str, str]]:
        """(job id, key) of the indexed keys of `part` naming one of `ids`, left in the index."""
        pairs: list[tuple[str, str]] = []
        for chunk in _chunks(ids):
            sql = f"SELECT jid, key FROM named WHERE part = ? AND jid IN ({_marks(len(chunk))})"
            pairs += self.db.execute(sql, (part, *chunk)).fetchall()
        return pairs

    def pop_named(self, part: str, ids: Sequence[str]) -> list[str]:
        """The indexed keys of `part` naming one of `ids`, taken out of the index."""
        keys: list[str] = []
        for chunk in _chunks(ids):
            where = f"part = ? AND jid IN ({_marks(len(chunk))})"
            args = (part, *chunk)
            keys += [r[0] for r in self.db.execute(f"SELECT key FROM named WHERE {where}", args)]
            self.db.execute(f"DELETE FROM named WHERE {where}", args)
        return keys

    def add_carried(self, part: str, keys: Iterable[str]) -> None:
        rows = ((part, key) for key in keys)
        self.db.executemany("INSERT OR IGNORE INTO carried VALUES (?, ?)", rows)

    def carried_of(self, part: str, keys: Sequence[str]) -> set[str]:
        """Those of `keys` a batch of `part` carried."""
        found: set[str] = set()
        for chunk in _chunks(keys):
            sql = f"SELECT key FROM carried WHERE part = ? AND key IN ({_marks(len(chunk))})"
            found.update(row[0] for row in self.db.execute(sql, (part, *chunk)))
        return found

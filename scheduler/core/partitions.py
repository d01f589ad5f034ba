"""One logical queue over N partitions (sans-I/O): the stored layout record, the sub-queue
names (spread over the cluster's slots), and the routing of a job, a key or a schedule to its
partition. The client that uses it is scheduler/client/partitioned.py.

- N is fixed at creation and stored in `sched:{<queue>}:partitions` as
  `1|<n>|<name0>,<name1>,...` (format version 1); a different N later is refused.
- Partition k is the ordinary queue `<queue>.p<k>` (or `<queue>.p<k>.<j>`, the first j whose
  hash slot falls in the k-th of N equal slot ranges), so on a cluster with evenly assigned
  slots the partitions spread over every primary. Those names are reserved.
- A job's id tells its partition: a generated id is `p<k>.` + ids.new_job_id() (the prefix the
  id alphabet reserves for it); any other id (chosen by the caller) goes to crc32(id) % N.
  A job with an idempotency key goes to crc32(key) % N, so the key stays unique; a caller's
  job_id must then route to the same partition (BadArgument otherwise). A job with parents
  (`after=`) goes to their partition (a flow's keys are one partition's), which its key or id
  must then name too; parents in different partitions are refused (BadArgument).
- A schedule lives in one partition: crc32(name) % N (exactly one pending run still holds);
  its runs' ids ('schedule:<name>:<slot>') route there too."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from redis.crc import key_slot

from scheduler.core.codec import new_job_id
from scheduler.core.errors import BadArgument, UnreadableRecord
from scheduler.core.ids import MadeId
from scheduler.core.keys import QueueKeys, check_new_job_id, check_queue_name
from scheduler.core.limits import SCHEDULE_NAME_RE

MAX_PARTITIONS = 1024
SLOTS = 16384
# Room for ".p1023.9999" after the logical name within the 64 characters of a queue name.
MAX_LOGICAL_NAME = 52
_VERSION = "1"
_TAGGED = re.compile(r"^p(\d{1,4})\.(.+)$")
# A recurring schedule's run, 'schedule:<name>:<slot ms>' (lua/lib/schedule.lua): its
# schedule's partition, not its id's hash (its dead letter, job record and flow live there).
_OCCURRENCE = re.compile(r"schedule:([A-Za-z0-9_.\-]{1,64}):\d+")
# The names sub_queue_names makes: <logical>.p<k> or <logical>.p<k>.<j> (group 1: logical).
PARTITION_NAME = re.compile(r"^(.+)\.p\d{1,4}(?:\.\d{1,6})?$")


class OtherType:
    """A reserved_keys() value that is a key of another type (a hand edit; the read answered
    WRONGTYPE): check_reserved takes it as present for a partition, as a record that cannot be
    read for the parent."""


OTHER_TYPE = OtherType()


class PartitionMismatch(BadArgument):
    """The queue exists with another partition count (or unpartitioned, or as a plain queue)."""


def meta_key(queue: str) -> str:
    """Where the layout record lives: in the logical queue's own slot."""
    return QueueKeys(queue).prefix + "partitions"


def check_count(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_PARTITIONS:
        raise BadArgument(f"partitions must be an int in [1, {MAX_PARTITIONS}], got {n!r}")
    return n


def _digits(text: str) -> bool:
    return text.isascii() and text.isdigit()  # str.isdigit alone takes '²', which int() refuses


def _hash(text: str) -> int:
    # A lone surrogate cannot be encoded: the id / key / name check's typed error, not
    # UnicodeEncodeError from the routing that runs before it.
    try:
        return zlib.crc32(text.encode("utf-8"))
    except UnicodeEncodeError as exc:
        raise BadArgument(f"{text!r:.80} is not valid Unicode text: {exc.reason}") from None


def sub_queue_names(queue: str, n: int) -> list[str]:
    """The N partition names: partition k's hash slot in [k*16384/N, (k+1)*16384/N)."""
    check_queue_name(queue)
    check_count(n)
    if len(queue) > MAX_LOGICAL_NAME:
        raise BadArgument(
            f"a partitioned queue's name is at most {MAX_LOGICAL_NAME} characters: {queue!r}"
        )
    names = []
    for k in range(n):
        low, high = k * SLOTS // n, (k + 1) * SLOTS // n
        for j in range(100_000):
            name = f"{queue}.p{k}" if j == 0 else f"{queue}.p{k}.{j}"
            if low <= key_slot(QueueKeys(name).prefix.encode()) < high:
                names.append(name)
                break
        else:  # pragma: no cover - every range of >= 16 slots is hit within a few hundred
            raise RuntimeError(f"no name for partition {k} of {n}")
    return names


@dataclass(frozen=True)
class Layout:
    """A logical queue's partitions, as stored."""

    queue: str
    names: tuple[str, ...]

    @property
    def n(self) -> int:
        return len(self.names)

    def record(self) -> str:
        return f"{_VERSION}|{self.n}|{','.join(self.names)}"

    @classmethod
    def create(cls, queue: str, n: int) -> Layout:
        return cls(queue, tuple(sub_queue_names(queue, n)))

    @classmethod
    def parse(cls, queue: str, text: str) -> Layout:
        """The stored record; UnreadableRecord (a BadArgument) when it is not one this version
        wrote."""
        parts = str(text).split("|")
        if len(parts) != 3 or parts[0] != _VERSION or not _digits(parts[1]):
            raise UnreadableRecord(f"unreadable partition record of queue {queue!r}: {text!r:.200}")
        names = tuple(parts[2].split(","))
        if len(names) != int(parts[1]):
            raise UnreadableRecord(f"partition record of {queue!r} lists {len(names)} names")
        try:
            for name in names:
                check_queue_name(name)
        except BadArgument as exc:
            raise UnreadableRecord(f"partition record of {queue!r}: {exc}") from None
        return cls(queue, names)

    def partition_of_id(self, job_id: str) -> int:
        """The partition a job id belongs to (module docstring); BadArgument for a non-str.
        Any str routes (the dead list may hold ids no API would make: requeue and purge of
        those still go to their partition); what the call does checks the id further."""
        if not isinstance(job_id, str):
            raise BadArgument(f"invalid job id {job_id!r:.80}: a job id is a str")
        m = _TAGGED.match(job_id)
        if m is not None and int(m.group(1)) < self.n:
            return int(m.group(1))
        if (run := _OCCURRENCE.fullmatch(job_id)) is not None:
            return self.partition_of_schedule(run.group(1))
        return _hash(job_id) % self.n

    def partition_of_key(self, key: str) -> int:
        if not isinstance(key, str) or not 1 <= len(key) <= 512:
            raise BadArgument("key must be a string of 1-512 characters")
        return _hash("key:" + key) % self.n

    def partition_of_schedule(self, name: str) -> int:
        if not isinstance(name, str):
            raise BadArgument(f"invalid schedule name {name!r:.80}: a name is a str")
        return _hash("schedule:" + name) % self.n

    def schedule_run(self, name: str, job_id: str | None) -> tuple[int, str]:
        """(partition, job id) of a schedule's run now: the schedule's partition, and a new id
        tagged with it, so the job's own calls find it; a caller's id must route there."""
        k = self.partition_of_schedule(name)
        if job_id is None:
            return k, f"p{k}.{new_job_id()}"
        check_new_job_id(job_id)  # a malformed id is that, not one routed elsewhere
        if self.partition_of_id(job_id) != k:
            raise BadArgument(
                f"job_id {job_id!r} routes to another partition of {self.queue!r} than schedule "
                f"{name!r} (p{k}): give an id tagged 'p{k}.'"
            )
        return k, job_id

    def route(
        self, key: str | None, job_id: str | None, spread: int, after: Any = None
    ) -> tuple[int, str]:
        """(partition, job id) of a new job; `spread` picks the partition of a job with
        neither key, id nor parents (the caller's round robin), so batches fill every
        partition. `after`: the job's parents, whose partition it must be in."""
        home = self._parents_home(after)
        if job_id is not None:
            check_new_job_id(job_id)  # a malformed id is that, not one routed elsewhere
        if key is not None:
            k = self.partition_of_key(key)
            if job_id is not None and self.partition_of_id(job_id) != k:
                raise BadArgument(
                    f"job_id {job_id!r} and key {key!r} route to different partitions of "
                    f"{self.queue!r}: give only one, or an id tagged 'p{k}.'"
                )
            self._check_home(home, k, f"key {key!r}")
            return k, job_id or MadeId(f"p{k}.{new_job_id()}")
        if job_id is not None:
            k = self.partition_of_id(job_id)
            self._check_home(home, k, f"job_id {job_id!r}")
            return k, job_id
        k = spread % self.n if home is None else home
        return k, MadeId(f"p{k}.{new_job_id()}")

    def _parents_home(self, after: Any) -> int | None:
        """The one partition of the parents, None without any. A malformed `after` is left to
        the job's own check (core/flow.py check_flow), which refuses it before anything is
        sent."""
        if after is None or isinstance(after, str) or not isinstance(after, Sequence):
            return None
        homes = {self.partition_of_id(p) for p in after}
        if len(homes) > 1:
            raise BadArgument(
                f"after= names jobs of different partitions of {self.queue!r} "
                f"({', '.join(f'p{k}' for k in sorted(homes))}): a job and its parents must "
                "share one partition"
            )
        return homes.pop() if homes else None

    def _check_home(self, home: int | None, k: int, what: str) -> None:
        if home is not None and home != k:
            raise BadArgument(
                f"{what} routes to partition p{k} of {self.queue!r}, its parents (after=) are "
                f"in p{home}: a job and its parents must share one partition"
            )

    def check_schedule_home(self, queue: str, name: str) -> None:
        """BadArgument when `queue` is one of these partitions and schedule `name` routes to
        another: defined there too, the logical queue would hold two schedules of that name
        (two pending runs; a remove by name finds one). A malformed name is the op's to refuse."""
        if queue not in self.names or not isinstance(name, str):
            return
        home = self.names[self.partition_of_schedule(name)]
        if home != queue and SCHEDULE_NAME_RE.fullmatch(name):
            raise BadArgument(
                f"schedule {name!r} belongs in {home!r}, not {queue!r}: both are partitions of "
                f"{self.queue!r}, whose schedules live in one partition each, by name; define "
                f"it on {self.queue!r}; nothing written"
            )

    def mismatch(self, asked: int) -> PartitionMismatch:
        return PartitionMismatch(
            f"queue {self.queue!r} was created with {self.n} partitions, not {asked}: the "
            "count is fixed at creation (README 'Partitioned queues' says how to migrate)"
        )

    def reserved_keys(self) -> list[str]:
        """What a create of this layout reads before writing its record (check_reserved): the
        layout record of the queue its name may be a partition of (PARTITION_NAME), then each
        of its partitions' own."""
        m = PARTITION_NAME.match(self.queue)
        return ([meta_key(m.group(1))] if m else []) + [meta_key(p) for p in self.names]

    def check_reserved(self, records: Sequence[Any]) -> None:
        """PartitionMismatch (nothing written) when creating this layout would take a reserved
        name: its own is a partition of a partitioned queue, or one of its partitions is
        partitioned itself (every write into that partition would be refused, 'is
        partitioned'). `records`: the values at reserved_keys(), None for a missing key,
        OTHER_TYPE for a key of another type."""
        rows = [
            r.decode("utf-8", "backslashreplace") if isinstance(r, bytes) else r for r in records
        ]
        if m := PARTITION_NAME.match(self.queue):
            parent, raw = m.group(1), rows.pop(0)
            try:
                if isinstance(raw, OtherType):
                    raise UnreadableRecord("a key of another type")
                taken = raw is not None and self.queue in Layout.parse(parent, str(raw)).names
            except UnreadableRecord as exc:  # a hand edit: it may be one, refused
                raise PartitionMismatch(
                    f"{self.queue!r} may be a partition of {parent!r}, whose layout record "
                    f"cannot be read ({exc}): see `scheduler doctor`; nothing written"
                ) from None
            if taken:
                raise PartitionMismatch(
                    f"{self.queue!r} is a partition of the partitioned queue {parent!r} (a "
                    "reserved name): pick another name; nothing written"
                )
        for name, raw in zip(self.names, rows, strict=True):
            if raw is not None:
                raise PartitionMismatch(
                    f"a partition of {self.queue!r} would be {name!r}, a partitioned queue "
                    "itself (a partition's name is reserved): pick another name; nothing written"
                )

"""The queue's own settings in its `config` hash, one setter each (`ConfigOps`, a mixin of
DeadLetterOps, so `Ops` has them): the opt-in dead-letter retention (lua/dead_retention.lua)
and `priority_aging_ms`, claim's aging time (lib/flow.lua flow_aging; docs/flow-control.md
"Priorities").

Every script reads its own queue's config hash: a partitioned queue's partitions never read
the logical name's, so both setters refuse that name (a PartitionedQueue sets each partition's
instead) rather than write a value no claim would see."""

from __future__ import annotations

from redis.exceptions import ResponseError

from scheduler.core import codec
from scheduler.core.errors import BadArgument, CorruptKey, newer_storage
from scheduler.core.keys import STORAGE_GENERATION
from scheduler.operations.requests import Commands, Op, OpsBase, Script

AGING_FIELD = "priority_aging_ms"


def _setting_arg(value: int | None, name: str, lo: int, hi: int) -> str:
    """The value as sent ('' for None: the field cleared), BadArgument out of [lo, hi]."""
    if value is None:
        return ""
    codec._int(value, name)
    if not lo <= value <= hi:
        raise BadArgument(f"{name} must be in [{lo}, {hi}] or None, got {value}")
    return str(value)


class ConfigOps(OpsBase):
    """The queue's settings; documented for users on Queue.set_dead_retention and
    Queue.set_priority_aging."""

    def set_dead_retention(
        self, max_age_ms: int | None = None, max_count: int | None = None
    ) -> Op[None]:
        """Opt-in retention of this queue's dead letters (None: no limit; both None, the
        default, keeps every dead letter). Applied as jobs die and by claims, at most 100 of the
        oldest deleted per park or claim call, counted in stats as `dead_trimmed`."""
        age = _setting_arg(max_age_ms, "max_age_ms", 1, codec.MAX_TIME_MS)
        count = _setting_arg(max_count, "max_count", 0, codec.MAX_SAFE_INT)
        yield Script("dead_retention", [age, count])

    def check_dead_retention(
        self, max_age_ms: int | None = None, max_count: int | None = None
    ) -> Op[None]:
        """set_dead_retention's refusals alone, as plain commands (dead_retention.lua's: a
        partitioned queue's own name, a newer version's storage; a config of another type fails
        its first write), nothing written: asked of every partition before any is written."""
        _setting_arg(max_age_ms, "max_age_ms", 1, codec.MAX_TIME_MS)
        _setting_arg(max_count, "max_count", 0, codec.MAX_SAFE_INT)
        yield from self._config_refusals()

    def set_priority_aging(self, priority_aging_ms: int | None) -> Op[None]:
        """Write (None: delete, the 60 s default) the config field `priority_aging_ms` in the
        range claim reads (lib/flow.lua flow_aging: 0 .. 3650 days; 0 serves every due job in
        run_at order). Checked before the first request. Plain commands, no script: the same
        refusals as dead_retention.lua's (a partitioned queue's own name: BadArgument; a newer
        version's storage: NewerStorage; a config of another type: CorruptKey), read first,
        nothing written then. A setting, not a job's transition: a check and a write apart
        race only another operator's create or upgrade of the same queue."""
        value = _setting_arg(priority_aging_ms, AGING_FIELD, 0, codec.MAX_DELAY_MS)
        yield from self._config_refusals()
        cfg = self.keys.config
        write = ("HSET", cfg, AGING_FIELD, value) if value else ("HDEL", cfg, AGING_FIELD)
        yield Commands([write])

    def check_priority_aging(self, priority_aging_ms: int | None) -> Op[None]:
        """set_priority_aging's refusals alone, nothing written: asked of every partition of a
        partitioned queue before any is written (else one partition's config of another type is
        refused after the others took the value)."""
        _setting_arg(priority_aging_ms, AGING_FIELD, 0, codec.MAX_DELAY_MS)
        yield from self._config_refusals()

    def _config_refusals(self) -> Op[None]:
        cfg = self.keys.config
        try:
            parted, generation = yield Commands(
                [("EXISTS", self.keys.prefix + "partitions"), ("HGET", cfg, "generation")]
            )
        except ResponseError as exc:
            if not str(exc).startswith("WRONGTYPE"):
                raise
            raise CorruptKey(
                f"{cfg} is not a hash (edited by hand): nothing written; see `scheduler doctor`"
            ) from None
        if int(parted):
            raise BadArgument(
                f"queue={self.keys.queue[:80]} is partitioned: open it with"
                " scheduler.open_queue (a plain Queue would write where no worker looks)"
            )
        if (refused := newer_storage(self.keys.queue, generation, STORAGE_GENERATION)) is not None:
            raise refused

"""Producing: enqueue one job or many (lua/enqueue.lua)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from redis.exceptions import ResponseError

from scheduler.core import codec
from scheduler.core.backoff import Backoff
from scheduler.core.errors import BadArgument, NewerStorage, NotDurable, SchedulerError
from scheduler.core.models import JobSpec
from scheduler.operations.enqueue_calls import enqueue_calls
from scheduler.operations.requests import Op, OpsBase, Script, ScriptPipeline


class ProducingOps(OpsBase):
    """Enqueueing; documented for users on Queue.enqueue / Queue.enqueue_many."""

    def enqueue(
        self,
        task: str,
        payload: Any = None,
        *,
        delay_ms: int | None = None,
        run_at: datetime | None = None,
        max_attempts: int = 5,
        backoff: Backoff | None = None,
        key: str | None = None,
        jitter_ms: int = 0,
        timeout_ms: int = 0,
        job_id: str | None = None,
        result_ttl_ms: int | None = None,
        keep_payload: bool = False,
        priority: int = 0,
        concurrency_key: str | None = None,
        concurrency_limit: int | None = None,
        rate_limit: Any = None,
        rate_key: str | None = None,
        after: Sequence[str] | None = None,
        start_within_ms: int | None = None,
        key_ttl_ms: int | None = None,
        debounce: bool = False,
    ) -> Op[str]:
        """One job: `enqueue_many` of one JobSpec; returns its id."""
        spec = JobSpec(
            task,
            payload,
            delay_ms,
            run_at,
            max_attempts,
            backoff,
            key,
            jitter_ms,
            timeout_ms,
            job_id,
            result_ttl_ms,
            keep_payload,
            priority,
            concurrency_key,
            concurrency_limit,
            rate_limit,
            rate_key,
            after,
            start_within_ms,
            key_ttl_ms,
            debounce,
        )
        return (yield from self.enqueue_spec(spec))

    def enqueue_spec(self, spec: JobSpec) -> Op[str]:
        """`enqueue` of a JobSpec."""
        if self.settings.wait_replicas > 0:
            ids = yield from self.enqueue_many([spec])
            return ids[0]
        # One job, one script call: not through enqueue_many's batching (issue 16: ~2 us).
        args = codec.enqueue_args([spec], self.settings.max_payload_bytes)
        return codec.parse_enqueue((yield Script("enqueue", args)), args)[0]

    def batchable(self, spec: JobSpec) -> list[str] | None:
        """The checked enqueue.lua fields of a job that may share a script call with other
        callers' (client/enqueue_batcher.py), or None: a debounced job (one call debounces a
        key once) and a queue that waits for replicas (its reply is the batch's) go alone."""
        if self.settings.wait_replicas > 0 or spec.debounce is True:
            return None
        return codec.enqueue_fields(spec, self.settings.max_payload_bytes)

    def enqueue_call(self, args: list[str]) -> Op[Any]:
        """One enqueue.lua call of ready arguments (client/enqueue_batcher.py); its raw reply."""
        return (yield Script("enqueue", args))

    def enqueue_many(self, specs: Iterable[JobSpec], batch_size: int = 1000) -> Op[list[str]]:
        """Ids in the order of `specs`. Every spec is checked before any batch is sent
        (BadArgument / InvalidPayload refuse the whole call); NotDurable when the asked
        replicas did not acknowledge in time."""
        if isinstance(specs, str | bytes | dict) or not isinstance(specs, Iterable):
            raise BadArgument(f"specs must be an iterable of JobSpec, got {specs!r:.80}")
        specs = list(specs)
        codec.check_int(batch_size, "batch_size")
        _check_debounced(specs)
        if not specs:  # nothing to store: no call (under wait_replicas a lone WAIT and a mark)
            return []
        st = self.settings
        batches, in_turn = enqueue_calls(specs, batch_size, st.max_payload_bytes)
        wait = (st.wait_replicas, st.wait_timeout_ms) if st.wait_replicas > 0 else None
        # A parent in an earlier call: calls one at a time (a pipeline's order does not survive
        # a racing SCRIPT LOAD), each naming the job a reply gave for a parent whose key was taken.
        if in_turn:
            return (yield from _enqueue_in_turn(batches, wait))
        if len(batches) == 1 and wait is None:
            replies = [(yield Script("enqueue", batches[0]))]
        else:
            # All batches in one pipeline: Redis runs one while the next is still arriving.
            try:
                replies = yield ScriptPipeline([Script("enqueue", a) for a in batches], wait)
            except (SchedulerError, ResponseError) as exc:  # a refused batch: others written
                got = getattr(exc, "pipeline_replies", None)
                if got is not None:
                    _note_written(exc, [_ids_of(a, r) for a, r in zip(batches, got, strict=False)])
                raise
        ids: list[str] = []
        for args, reply in zip(batches, replies, strict=False):
            ids.extend(codec.parse_enqueue(reply, args))
        if wait is not None:
            acked = int(replies[-1])
            # One connection: its WAIT covers every job found there only when a batch wrote.
            if acked >= wait[0] and not any(map(_wrote, replies[:-1])):
                acked = yield from _mark_and_wait(ids, wait)
            if acked < wait[0]:
                raise NotDurable(ids, acked, wait[0])
        return ids


_W = codec.ENQUEUE_FIELDS


def _ids_of(args: list[str], reply: Any) -> list[str]:
    """A batch's ids as its reply gives them, or '' for each of its jobs when refused."""
    refused = isinstance(reply, BaseException)
    return [""] * int(args[0]) if refused else codec.parse_enqueue(reply, args)


def _note_written(exc: BaseException, batches: list[list[str]]) -> None:
    """A refused call's error carries what its other batches wrote: `written_ids`, and per
    spec `partial_ids` ('' where not written), so a caller re-sends only the others."""
    partial = [i for ids in batches for i in ids]
    written = [i for i in partial if i]
    setattr(exc, "partial_ids", partial)  # noqa: B010 - an attribute of any exception
    setattr(exc, "written_ids", written)  # noqa: B010
    if written:
        exc.add_note(f"{len(written)} job(s) of this call were written: the error's written_ids")


def _wrote(reply: Any) -> bool:
    """An enqueue.lua reply's flags name a job it wrote: 'c' created or 'u' debounced into an
    earlier one; 'e' (already there: by id, or an idempotency key's) writes nothing."""
    flags = codec.s(reply[0])
    return "c" in flags or "u" in flags


def _mark_and_wait(ids: list[str], wait: tuple[int, int]) -> Op[int]:
    """A WAIT that covers jobs an enqueue found already there and did not write: WAIT counts
    from its connection's last write (a new connection's: none, acknowledged by every replica
    at once), so a re-send after NotDurable was answered as durable while only the primary had
    the job. lua/durable_mark.lua writes (and deletes) one key of the queue, after those jobs in
    the replication stream, and the WAIT counts from it. A refused write (NOREPLICAS, OOM,
    READONLY) is NotDurable with no acknowledgement."""
    try:
        _, acked = yield ScriptPipeline([Script("durable_mark", [])], wait)
    except NewerStorage:
        raise
    except ResponseError as exc:
        raise NotDurable(ids, 0, wait[0]) from exc
    return int(acked)


def _check_debounced(specs: list[Any]) -> None:
    """One call debounces a key once, and not after another of its jobs took that key (it would
    replace a job of the same call: enqueue.lua refuses both, per script call)."""
    seen: set[str] = set()
    for s in specs:
        if not isinstance(s, JobSpec) or s.key is None:
            continue
        k = repr(s.key)
        if s.debounce is True and k in seen:
            raise BadArgument(
                "debounce: a key may be debounced once per call, and not after another job "
                "of the call with that key"
            )
        seen.add(k)


def _with_parents_renamed(
    args: list[str], alias: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The batch with each parent of an earlier batch whose key was taken renamed to the job the
    key names, and those renames (substitute -> name as given). A parent that a job earlier in
    this batch names as its own id is left to the server (its in-call alias), as in one call."""
    out = list(args)
    renamed: dict[str, str] = {}
    mine: set[str] = set()
    for b in range(1, len(out), _W):
        flow = out[b + 12]
        if flow:
            head, _, parents = flow.rpartition("|")
            names = []
            for p in parents.split():
                sub = alias.get(p) if p not in mine else None
                if sub is not None:
                    renamed[sub] = p
                names.append(sub or p)
            out[b + 12] = head + "|" + " ".join(names)
        mine.add(out[b])
    return out, renamed


def _named_as_given(message: str, renamed: dict[str, str]) -> str:
    # enqueue.lua names the parent as sent; say which name of the call stood for it, as the
    # server does within one call (lib/flow.lua flow_parents).
    for sub, name in renamed.items():
        message = message.replace(
            f"after={sub} ", f"after={name} (its idempotency key names {sub}) "
        )
    return message


def _enqueue_in_turn(batches: list[list[str]], wait: tuple[int, int] | None) -> Op[list[str]]:
    """One batch per round trip, each naming, for a parent of an earlier batch whose key was
    taken, the job the earlier reply gave for it (so the child waits for that job instead of
    being refused). A batch the server refuses is not written and the later ones are not sent;
    the earlier ones stay written. With `wait`, each batch carries its own WAIT (the batches may
    go out on different pooled connections) until one comes back short: NotDurable is then
    certain, with the fewest acknowledgements, and the rest go without one."""
    ids: list[str] = []
    alias: dict[str, str] = {}
    acked: int | None = None
    covered = True  # the last batch wrote: its WAIT (and the earlier ones) covered every job
    for k, args in enumerate(batches):
        renamed: dict[str, str] = {}
        if alias:
            args, renamed = _with_parents_renamed(args, alias)
        short = wait is not None and acked is not None and acked < wait[0]
        try:
            if wait is None or short:
                reply = yield Script("enqueue", args)
            else:
                reply, n = yield ScriptPipeline([Script("enqueue", args)], wait)
                acked = int(n) if acked is None else min(acked, int(n))
                covered = _wrote(reply)
        except (SchedulerError, ResponseError) as exc:  # the earlier batches stay written
            unsent = [_ids_of(a, exc) for a in batches[k:]]
            if not (renamed and isinstance(exc, BadArgument)):
                _note_written(exc, [ids, *unsent])
                raise
            named = type(exc)(_named_as_given(str(exc), renamed))
            _note_written(named, [ids, *unsent])
            raise named from None
        got = codec.parse_enqueue(reply, args)
        for b, final in zip(range(1, len(args), _W), got, strict=True):
            if final != args[b]:
                alias[args[b]] = final
        ids.extend(got)
    if wait is not None and acked is not None:
        # A batch's write comes after every earlier job in the replication stream, on whichever
        # connection: only a last batch that wrote nothing leaves jobs no WAIT covered.
        if acked >= wait[0] and not covered:
            acked = yield from _mark_and_wait(ids, wait)
        if acked < wait[0]:
            raise NotDurable(ids, acked, wait[0])
    return ids

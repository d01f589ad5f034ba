"""The app developer's API across its twins (Queue, AsyncQueue, PartitionedQueue,
AsyncPartitionedQueue, TaskHandle): what one returns, the others accept and return alike."""

from __future__ import annotations

import asyncio
import gc
import importlib
import inspect
import pathlib
import pkgutil
import re
import time
import warnings
from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime
from typing import Any

import pytest
import redis

from scheduler import (
    AsyncQueue,
    BadArgument,
    InvalidPayload,
    JobNotFound,
    Queue,
    Registry,
    ScheduleNotFound,
    StaleToken,
    UnreadableRecord,
    open_queue,
    open_queue_async,
)
from scheduler._spawn import RedisProcess
from scheduler.client.partitioned import PartitionedQueue
from scheduler.client.partitioned_aio import AsyncPartitionedQueue
from scheduler.core.connection import connect_async
from scheduler.core.models import JobSpec
from tests.conftest import dump_queue
from tests.test_parity import undocumented

ROOT = pathlib.Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.pq(partitions=2, suffix="-p")  # beside the plain queue `q` of queue_name


def test_a_partitioned_queues_ids_are_plain_str_its_own_calls_accept(
    pq: PartitionedQueue, redis_url: str
) -> None:
    """A partitioned enqueue made its ids as a str subclass (core/ids.py MadeId, which marks
    them for debounce) and returned it as is, while the lease calls accept exactly str: the
    id enqueue returned, given to complete / fail / heartbeat / release with the claim's
    token, was refused 'job id and token must be str'. Every id handed out is a plain str."""
    reg = Registry()

    @reg.task(name="t")
    def t(payload: object, ctx: object) -> None:
        pass

    pq.schedule("s", "t", every_ms=3_600_000)
    ids = [
        pq.enqueue("t", {}),
        *pq.enqueue_many([JobSpec("t", {}), JobSpec("t", {}, key="k")]),
        t.enqueue(pq, {}),
        pq.run_schedule_now("s"),
    ]

    async def made_async() -> list[str]:
        ac = connect_async(redis_url)
        try:
            apq = await AsyncPartitionedQueue.open(ac, pq.name)
            return [
                await apq.enqueue("t", {}),
                *(await apq.enqueue_many([JobSpec("t", {})])),
                await t.aenqueue(apq, {}),
                await apq.run_schedule_now("s"),
            ]
        finally:
            await ac.aclose()

    ids += asyncio.run(made_async())
    assert [type(i) for i in ids] == [str] * len(ids), ids

    job_id = ids[0]
    part = pq.part_of(job_id)
    claimed = {j.id: j.token for p in pq.parts for j in p.claim("w", limit=100).jobs}
    token = claimed[job_id]
    assert part.heartbeat([(job_id, token)])[1] == {job_id: "held"}
    pq.complete(job_id, token, {"ok": 1})
    with pytest.raises(StaleToken):
        pq.complete(ids[1], "not-its-token")
    assert pq.part_of(ids[1]).release([(ids[1], claimed[ids[1]])]) == ["released"]


def test_a_str_subclass_job_id_comes_back_as_str(q: Queue, redis_url: str) -> None:
    """A caller's own str subclass as job_id (an id type of the application) is returned as
    a plain str, the id the lease calls take."""

    class OrderId(str):
        pass

    got = q.enqueue("t", {}, job_id=OrderId("order-1"))
    assert type(got) is str and got == "order-1"

    async def main() -> str:
        aq = AsyncQueue(connect_async(redis_url), q.name)
        try:
            return await aq.enqueue("t", {}, job_id=OrderId("order-2"))
        finally:
            await aq.aclose()

    got = asyncio.run(main())
    assert type(got) is str and got == "order-2"


def test_open_queue_on_a_url_closes_like_a_queue_whichever_kind_it_opens(
    module_server: RedisProcess,
) -> None:
    """open_queue / open_queue_async on a URL make a connection the caller closes; a plain
    queue closes with `with` / `close()` (`async with` / `aclose()`), and a partitioned one had
    neither: `with open_queue(url, name) as q:` raised TypeError once the name was partitioned,
    and its connection could only be closed through `q.client`."""
    admin = module_server.client()
    PartitionedQueue.create(admin, "parted", partitions=2)

    def clients(want: int) -> int:
        """The server's client count, once it is `want` (or after 2 s)."""
        deadline = time.monotonic() + 2
        while (n := len(admin.client_list())) != want and time.monotonic() < deadline:
            time.sleep(0.01)
        return n

    gc.collect()
    base = len(admin.client_list())
    for name in ("parted", "plain"):
        with open_queue(module_server.url, name) as q:
            q.enqueue("t", {})
            assert clients(base + 1) == base + 1
        assert clients(base) == base, name
        opened = open_queue(module_server.url, name)
        opened.counts()
        opened.close()
        assert clients(base) == base, name

    async def main() -> None:
        for name in ("parted", "plain"):
            async with await open_queue_async(module_server.url, name) as aq:
                await aq.enqueue("t", {})
                assert clients(base + 1) == base + 1
            assert clients(base) == base, name
            opened = await open_queue_async(module_server.url, name)
            await opened.counts()
            await opened.aclose()
            assert clients(base) == base, name

    asyncio.run(main())


def test_the_partitioned_twins_refuse_the_wrong_kind_of_client_as_queue_does(
    client: redis.Redis, redis_url: str, pq: PartitionedQueue
) -> None:
    """Queue and AsyncQueue refuse a client of the other kind (or a URL) with a BadArgument
    saying which kind they need. The partitioned twins and the open_queue factories read the
    layout first: a redis.asyncio client given to the blocking ones made its GET a coroutine,
    reported as UnreadableRecord ('unreadable partition record', as if the stored record were
    corrupt) with a RuntimeWarning, a blocking one given to the asyncio ones a TypeError
    ('object NoneType can't be used in await expression'); a URL an AttributeError."""
    queue_name = pq.name
    fresh = queue_name + "-new"

    async def main() -> None:
        aclient = connect_async(redis_url)
        wrong: Any = aclient  # each call below is given the kind its signature does not take
        url: Any = redis_url
        try:
            refused_sync: list[tuple[Callable[[], object], str]] = [
                (lambda: PartitionedQueue.create(wrong, fresh, partitions=2), "blocking"),
                (lambda: PartitionedQueue.open(wrong, queue_name), "blocking"),
                (lambda: open_queue(wrong, queue_name), "open_queue_async takes"),
                (
                    lambda: PartitionedQueue.create(url, fresh, partitions=2),
                    r"not a URL: use scheduler\.open_queue\(url, name\)",
                ),
            ]
            for make, message in refused_sync:
                with pytest.raises(BadArgument, match=message) as got:
                    make()
                assert not isinstance(got.value, UnreadableRecord)
            refused_async: list[Callable[[], Awaitable[object]]] = [
                lambda: AsyncPartitionedQueue.create(client, fresh, partitions=2),
                lambda: AsyncPartitionedQueue.open(client, queue_name),
                lambda: open_queue_async(client, queue_name),
            ]
            for amake in refused_async:
                with pytest.raises(BadArgument, match=r"needs a redis\.asyncio client"):
                    await amake()
            assert client.exists(f"sched:{{{fresh}}}:partitions") == 0  # nothing written
            # The right kinds still pass.
            assert isinstance(await open_queue_async(aclient, queue_name), AsyncPartitionedQueue)
        finally:
            await aclient.aclose()

    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # no coroutine left unawaited
        asyncio.run(main())
    assert isinstance(open_queue(client, queue_name), PartitionedQueue)


def test_the_partitioned_dead_ids_limit_and_enqueue_many_specs_are_checked(
    pq: PartitionedQueue, q: Queue
) -> None:
    """PartitionedQueue.dead_ids takes a `limit` (the merged list's length) that nothing
    checked: 1.5 reached Redis ('ResponseError: value is not an integer or out of range'),
    -1 answered [] and True 1 job, as if they were limits. And its enqueue_many took
    None with a TypeError ('NoneType' object is not iterable) and a str as one-letter specs
    ('expected JobSpec, got 'a''), where Queue.enqueue_many names the argument."""
    ids = pq.enqueue_many([JobSpec("t", {}, max_attempts=1) for _ in range(4)])
    for part in pq.parts:
        for job in part.claim("w", limit=10).jobs:
            part.fail(job.id, job.token, ValueError("x"))
    assert sorted(pq.dead_ids()) == sorted(ids)
    assert len(pq.dead_ids(limit=3)) == 3 and pq.dead_ids(limit=0) == []
    for bad in (1.5, -1, True, "2"):
        with pytest.raises(BadArgument, match="limit"):
            pq.dead_ids(limit=bad)
    for specs in (None, "ab", {"task": "t"}):
        with pytest.raises(BadArgument, match="specs must be an iterable of JobSpec"):
            pq.enqueue_many(specs)  # type: ignore[arg-type]
        with pytest.raises(BadArgument, match="specs must be an iterable of JobSpec"):
            q.enqueue_many(specs)  # type: ignore[arg-type]


def test_every_method_of_every_class_in_the_api_reference_has_a_docstring() -> None:
    """docs/api/index.md renders each `::: path` with mkdocstrings, which leaves out a member
    without a docstring (show_if_no_docstring is off): PartitionedQueue's status, get_job,
    cancel, reschedule, complete and schedule methods, and most of AsyncPartitionedQueue's,
    were missing from the API reference."""
    text = (ROOT / "docs" / "api" / "index.md").read_text()
    missing = []
    for path in re.findall(r"^::: (\S+)", text, re.M):
        module, _, name = path.rpartition(".")
        obj = getattr(importlib.import_module(module), name) if module else None
        if inspect.isclass(obj):
            missing += undocumented(obj)
    assert missing == []


# Queue methods a partitioned queue does not offer, and what to use instead. A method added to
# Queue fails the test below until it is added to both partitioned clients or listed here.
QUEUE_ONLY = {
    "from_url": "scheduler.open_queue(url, name) opens a queue by name as stored",
    "preload": "each partition's: for p in q.parts: p.preload()",
}


def _params(fn: Any) -> list[tuple[str, Any, Any]]:
    fn = fn.fget if isinstance(fn, property) else fn
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_partitioned_queue_offers_queues_methods_with_queues_arguments() -> None:
    """Every Queue method is on PartitionedQueue (AsyncPartitionedQueue mirrors it:
    tests/test_partitions_cli.py) or in QUEUE_ONLY; a shared one takes Queue's parameters, or
    forwards keyword arguments (**kwargs) that are exactly Queue's keyword-only ones."""
    public = {n for n in dir(Queue) if not n.startswith("_")} - {"client", "keys", "ops"}
    missing = sorted(public - set(dir(PartitionedQueue)) - set(QUEUE_ONLY))
    assert missing == []
    assert sorted(set(QUEUE_ONLY) & set(dir(PartitionedQueue))) == []  # listed but offered
    forwarded = {"enqueue": JobSpec.__init__}  # enqueue forwards through JobSpec
    for name in sorted(public & set(dir(PartitionedQueue))):
        ours = _params(inspect.getattr_static(PartitionedQueue, name))
        theirs = _params(inspect.getattr_static(Queue, name))
        if ours == theirs:
            continue
        kinds = [k for _, k, _ in ours]
        assert kinds[-1] == inspect.Parameter.VAR_KEYWORD, (name, ours, theirs)
        assert ours[:-1] == [p for p in theirs if p[1] != inspect.Parameter.KEYWORD_ONLY]
        keyword_only = {p[0] for p in theirs if p[1] == inspect.Parameter.KEYWORD_ONLY}
        if name in forwarded:
            accepts = {p[0] for p in _params(forwarded[name])} - {p[0] for p in ours}
            assert keyword_only == accepts, name


def test_every_public_error_of_the_client_layers_is_exported_and_in_the_reference() -> None:
    """PartitionMismatch (PartitionedQueue.create / open, README 'Partitioned queues') was
    defined in scheduler/core/partitions.py, out of the errors module tests/test_public_surface
    .py walks: not importable from `scheduler` and missing from the API reference's errors."""
    import scheduler
    from scheduler.core.errors import SchedulerError

    reference = (ROOT / "docs" / "api" / "index.md").read_text()
    errors = set()
    for package in ("core", "client"):
        for info in pkgutil.iter_modules([str(ROOT / "scheduler" / package)]):
            module = importlib.import_module(f"scheduler.{package}.{info.name}")
            errors |= {
                name
                for name, obj in vars(module).items()
                if inspect.isclass(obj)
                and issubclass(obj, SchedulerError)
                and obj.__module__ == module.__name__
                and not name.startswith("_")
            }
    assert sorted(e for e in errors if e not in scheduler.__all__) == []
    assert sorted(e for e in errors if f"::: scheduler.{e}\n" not in reference) == []


def test_a_task_handle_given_something_else_than_a_queue_says_so(
    q: Queue, client: redis.Redis
) -> None:
    """handle.enqueue(q, payload) with the queue left out (the payload first, as the
    function's own call reads) or a redis client in its place raised AttributeError
    ("'dict' object has no attribute 'name'"), aenqueue likewise: now a BadArgument naming
    what it takes, nothing sent."""
    reg = Registry()

    @reg.task(name="t")
    def t(payload: object, ctx: object) -> None:
        pass

    wrong: list[Any] = [{"to": "a@example.com"}, None, client, "redis://localhost:6379"]
    for given in wrong:
        with pytest.raises(BadArgument, match=r"takes the queue first"):
            t.enqueue(given, {})

    async def main() -> None:
        for given in wrong:
            with pytest.raises(BadArgument, match=r"takes the queue first"):
                await t.aenqueue(given, {})

    asyncio.run(main())
    assert q.counts().due == 0 and type(t.enqueue(q, {})) is str


NAIVE = datetime(2030, 1, 1)
# (method, args, kwargs, the error every client raises): bad input at the boundary.
BAD_CALLS: list[tuple[str, tuple[Any, ...], dict[str, Any], type[Exception]]] = [
    ("enqueue", ("t", {1, 2}), {}, InvalidPayload),
    ("enqueue", ("t", b"x"), {}, InvalidPayload),
    ("enqueue", ("t", float("nan")), {}, InvalidPayload),
    ("enqueue", ("t", "\ud800"), {}, InvalidPayload),
    ("enqueue", ("t",), {"run_at": NAIVE}, BadArgument),
    ("enqueue", ("t",), {"run_at": date(2030, 1, 1)}, BadArgument),
    ("enqueue", ("t",), {"run_at": datetime(2201, 1, 1, tzinfo=UTC)}, BadArgument),
    ("enqueue", ("t",), {"delay_ms": -1}, BadArgument),
    ("enqueue", ("t",), {"delay_ms": 1.5}, BadArgument),
    ("enqueue", ("t",), {"delay_ms": True}, BadArgument),
    ("enqueue", ("t",), {"delay_ms": 10**20}, BadArgument),
    ("enqueue", ("t",), {"delay_ms": 1, "run_at": datetime.now(UTC)}, BadArgument),
    ("enqueue", ("t",), {"max_attempts": 0}, BadArgument),
    ("enqueue", ("t",), {"job_id": "a b"}, BadArgument),
    ("enqueue", ("t",), {"job_id": "{x}"}, BadArgument),
    ("enqueue", ("t",), {"job_id": "schedule:s:1"}, BadArgument),
    ("enqueue", ("t",), {"after": "abc"}, BadArgument),
    ("enqueue", ("t",), {"after": ["missing-parent"]}, BadArgument),
    ("enqueue", ("t",), {"priority": 10}, BadArgument),
    ("enqueue", ("t",), {"rate_limit": "x"}, BadArgument),
    ("enqueue", ("t",), {"debounce": True}, BadArgument),
    ("enqueue", ("bad task",), {}, BadArgument),
    ("enqueue_many", ([JobSpec("t"), JobSpec("t", {3})],), {}, InvalidPayload),
    ("enqueue_many", ("ab",), {}, BadArgument),
    ("enqueue_many", ([JobSpec("t")],), {"batch_size": 0}, BadArgument),
    ("reschedule", ("a b",), {"delay_ms": 1}, BadArgument),
    ("reschedule", ("missing",), {"delay_ms": 1}, JobNotFound),
    ("status", ("a b",), {}, BadArgument),
    ("status", (5,), {}, BadArgument),
    ("status", ("missing",), {}, JobNotFound),
    ("get_job", ("missing",), {}, JobNotFound),
    ("cancel", ("",), {}, BadArgument),
    ("cancel", ("missing",), {}, JobNotFound),
    ("result", ("missing",), {"timeout_s": 0}, BadArgument),
    ("result", ("missing",), {"timeout_s": 0.01}, JobNotFound),
    ("list_jobs", ("nope",), {}, BadArgument),
    ("list_jobs", ("due",), {"offset": -1}, BadArgument),
    ("dead_ids", (), {"older_than_ms": -1}, BadArgument),
    ("requeue_dead", ("abc",), {}, BadArgument),
    ("purge_dead", (None,), {}, BadArgument),
    ("schedule", ("a b", "t"), {"every_ms": 1000}, BadArgument),
    ("schedule", ("s", "t"), {}, BadArgument),
    ("schedule", ("s", "t", {1}), {"every_ms": 1000}, InvalidPayload),
    ("schedule", ("s", "t"), {"cron": "* * * * *", "tz": "Nowhere/None"}, BadArgument),
    ("get_schedule", ("missing",), {}, ScheduleNotFound),
    ("run_schedule_now", ("missing",), {}, ScheduleNotFound),
]


def test_the_four_clients_refuse_the_same_bad_input_alike_writing_nothing(
    q: Queue, pq: PartitionedQueue, client: redis.Redis, redis_url: str
) -> None:
    """Each bad call of BAD_CALLS raises the same error type from Queue, AsyncQueue,
    PartitionedQueue and AsyncPartitionedQueue (no defect found; a guard against drift), and
    leaves every key of both queues as it was (the queue index aside: advisory, by name)."""

    def state() -> list[dict[str, object]]:
        return [dump_queue(client, q), *(dump_queue(client, p) for p in pq.parts)]

    before = state()
    for method, args, kwargs, error in BAD_CALLS:
        for target in (q, pq):
            with pytest.raises(error):
                getattr(target, method)(*args, **kwargs)

    async def main() -> None:
        aclient = connect_async(redis_url)
        try:
            aq = AsyncQueue(aclient, q.name)
            apq = await AsyncPartitionedQueue.open(aclient, pq.name)
            for method, args, kwargs, error in BAD_CALLS:
                for target in (aq, apq):
                    with pytest.raises(error):
                        await getattr(target, method)(*args, **kwargs)
        finally:
            await aclient.aclose()

    asyncio.run(main())
    assert state() == before


def test_a_debounced_handle_call_says_the_flow_options_are_the_tasks_defaults(q: Queue) -> None:
    """A task registered with a flow default (concurrency_limit, rate_limit, a priority) gives
    it to every job its handle makes, and a debounced job takes no flow option: the handle's
    debounced call was refused 'debounce takes no job_id and no flow options (priority, ...)'
    though the caller gave none (and a concurrency or rate default cannot be left out there).
    The refusal now names the task's defaults and the way that has none."""
    reg = Registry()

    @reg.task(name="digest", concurrency_limit=2)
    def digest(payload: object, ctx: object) -> None:
        pass

    @reg.task(name="plain")
    def plain(payload: object, ctx: object) -> None:
        pass

    with pytest.raises(BadArgument, match=r"task 'digest'.*concurrency_limit.*q\.enqueue"):
        digest.enqueue(q, {}, key="user:1", debounce=True)
    assert q.counts().due == 0
    assert type(plain.enqueue(q, {}, key="user:1", debounce=True)) is str  # priority 0: none
    with pytest.raises(BadArgument, match="no flow options"):  # the caller's own: as before
        plain.enqueue(q, {}, key="user:2", debounce=True, priority=3)


def test_the_limits_page_lists_the_ranges_the_client_methods_check() -> None:
    """docs/limits.md ('the valid range of every argument') left out ranges the clients
    enforce with BadArgument: `partitions` (PartitionedQueue.create: 1..1024), `timeout_s` of
    result ((0, 86400]), list_jobs' `offset` / `limit`, dead_ids' `older_than_ms` and the
    partitioned dead_ids' `limit`, set_dead_retention's `max_age_ms` / `max_count`."""
    table = (ROOT / "docs" / "limits.md").read_text().split("## Stored numbers")[0]
    rows: dict[str, str] = {}  # argument -> its rows' "where" cells (one argument, many rows)
    for line in table.splitlines():
        if line.startswith("| `"):
            arg, where = (cell.strip() for cell in line.split("|")[1:3])
            rows[arg] = rows.get(arg, "") + " " + where
    wanted = {
        "`partitions`": "PartitionedQueue.create",
        "`timeout_s`": "result",
        "`offset`": "list_jobs",
        "`older_than_ms`": "dead_ids",
        "`max_age_ms`": "set_dead_retention",
        "`max_count`": "set_dead_retention",
    }
    missing = [
        f"{arg} ({where})" for arg, where in wanted.items() if where not in rows.get(arg, "")
    ]
    assert missing == []
    assert "list_jobs" in rows["`limit`"] and "dead_ids" in rows["`limit`"]


def test_a_malformed_job_id_is_named_as_such_by_a_partitioned_queue(pq: PartitionedQueue) -> None:
    """A partitioned queue routed a caller's job_id before checking it: with a key, or for
    run_schedule_now, a malformed id ('a b', 'schedule:x:1') was refused as routing to another
    partition ('give an id tagged p1.'), which no tag could fix; Queue names it invalid."""
    pq.schedule("s", "t", every_ms=3_600_000)
    for bad in ("a b", "{x}", "schedule:s:1"):
        with pytest.raises(BadArgument, match="invalid job id"):
            pq.run_schedule_now("s", job_id=bad)
        for key in ("k0", "k1", "k2", "k3"):  # whichever partition each key routes to
            with pytest.raises(BadArgument, match="invalid job id"):
                pq.enqueue("t", key=key, job_id=bad)

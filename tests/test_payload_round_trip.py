"""A typed task's payload, enqueued with its handle, reaches the handler as the type it was
enqueued as, or is refused before anything is written. An audit found payloads enqueue took that
the worker could never decode (every attempt failed BadArgument, then the job was parked): a
dataclass holding a dataclass (asdict made it a dict), a dataclass with an init=False field or a
required InitVar (not constructor arguments: X(**fields) refused them), a pydantic model with
aliased fields (dumped by field name, validated by alias)."""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field
from enum import IntEnum, StrEnum
from typing import Any, NamedTuple, TypedDict

import pydantic
import pytest

from scheduler import BadArgument, JobContext, Queue, Registry
from scheduler._spawn import RedisProcess
from scheduler.worker import WorkerSettings
from scheduler.worker.payloads import decode_payload, encode_payload
from tests.embedded_worker import run_until


@dataclass
class Inner:
    x: int


@dataclass
class Holds:
    inner: Inner


@dataclass
class HoldsList:
    items: list[Inner]


@dataclass
class HoldsDict:
    by_name: dict[str, Inner | int]


@dataclass
class Computed:
    a: int
    b: int = field(init=False, default=0)


@dataclass
class NeedsInitVar:
    a: int
    scale: InitVar[int]

    def __post_init__(self, scale: int) -> None:
        self.a *= scale


@dataclass
class OptionalInitVar:
    a: int
    check: InitVar[bool] = True


class Aliased(pydantic.BaseModel):
    user_id: int = pydantic.Field(alias="userId")


class ValidationAliased(pydantic.BaseModel):
    user_id: int = pydantic.Field(validation_alias="uid")


class Color(StrEnum):
    RED = "red"


class Level(IntEnum):
    LOW = 1


class Pair(NamedTuple):
    x: int
    y: int


@dataclass
class HintedColor:
    color: Color


@dataclass
class HintedLevel:
    level: Level


@dataclass
class HintedPair:
    pair: Pair


@dataclass
class HintedTuple:
    coords: tuple  # type: ignore[type-arg]


class Named(TypedDict):
    name: str


class ColorDict(Named, total=False):
    color: Color


class Forbids(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    a: int

    @pydantic.computed_field  # type: ignore[prop-decorator]
    @property
    def b(self) -> int:
        return self.a + 1


class Excluded(pydantic.BaseModel):
    secret: str = pydantic.Field(exclude=True)
    a: int


class HoldsJson(pydantic.BaseModel):
    raw: pydantic.Json[list[int]]


registry = Registry()
seen: list[Any] = []


@registry.task("round.aliased", payload_type=Aliased)
def aliased(payload: Aliased, ctx: JobContext) -> int:
    seen.append(payload)
    return payload.user_id


@registry.task("round.holds", payload_type=Holds)
def holds(payload: Holds, ctx: JobContext) -> None: ...


@registry.task("round.holds_list", payload_type=HoldsList)
def holds_list(payload: HoldsList, ctx: JobContext) -> None: ...


@registry.task("round.holds_dict", payload_type=HoldsDict)
def holds_dict(payload: HoldsDict, ctx: JobContext) -> None: ...


def test_a_dataclass_holding_a_dataclass_is_refused_at_enqueue() -> None:
    for handle, value in [
        (holds, Holds(Inner(1))),
        (holds_list, HoldsList([Inner(2)])),
        (holds_dict, HoldsDict({"a": 1, "b": Inner(3)})),
    ]:
        with pytest.raises(BadArgument, match=r"holds a dataclass \(Inner\)"):
            handle.job_spec(value)  # type: ignore[attr-defined]
    # Fields that are JSON already are taken as before.
    assert holds_dict.job_spec(HoldsDict({"a": 1})).payload == {"by_name": {"a": 1}}


@pytest.mark.parametrize("tp", [Computed, NeedsInitVar])
def test_a_dataclass_the_worker_cannot_rebuild_is_refused_at_registration(tp: type) -> None:
    local = Registry()
    with pytest.raises(BadArgument, match=rf"payload_type {tp.__name__}: .*cannot"):
        local.task("round.cannot", payload_type=tp)(lambda p, c: None)
    assert local.names() == []


@dataclass(init=False)
class Flexible:
    a: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.a = kwargs.get("a", args[0] if args else 0)


def test_an_init_taking_any_arguments_is_still_taken() -> None:
    local = Registry()
    handle: Any = local.task("round.flexible", payload_type=Flexible)(lambda p, c: None)
    assert decode_payload(Flexible, handle.job_spec(Flexible(a=3)).payload).a == 3


def test_an_initvar_with_a_default_is_still_taken() -> None:
    local = Registry()
    handle: Any = local.task("round.optional", payload_type=OptionalInitVar)(lambda p, c: None)
    spec = handle.job_spec(OptionalInitVar(1))
    assert decode_payload(OptionalInitVar, spec.payload) == OptionalInitVar(1)


def test_a_pydantic_model_with_aliases_decodes_as_it_was_enqueued() -> None:
    for value in (Aliased(userId=3), ValidationAliased.model_validate({"uid": 4})):
        wire = encode_payload(type(value), value)
        assert decode_payload(type(value), wire) == value
    # A payload a client wrote with the alias (by name: scheduler enqueue --payload) too.
    assert decode_payload(Aliased, {"userId": 5}) == Aliased(userId=5)


def test_an_aliased_pydantic_payload_reaches_a_real_workers_handler(
    module_server: RedisProcess,
) -> None:
    q = Queue.from_url(module_server.url, "round")
    job = aliased.enqueue(q, Aliased(userId=42), max_attempts=1)
    seen.clear()
    run_until(module_server.url, registry, WorkerSettings(queues=("round",), grace_s=0),
              lambda: q.status(job) in ("done", "dead"))  # fmt: skip
    got = q.get_job(job)
    assert (got.state, got.fields.get("last_error")) == ("done", None)
    assert q.result(job, timeout_s=5) == 42
    assert seen == [Aliased(userId=42)]


@pytest.mark.parametrize(
    ("tp", "value", "json_type"),
    [
        (HintedColor, HintedColor(Color.RED), "str"),
        (HintedLevel, HintedLevel(Level.LOW), "int"),
        (HintedPair, HintedPair(Pair(1, 2)), "list"),
        (HintedTuple, HintedTuple((1, 2)), "list"),
    ],
)
def test_a_field_json_reads_back_as_another_type_is_refused_at_enqueue(
    tp: type, value: Any, json_type: str
) -> None:
    # Its JSON form (a str, an int, a list) never passes the worker's isinstance check of the
    # hint: every attempt failed 'payload[...] must be Color, got str'.
    local = Registry()
    handle: Any = local.task("round.hinted", payload_type=tp)(lambda p, c: None)
    with pytest.raises(BadArgument, match=rf"JSON reads it back as {json_type}"):
        handle.job_spec(value)


def test_a_typeddict_key_json_reads_back_as_another_type_is_refused_only_when_present() -> None:
    local = Registry()
    handle: Any = local.task("round.colors", payload_type=ColorDict)(lambda p, c: None)
    assert handle.job_spec({"name": "a"}).payload == {"name": "a"}  # decodes: taken
    with pytest.raises(BadArgument, match=r"payload\['color'\] .*JSON reads it back as str"):
        handle.job_spec({"name": "a", "color": Color.RED})


def test_a_pydantic_model_in_a_dataclass_field_is_refused_as_not_json() -> None:
    @dataclass
    class HoldsModel:
        model: Aliased

    local = Registry()
    handle: Any = local.task("round.model", payload_type=HoldsModel)(lambda p, c: None)
    with pytest.raises(BadArgument, match=r"payload\['model'\] is hinted Aliased: it is not JSON"):
        handle.job_spec(HoldsModel(Aliased(userId=1)))


def test_a_pydantic_models_computed_fields_do_not_fail_its_decode() -> None:
    # model_dump writes computed fields; a model that forbids extra inputs refused them.
    wire = encode_payload(Forbids, Forbids(a=1))
    assert wire == {"a": 1, "b": 2}
    assert decode_payload(Forbids, wire) == Forbids(a=1)


def test_a_pydantic_payload_the_worker_cannot_validate_is_refused_at_enqueue() -> None:
    # A required field excluded from dumps: model_dump leaves it out, model_validate needs it.
    local = Registry()
    handle: Any = local.task("round.excluded", payload_type=Excluded)(lambda p, c: None)
    with pytest.raises(BadArgument, match=r"(?s)payload does not fit Excluded.*secret"):
        handle.job_spec(Excluded(secret="s", a=1))
    # A Json[...] field validates from JSON text, and model_dump writes its value.
    with pytest.raises(BadArgument, match=r"(?s)payload does not fit HoldsJson.*raw"):
        encode_payload(HoldsJson, HoldsJson(raw="[1, 2]"))  # type: ignore[arg-type]
    # A model that validates back is taken as before.
    assert encode_payload(Aliased, Aliased(userId=1)) == {"user_id": 1}

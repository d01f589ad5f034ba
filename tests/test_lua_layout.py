"""The Lua layout rules of lua/README.md, checked mechanically: only lib/ formats a job key, and
every transition's header names the prefix-built keys its expanded code can touch."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from scheduler.core.scripts import TRANSITIONS, lua_dir, source

# How the code builds each prefix key -> the name a header gives it.
_BUILDERS = {
    "job:<id>": "'job:'",
    "spec:<id>": "'spec:'",  # lib/job.lua: a job's spec record (issue 16)
    "stats:<minute>": "'stats:'",
    "schedule:<name>": "'schedule:'",
    "schedules:refill": "'schedules:refill'",
    "schedule_ran:<name>": "'schedule_ran:'",  # a removed schedule's last run, a month
    "schedules": "'schedules'",
    "claim:<nonce>": "'claim:'",
    "idem:<digest>": "'idem:'",
    "workers": "'workers'",
    "worker:<id>": "'worker:'",
    "worker_stop:<id>": "'worker_stop:'",  # an operator's quiet / stop (admin/worker_stop.py)
    "dead:migrating": "'dead:migrating'",
    "config": "'config'",
    "partitions": "'partitions'",  # a partitioned queue's layout (lib/util.lua partitioned_err)
    "result:<id>": "'result:'",  # lib/result.lua (issue 13, helper T1)
    "result_wait:<id>": "'result_wait:'",  # lib/result.lua: a Queue.result() waiter is there
    # lib/flow.lua (docs/flow-control.md): priority index, key leases and holds, rate log.
    "flow:levels": "'flow:levels'",
    "flow:pdue:<p>": "'flow:pdue:'",
    "flow:ck:<key>": "'flow:ck:'",
    "flow:ckheld:<key>": "'flow:ckheld:'",
    "flow:rate:<key>": "'flow:rate:'",
    "flow:rheld": "'flow:rheld'",
    "flow:held": "'flow:held'",
    "flow:waiting": "'flow:waiting'",
    "flow:children:<id>": "'flow:children:'",
    "flow:ending": "'flow:ending'",  # lib/flow.lua: parents' ends left for later steps
    "flow:ending:<word>:<id>": "'flow:ending:'",  # lib/flow.lua: the children one end has left
    "isolated": "'isolated'",  # claim.lua: the one suspect job each worker holds
    "finished": "'finished'",  # lib/result.lua: done and cancelled ids, for listings
    "moving": "'moving'",  # move_*.lua: jobs between a queue move's steps
    "move_lock": "'move_lock'",  # move_out.lua, move_done.lua: one queue move run at a time
    "move_in:<source>": "'move_in:'",  # move_in.lua: ids a queue move put, until its finish
    "durable_mark": "'durable_mark'",  # durable_mark.lua: set and deleted in one call
}
_KEYS_LINE = re.compile(r"^\s*Keys from the prefix \(lua/README\.md\): (.*)$", re.MULTILINE)


def _code(text: str) -> str:
    """Lua text without comments (block headers and line comments)."""
    text = re.sub(r"--\[\[.*?\]\]", "", text, flags=re.DOTALL)
    return "\n".join(line.split("--", 1)[0] for line in text.splitlines())


def _header(name: str) -> str:
    text = (lua_dir() / f"{name}.lua").read_text()
    m = re.match(r"--\[\[(.*?)\]\]", text, flags=re.DOTALL)
    assert m, f"{name}.lua has no contract header"
    return m.group(1)


def test_only_lib_formats_job_keys() -> None:
    offenders = [
        p.name
        for p in sorted(Path(lua_dir()).glob("*.lua"))
        if re.search(r"['\"](job|spec):['\"]", _code(p.read_text()))
    ]
    assert offenders == []
    for key in ("'job:'", "'spec:'"):
        libs = [p.name for p in Path(lua_dir(), "lib").glob("*.lua") if key in _code(p.read_text())]
        assert libs == ["job.lua"]


def test_the_checker_sees_a_job_key_outside_lib() -> None:
    assert re.search(r"['\"]job:['\"]", _code("local jk = prefix .. 'job:' .. id -- x"))
    assert not re.search(r"['\"]job:['\"]", _code("-- prefix .. 'job:' .. id"))


@pytest.mark.parametrize("name", sorted({*TRANSITIONS, *(p.stem for p in lua_dir().glob("*.lua"))}))
def test_header_lists_the_keys_the_code_touches(name: str) -> None:
    header = _header(name)
    for i in range(1, 6):
        assert f"KEYS[{i}]" in header
    m = _KEYS_LINE.search(header)
    assert m, f"{name}.lua: no 'Keys from the prefix' line"
    listed = [k.strip() for k in m.group(1).split(",")]
    code = _code(source(name))
    touched = [k for k, pat in _BUILDERS.items() if pat in code]
    assert listed == touched


def test_claim_packs_jobs_through_lib() -> None:
    code = _code((lua_dir() / "claim.lua").read_text())
    assert code.count("pack_job(") == 2
    assert "out[b + 10]" not in code


def test_only_lib_reads_or_writes_the_dead_key() -> None:
    """The dead key's type is known in lib/job.lua alone (dead_letter, dead_unlist, dead_size)."""
    pat = re.compile(r"'(LREM|LLEN|LPUSH|LRANGE|LPOS)'\s*,\s*(dead|prefix \.\. 'dead')")
    offenders = [
        p.name for p in sorted(Path(lua_dir()).glob("*.lua")) if pat.search(_code(p.read_text()))
    ]
    assert offenders == []
    assert pat.search("redis.call('LREM', dead, 0, id)")
    job_lib = _code((lua_dir() / "lib" / "job.lua").read_text())
    assert pat.search(job_lib)


def test_lateness_field_names_follow_the_bounds() -> None:
    # lib/lateness.lua writes its histogram field names out (not built per job): they must
    # stay the 'late_le_<bound>' of each bound, in order.
    text = (lua_dir() / "lib" / "lateness.lua").read_text()

    def table(name: str) -> list[str]:
        m = re.search(name + r" = \{([^}]*)\}", text)
        assert m, name
        return [v.strip().strip("'") for v in m.group(1).split(",")]

    bounds = table("LATE_BOUNDS_MS")
    assert len(bounds) >= 6
    assert table("LATE_FIELDS") == [f"late_le_{b}" for b in bounds]


def test_claims_unset_fields_match_its_read_list() -> None:
    # claim.lua builds the "no hash" reply of its HMGET as a constructor of falses: one per
    # READ name (a missing one would read as nil where the code compares with false).
    text = (lua_dir() / "claim.lua").read_text()
    names = re.search(r"local READ = \{([^}]*)\}", text)
    unset = re.search(r"local f = \{([^}]*)\}", text)
    assert names and unset
    n_names = len([v for v in names.group(1).split(",") if v.strip()])
    falses = [v.strip() for v in unset.group(1).split(",") if v.strip()]
    assert set(falses) == {"false"} and len(falses) == n_names

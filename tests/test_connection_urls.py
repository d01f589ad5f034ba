"""The URL reader's options, refusals and redaction (scheduler/core/connection.py, safety.py;
docs/cluster.md "URL options"), beyond tests/test_review_connections.py: the options are
converted and checked against what both redis-py clients accept, an uppercase scheme works,
and no repr or message shows a credential."""

from __future__ import annotations

import inspect
import re
import ssl
import time
from pathlib import Path

import pytest
from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
from redis.cluster import KWARGS_DISABLED_KEYS, REDIS_ALLOWED_KEYS

from scheduler import BadArgument, Queue
from scheduler.core import url_options
from scheduler.core.connection import parse_url
from scheduler.core.safety import redact

# The URLs the README and docs/ show.
DOCUMENTED = [
    "rediss://sched-app:PASSWORD@redis.internal:6380/0?ssl_ca_certs=/etc/ssl/redis-ca.pem",
    "rediss://h:6380/0?ssl_ca_certs=/ca.pem&ssl_cert_reqs=none",
    "redis+cluster://h:7000/?max_connections=500",
    "redis://10.0.0.1:6379/0?cluster=1",
    "rediss+cluster://user:pw@h:7000,h:7001/",
    "unix:///run/redis.sock?db=2",
]


@pytest.mark.parametrize("url", DOCUMENTED)
def test_the_documented_urls_are_read(url: str) -> None:
    pem = Path(__file__).parent / "fixtures" / "tls-ca.pem"  # a TLS file must be there, a PEM
    parse_url(re.sub(r"ssl_ca_certs=[^&]*", f"ssl_ca_certs={pem}", url))


def test_options_are_converted_and_the_database_kept() -> None:
    t = parse_url(
        "rediss://h:1/3?socket_timeout=2.5&max_connections=9&protocol=3"
        "&ssl_check_hostname=no&ssl_min_version=TLSv1_2&ssl_cert_reqs=Required"
    )
    assert dict(t.options) == {
        "socket_timeout": 2.5, "max_connections": 9, "protocol": 3, "ssl_check_hostname": False,
        "ssl_min_version": ssl.TLSVersion.TLSv1_2, "ssl_cert_reqs": "required", "db": 3,
    }  # fmt: skip
    assert t.address == "rediss://h:1"
    assert parse_url("redis://h:1/3?db=4").options["db"] == 4  # ?db= over the path, as redis-py
    assert parse_url("redis://h:1/0?socket_timeout=").options == {"db": 0}  # blank: ignored
    cluster = parse_url("redis+cluster://a:1,b:2/?socket_timeout=3&db=0")
    assert (cluster.address, dict(cluster.options)) == ("redis://a:1", {"socket_timeout": 3.0})


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis://h:1/0?ssl_ca_certs=/ca.pem", "needs TLS"),
        ("unix:///r.sock?socket_keepalive=1", "needs TCP"),
        ("rediss+cluster://h:1/?ssl_password=x", "not supported on a Redis Cluster"),
        ("redis://h:1/0?cluster=1&health_check_interval=5", "not supported on a Redis Cluster"),
        ("redis://h:1/0?db=1&db=2", "given twice"),
        ("redis://h:1/0?max_conection=5", "did you mean 'max_connections'"),
        ("redis://h:1/0?decode_responses=false", "unknown option"),
        ("redis://h:1/0?socket_timeout=0", "seconds > 0"),
        ("redis://h:1/0#x", "percent-encode"),
        ("redis://h:99999/0", "bad port"),
        ("redis://a:1,b:2/0", "bad port"),
        ("unix://", "no socket path"),
    ],
)
def test_a_bad_option_or_part_is_refused_naming_it(url: str, why: str) -> None:
    with pytest.raises(BadArgument, match=why):
        parse_url(url)


def test_every_cluster_option_reaches_the_nodes_of_both_cluster_clients() -> None:
    """The blocking RedisCluster keeps only REDIS_ALLOWED_KEYS, the asyncio one takes only its
    parameters: a name outside either would be dropped or fail there (this redis-py)."""
    blocking = set(REDIS_ALLOWED_KEYS) - set(KWARGS_DISABLED_KEYS)
    asyncio_ = set(inspect.signature(AsyncRedisCluster.__init__).parameters)
    assert set(url_options.CLUSTER_OPTIONS) <= blocking & asyncio_


def test_an_uppercase_scheme_is_read(redis_url: str) -> None:
    scheme, rest = redis_url.split("://", 1)
    assert parse_url("REDIS://h:1/0").url == "redis://h:1/0"
    q = Queue.from_url(f"{scheme.upper()}://{rest}", "upper-scheme")
    try:
        assert q.counts().dead == 0
    finally:
        q.client.close()


def test_no_repr_or_message_shows_a_credential() -> None:
    t = parse_url("rediss://app:Pw-1x@h:6380/0?ssl_password=Kp-2y&password=Qp-3z")
    assert all(s not in repr(t) for s in ("Pw-1x", "Kp-2y", "Qp-3z")), repr(t)
    for text in ("rediss://h/0?auth_token=Tk-4w", "redis://app:a/b?c#d@h:1/0 x"):
        assert "Tk-4w" not in redact(text) and "a/b?c#d" not in redact(text), redact(text)
    with pytest.raises(BadArgument) as info:
        parse_url("redis://app:Zq8/s3cret@h:1/0?ssl_password=Kp-2y")
    assert "Zq8" not in str(info.value) and "Kp-2y" not in str(info.value), info.value


def test_redact_takes_linear_time_on_hostile_text() -> None:
    """A log line may quote a handler's error (untrusted): a backtracking pattern over
    `a.a.a...://@` or `?passpass...` took seconds for 24 KB (quadratic)."""
    for text in ("a.a" * 20_000 + "://@", "a://" * 20_000 + " x@y", "?" + "pass" * 20_000 + " @"):
        started = time.perf_counter()
        redact(text)
        assert time.perf_counter() - started < 0.5

"""A CLI command invoked in-process (CliRunner: tests, an app embedding the CLI) closes the Redis
client it opened when its context ends (scheduler/cli/common.py connect): a socket left open
was a ResourceWarning at a later garbage collection, raised in whatever test ran then."""

from __future__ import annotations

from typing import Any

import pytest
from click.testing import CliRunner

from scheduler.cli.main import main
from scheduler.core import connection
from tests.redis_server import RedisProcess


def _open_sockets(client: Any) -> int:
    pool = client.connection_pool
    conns = [*pool._available_connections, *pool._in_use_connections]
    return sum(1 for c in conns if getattr(c, "_sock", None) is not None)


@pytest.mark.parametrize(
    "args",
    [
        ["stats", "--queue", "cc"],
        ["jobs", "list", "--state", "due", "--queue", "cc"],
        ["doctor", "--queue", "cc"],
        ["jobs", "show", "nope", "--queue", "cc"],  # a refusal (exit 1) closes it too
    ],
)
def test_the_command_closes_its_client(
    module_server: RedisProcess, monkeypatch: pytest.MonkeyPatch, args: list[str]
) -> None:
    built: list[Any] = []
    real = connection.connect

    def spy(url: str, **kwargs: Any) -> Any:
        client = real(url, **kwargs)
        built.append(client)
        return client

    monkeypatch.setattr(connection, "connect", spy)  # cli/common.py calls it by its module
    result = CliRunner().invoke(main, [*args, "--url", module_server.url])
    assert result.exit_code in (0, 1), result.output
    assert len(built) == 1
    assert _open_sockets(built[0]) == 0

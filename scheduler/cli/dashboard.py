"""`scheduler dashboard`: serve the web dashboard (scheduler/dashboard/) with uvicorn."""

from __future__ import annotations

import ipaddress
import re

import click

from scheduler.cli.common import (
    EXIT_CODES_HELP,
    AdminCommand,
    BadInput,
    connect,
    queues_option,
    url_option,
)
from scheduler.core.safety import safe

_HOST_NAME = re.compile(r"[A-Za-z0-9.\-]{1,253}")  # a name or an IPv4 address


def _is_host(name: str) -> bool:
    """A host name or an IP address (IPv6 with or without brackets), without a port."""
    try:
        ipaddress.IPv6Address(name.removeprefix("[").removesuffix("]"))
    except ValueError:
        return _HOST_NAME.fullmatch(name) is not None
    return True


def _check_hosts(
    ctx: click.Context, param: click.Parameter, value: tuple[str, ...]
) -> tuple[str, ...]:
    for name in value:
        if not _is_host(name):
            raise click.BadParameter(safe(f"{name!r} is not a host name (give it without a port)"))
    return value


def register(main: click.Group) -> None:
    @main.command("dashboard", cls=AdminCommand, epilog=EXIT_CODES_HELP)
    @url_option
    @queues_option
    @click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
    @click.option(
        "--port", default=8080, show_default=True, type=click.IntRange(0, 65535), help="TCP port."
    )
    @click.option("--read-only", is_flag=True, help="No actions: every POST is refused.")
    @click.option(
        "--allow-host",
        "allow_hosts",
        multiple=True,
        callback=_check_hosts,
        help="Without auth: another Host name to answer besides 127.0.0.1, localhost, ::1 and "
        "--host (a local proxy's; repeatable). Others get 400 (DNS rebinding).",
    )
    @click.option(
        "--sample-every",
        "sample_every_s",
        default=0.0,
        type=click.FloatRange(0, 3600),
        help="Ignored: the lateness chart reads what claims record in Redis (old scripts).",
    )
    def dashboard(
        url: str,
        queues: tuple[str, ...],
        host: str,
        port: int,
        read_only: bool,
        allow_hosts: tuple[str, ...],
        sample_every_s: float,
    ) -> None:
        """Serve the web dashboard: queues, jobs, dead letters, schedules, workers, health.

        It binds 127.0.0.1 unless told otherwise; another address needs authentication
        (SCHEDULER_DASHBOARD_AUTH=user:password or SCHEDULER_DASHBOARD_TOKEN=...).
        Needs the `dashboard` extra: pip install 'scheduler[dashboard]'."""
        try:
            import uvicorn

            from scheduler.dashboard import Auth, check_bind, create_app
            from scheduler.dashboard.security import local_hosts
        except ImportError as exc:
            raise BadInput(
                f"the dashboard needs its extra: pip install 'scheduler[dashboard]' ({exc})"
            ) from None
        auth = Auth.from_env()
        check_bind(host, auth)
        client = connect(url)
        app = create_app(
            client=client,
            queues=queues,
            read_only=read_only,
            auth=auth,
            sample_every_s=sample_every_s,
            # Without auth only the loopback bind protects it: answer only its own names, so
            # a page that re-points its DNS name to 127.0.0.1 is refused. With auth, the
            # names it is reached by are not known here, and a stranger has no credentials.
            allowed_hosts=None if auth.enabled else local_hosts(host, allow_hosts),
        )
        mode = " (read-only)" if read_only else ""
        click.echo(safe(f"scheduler dashboard on http://{host}:{port}/{mode}"), err=True)
        uvicorn.run(app, host=host, port=port, log_level="warning", proxy_headers=False)

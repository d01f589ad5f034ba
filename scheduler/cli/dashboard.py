"""`scheduler dashboard`: serve the web dashboard (scheduler/dashboard/) with uvicorn."""

from __future__ import annotations

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


def register(main: click.Group) -> None:
    @main.command("dashboard", cls=AdminCommand, epilog=EXIT_CODES_HELP)
    @url_option
    @queues_option
    @click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
    @click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535))
    @click.option("--read-only", is_flag=True, help="No actions: every POST is refused.")
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
        sample_every_s: float,
    ) -> None:
        """Serve the web dashboard: queues, jobs, dead letters, schedules, workers, health.

        It binds 127.0.0.1 unless told otherwise; another address needs authentication
        (SCHEDULER_DASHBOARD_AUTH=user:password or SCHEDULER_DASHBOARD_TOKEN=...).
        Needs the `dashboard` extra: pip install 'scheduler[dashboard]'."""
        try:
            import uvicorn

            from scheduler.dashboard import Auth, check_bind, create_app
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
        )
        mode = " (read-only)" if read_only else ""
        click.echo(safe(f"scheduler dashboard on http://{host}:{port}/{mode}"), err=True)
        uvicorn.run(app, host=host, port=port, log_level="warning", proxy_headers=False)

"""The web dashboard: see and operate every queue in a browser (docs/dashboard.md).

Needs the `dashboard` extra (`pip install 'scheduler[dashboard]'`: Starlette, Jinja2, uvicorn).
`create_app(url=...)` is the ASGI app; `scheduler dashboard` serves it."""

from __future__ import annotations

from scheduler.dashboard.app import DashboardApp, create_app
from scheduler.dashboard.security import Auth, check_bind

__all__ = ["Auth", "DashboardApp", "check_bind", "create_app"]

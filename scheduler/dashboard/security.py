"""The dashboard's guards: who may connect (bind address vs auth), which Host names it answers
(DNS rebinding), which requests of other sites' pages it serves (Fetch Metadata: only links
followed to a page), who may look and act (basic auth or a token from the environment), CSRF
tokens on every POST, and the response headers (a strict content security policy: no inline
script or style, nothing from elsewhere)."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import re
import secrets
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from scheduler.core.errors import BadArgument
from scheduler.dashboard.throttle import LoginThrottle

ENV_AUTH = "SCHEDULER_DASHBOARD_AUTH"  # "user:password" for HTTP basic auth
ENV_TOKEN = "SCHEDULER_DASHBOARD_TOKEN"  # a bearer token (or the basic-auth password)
ENV_SECRET = "SCHEDULER_DASHBOARD_SECRET"  # signs CSRF tokens; shared by several processes
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# A Host header: a name or IPv4 address, or a bracketed IPv6 address; an optional port.
_HOST_HEADER = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[^\[\]:]+)(?::[0-9]{1,5})?")
SESSION_COOKIE = "sched_dash_session"
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
HEADERS = [
    (b"content-security-policy", CSP.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"same-origin"),  # no-referrer would make Origin "null"
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
]


@dataclass(frozen=True)
class Auth:
    """Credentials a request must carry (None fields: not required)."""

    user: str | None = None
    password: str | None = None
    token: str | None = None

    @property
    def enabled(self) -> bool:
        return self.password is not None or self.token is not None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Auth:
        env = os.environ if env is None else env
        user = password = None
        basic = env.get(ENV_AUTH, "")
        if basic:
            user, sep, password = basic.partition(":")
            if not sep or not user or not password:
                raise BadArgument(f"{ENV_AUTH} must be 'user:password'")
        token = env.get(ENV_TOKEN) or None
        if token is not None and len(token) < 16:
            raise BadArgument(f"{ENV_TOKEN} must be at least 16 characters")
        return cls(user, password, token)

    def allows(self, authorization: str) -> bool:
        """Does this Authorization header carry valid credentials (constant-time compare)."""
        if not self.enabled:
            return True
        scheme, _, value = authorization.partition(" ")
        if scheme.lower() == "bearer" and self.token is not None:
            return hmac.compare_digest(value.strip().encode(), self.token.encode())
        if scheme.lower() != "basic":
            return False
        try:
            user, _, password = base64.b64decode(value.strip()).decode().partition(":")
        except ValueError:  # binascii.Error, UnicodeDecodeError, a non-ASCII header value
            return False
        ok = False
        if self.password is not None and self.user is not None:
            ok = hmac.compare_digest(user.encode(), self.user.encode()) & hmac.compare_digest(
                password.encode(), self.password.encode()
            )
        if self.token is not None:  # a browser sends the token as the basic-auth password
            ok = ok or hmac.compare_digest(password.encode(), self.token.encode())
        return ok


def check_bind(host: str, auth: Auth) -> None:
    """Refuse to serve on a non-loopback address without credentials."""
    if host not in LOCAL_HOSTS and not auth.enabled:
        raise BadArgument(
            f"refusing to listen on {host!r} without authentication: anyone who can reach it "
            f"could read payloads and requeue or purge jobs. Set {ENV_AUTH}=user:password or "
            f"{ENV_TOKEN}=<token of 16+ characters>, or keep --host 127.0.0.1 and use an SSH "
            "tunnel or your own authenticating proxy."
        )


def _host_key(name: str) -> str:
    return name.strip().strip("[]").lower()  # '[::1]' and '::1' are one address


def local_hosts(host: str, extra: Collection[str] = ()) -> frozenset[str]:
    """The Host names a loopback dashboard without auth answers: the loopback names, the bind
    address and `extra` (e.g. the name a local proxy forwards)."""
    return frozenset(map(_host_key, (*LOCAL_HOSTS, host, *extra)))


def host_name(header: str) -> str | None:
    """The host part of a Host header, lower case, IPv6 without brackets; None if malformed."""
    m = _HOST_HEADER.fullmatch(header.strip())
    return _host_key(m.group(1)) if m else None


def origin_allowed(origin: str, host: str | None, named: Collection[str]) -> bool:
    """Whether an action's Origin header is the dashboard's own page: it names the host and
    port the request was sent to (its Host; not the scheme: a TLS-terminating proxy changes
    it), or, any port, a name in `named`: the allowed Host names an operator gave, which a
    proxy sending `Host: 127.0.0.1` leaves the only trace of. `named` never holds a loopback
    name: another port of localhost is another local server's page. `null` is refused."""
    try:
        netloc = urlsplit(origin).netloc
    except ValueError:  # 'http://[::1': malformed, no page of the dashboard's
        return False
    return bool(netloc) and (netloc == host or host_name(netloc) in named)


def origin_names(allowed_hosts: Collection[str] | None) -> frozenset[str]:
    """The Host names an Origin may carry besides the request's Host (origin_allowed): those
    of `allowed_hosts` but the loopback ones; none when any Host is answered (None)."""
    return frozenset(map(_host_key, allowed_hosts or ())) - LOCAL_HOSTS


class Csrf:
    """CSRF tokens bound to a random per-browser session cookie: token = HMAC(secret, session).
    A cross-site form post has neither the cookie (SameSite=Lax: sent on a link followed from
    another site, never on its POST) nor the token."""

    def __init__(self, secret: str | None = None) -> None:
        raw = secret or os.environ.get(ENV_SECRET) or secrets.token_hex(32)
        self._key = hashlib.sha256(raw.encode()).digest()

    @staticmethod
    def new_session() -> str:
        return secrets.token_urlsafe(24)

    def token(self, session: str) -> str:
        return hmac.new(self._key, session.encode(), hashlib.sha256).hexdigest()

    def sign(self, session: str, text: str) -> str:
        """A notice's signature: the words a redirect after an action shows, bound to the
        session that acted (a link made anywhere else shows none)."""
        return hmac.new(self._key, f"notice|{session}|{text}".encode(), hashlib.sha256).hexdigest()

    def signed(self, session: str | None, text: str, sig: str | None) -> bool:
        if not session or not sig:
            return False
        return hmac.compare_digest(self.sign(session, text).encode(), sig.encode())

    def valid(self, session: str | None, token: str | None) -> bool:
        if not session or not token:
            return False
        # As bytes: compare_digest raises TypeError on a non-ASCII str (a 500, not a 403).
        return hmac.compare_digest(self.token(session).encode(), token.encode())


def cross_site_subrequest(method: str, headers: Mapping[str, str]) -> bool:
    """A request another site's page made in the operator's browser (Fetch Metadata), other
    than a link followed to a page: an <img>, a fetch() or a form of attacker.example would
    make the browser read expensive pages (a dead-letter filter: thousands of Redis calls)
    with the operator's credentials. Without the header (curl, older browsers) it passes; a
    POST from elsewhere also meets the CSRF and Origin checks."""
    site = headers.get("sec-fetch-site")
    if site is None or site in ("same-origin", "none"):
        return False
    navigation = headers.get("sec-fetch-mode") == "navigate" and method in ("GET", "HEAD")
    return not (navigation and headers.get("sec-fetch-dest", "document") == "document")


async def _refuse(send: Send, status: int, body: bytes, *extra: tuple[bytes, bytes]) -> None:
    headers = [*extra, (b"content-type", b"text/plain; charset=utf-8"), *HEADERS]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class GuardMiddleware:
    """Pure ASGI: the Host check (when `allowed_hosts` is set) and the auth check before
    anything else, and the security headers on every response (also on errors and static
    files).

    Without auth, a loopback address alone does not keep other sites out: a page of
    attacker.example whose name the attacker re-points to 127.0.0.1 (DNS rebinding) is
    same-origin with itself, reads the pages and their CSRF token and posts; its requests
    carry `Host: attacker.example`, hence the Host check."""

    def __init__(
        self,
        app: ASGIApp,
        auth: Auth,
        allowed_hosts: Collection[str] | None = None,
        throttle: LoginThrottle | None = None,
    ) -> None:
        self.app = app
        self.auth = auth
        self.throttle = LoginThrottle() if throttle is None else throttle
        self.allowed_hosts = (
            None if allowed_hosts is None else frozenset(map(_host_key, allowed_hosts))
        )

    def host_allowed(self, header: str) -> bool:
        return self.allowed_hosts is None or host_name(header) in self.allowed_hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        if not self.host_allowed(headers.get("host", "")):
            await _refuse(send, 400, b"unknown Host header: use an address the dashboard serves\n")
            return
        if cross_site_subrequest(scope.get("method", "GET"), headers):
            await _refuse(send, 403, b"cross-site request refused: open the dashboard itself\n")
            return
        if self.auth.enabled and not await self._authenticated(scope, headers, send):
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {k.lower() for k, _ in message.get("headers", [])}
                extra = [(k, v) for k, v in HEADERS if k not in present]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        await self.app(scope, receive, with_headers)

    async def _authenticated(self, scope: Scope, headers: dict[str, str], send: Send) -> bool:
        """Check the credentials, or refuse (401; 429 while this client is throttled)."""
        client = scope.get("client")
        host = client[0] if client else None
        wait_s = self.throttle.retry_after_s(host)
        if wait_s:
            retry = (b"retry-after", str(wait_s).encode())
            await _refuse(send, 429, b"too many failed logins: try again later\n", retry)
            return False
        authorization = headers.get("authorization", "")
        if self.auth.allows(authorization):
            return True
        if authorization:  # a browser's first request carries none: no guess, no count
            self.throttle.failed(host)
        realm = (b"www-authenticate", b'Basic realm="scheduler dashboard"')
        await _refuse(send, 401, b"authentication required\n", realm)
        return False

"""The query options a connection URL may carry (`?socket_timeout=5`), each with its converter:
redis-py's URL_QUERY_ARGUMENT_PARSERS and the connection keyword arguments every client
(blocking and asyncio, redis-py 7.3 and 8.x) accepts. core/connection.py refuses any other name,
and a value its converter does not take (BadArgument), rather than fail at the first command;
a TLS file (`ssl_ca_certs`, ...) is checked to be there, readable and a PEM of its kind."""

from __future__ import annotations

import math
import os
import re
import ssl
from collections.abc import Callable, Mapping
from typing import Any

from redis.connection import parse_ssl_verify_flags

from scheduler.core.errors import BadArgument
from scheduler.core.safety import REDACTED, is_secret_name, redact

_BOOLS = dict.fromkeys(("1", "true", "yes", "on"), True)
_BOOLS.update(dict.fromkeys(("0", "false", "no", "off", ""), False))

Parse = Callable[[str], Any]


def _value(convert: Parse, why: str, ok: Callable[[Any], bool] = lambda v: True) -> Parse:
    def parse(text: str) -> Any:
        try:
            value = convert(text)
        except (AttributeError, KeyError, ValueError):
            raise ValueError(why) from None
        if not ok(value):
            raise ValueError(why)
        return value

    return parse  # raises ValueError(why) on text it does not take


def _tls_version(text: str) -> ssl.TLSVersion:
    return ssl.TLSVersion(int(text)) if text.isdecimal() else ssl.TLSVersion[text]


def whole(low: int) -> Parse:
    return _value(int, f"expected a whole number >= {low}", lambda v: v >= low)


def tls_path_problem(path: str, kind: str = "file") -> str | None:
    """Why a client could not use the TLS file at `path` (`kind`: TLS_PATHS' words), else None:
    redis-py finds out only while connecting ('No such file', '[X509: NO_CERTIFICATE_OR_CRL_
    FOUND]', '[SSL] PEM lib'), which the CLI reported as 'cannot reach Redis'."""
    folder = kind == "folder"
    what = "directory" if folder else "file"
    if not os.path.exists(path):
        return f"no such {what}"
    if os.path.isdir(path) != folder:
        return "not a directory" if folder else "is a directory, expected a file"
    if not os.access(path, os.R_OK | (os.X_OK if folder else 0)):
        return f"this process cannot read that {what}"
    if kind == "ca":  # as redis-py loads it: exact, and no password is ever asked for
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cafile=path)
        except (ssl.SSLError, OSError, ValueError):
            return "holds no PEM CA certificate"
    elif kind in _PEM_MARKS:  # loading the pair could prompt for an encrypted key's password
        with open(path, "rb") as f:
            head = f.read(_PEM_READ)
        if re.search(_PEM_MARKS[kind], head) is None:
            return f"holds no PEM {'certificate' if kind == 'cert' else 'private key'}"
    return None


_PEM_MARKS = {
    "cert": rb"-----BEGIN CERTIFICATE-----",
    "key": rb"-----BEGIN [A-Z ]*PRIVATE KEY-----",
}
_PEM_READ = 1 << 20  # a chain and a key fit many times over


def _tls_path(kind: str) -> Parse:
    def parse(text: str) -> str:
        why = tls_path_problem(text, kind)
        if why is not None:
            raise ValueError(why)
        return text

    return parse


# The options naming a file the TLS context reads (ssl_ca_path: a folder), checked before any
# connection: what each must hold.
TLS_PATHS = {
    "ssl_ca_certs": "ca",
    "ssl_certfile": "cert",
    "ssl_keyfile": "key",
    "ssl_ca_path": "folder",
}


def check_tls_paths(options: Mapping[str, Any]) -> None:
    """A client's arguments (a connection helper's keywords and the URL's options) naming a TLS
    file that is not there or holds no PEM of its kind, or an encrypted key without its
    password: BadArgument naming the option and the path (parse_url checked a URL's alone)."""
    for name, kind in TLS_PATHS.items():
        value = options.get(name)
        if isinstance(value, (str, os.PathLike)):
            why = tls_path_problem(os.fspath(value), kind)
            if why is not None:
                raise BadArgument(f"{name}={os.fspath(value)!r}: {why}")
    check_key_password(options)


_ENCRYPTED = re.compile(rb"-----BEGIN ENCRYPTED PRIVATE KEY-----|Proc-Type: *4, *ENCRYPTED")


def check_key_password(options: Mapping[str, Any], url: str | None = None) -> None:
    """The client certificate and key loaded as redis-py will, before any connection: an
    encrypted key (ssl_keyfile, else beside the certificate in ssl_certfile) with no
    ssl_password (OpenSSL would ask for it on the terminal at every connection: a command hung
    at 'Enter PEM pass phrase:'), a password that does not decrypt it, a key that is not the
    certificate's. BadArgument (a URL's refusal when `url` is given), the password never shown."""
    name = "ssl_keyfile" if options.get("ssl_keyfile") else "ssl_certfile"
    value, cert, password = (options.get(n) for n in (name, "ssl_certfile", "ssl_password"))
    if not isinstance(value, (str, os.PathLike)):
        return
    try:
        with open(value, "rb") as f:
            encrypted = _ENCRYPTED.search(f.read(_PEM_READ)) is not None
        if isinstance(cert, (str, os.PathLike)):
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # '' for none: never a prompt
            context.load_cert_chain(cert, options.get("ssl_keyfile"), password=password or "")
        elif encrypted and not password:
            raise ssl.SSLError("encrypted")
        return
    except OSError as exc:  # ssl.SSLError too; a file tls_path_problem refused: said there
        if not isinstance(exc, ssl.SSLError):
            return
        shown = f"{name}={os.fspath(value)!r}"
        if encrypted and not password:
            why = (f"{shown} holds an encrypted private key and no ssl_password is given: "
                   "OpenSSL would ask for it on the terminal (give ssl_password, one server "
                   "only, or a key without a passphrase)")  # fmt: skip
        elif exc.reason == "KEY_VALUES_MISMATCH":
            why = f"{shown} is not the private key of ssl_certfile={str(cert)!r}"
        elif encrypted:
            why = f"ssl_password does not decrypt {shown}"
        else:
            why = f"{shown} and ssl_certfile cannot be loaded together: {exc}"
    raise BadArgument(why) if url is None else url_error(url, why)


FLAG = _value(lambda t: _BOOLS[t.strip().lower()], "expected 1 or 0")
_SECONDS = _value(float, "expected seconds > 0", lambda v: math.isfinite(v) and v > 0)
_VERIFY = _value(parse_ssl_verify_flags, "expected ssl.VerifyFlags names, comma-separated")
_CERT_REQS = ("none", "optional", "required")
# The query options: redis-py's URL_QUERY_ARGUMENT_PARSERS and the connection keyword arguments
# that every client (blocking and asyncio, redis-py 7.3 and 8.x) accepts, converted here: redis-py
# passes an unknown name on (TypeError at the first command), 7.3 passes `protocol` as text.
# ssl_* need rediss://, socket_keepalive TCP. These both cluster clients hand to every node:
CLUSTER_OPTIONS: dict[str, Parse] = {
    "db": whole(0),  # 0 only, on a cluster
    "socket_timeout": _SECONDS,
    "socket_connect_timeout": _SECONDS,
    "socket_keepalive": FLAG,
    "max_connections": whole(1),
    "protocol": _value(lambda t: {"2": 2, "3": 3}[t], "expected 2 or 3"),
    **dict.fromkeys(("client_name", "username", "password"), str),
    **{
        name: _tls_path(TLS_PATHS[name]) for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile")
    },
    "ssl_cert_reqs": _value(str.lower, f"expected one of {_CERT_REQS}", _CERT_REQS.__contains__),
    "ssl_check_hostname": FLAG,
    "ssl_include_verify_flags": _VERIFY,
    "ssl_exclude_verify_flags": _VERIFY,
}
# One server only: the blocking RedisCluster drops a name outside its REDIS_ALLOWED_KEYS
# (health_check_interval, ssl_min_version), the asyncio one raises TypeError on a name it lacks
# (ssl_password, ssl_ca_path): refused on a cluster, never dropped.
SINGLE_OPTIONS: dict[str, Parse] = {
    "socket_read_size": whole(1),
    "health_check_interval": whole(0),
    "ssl_ca_path": _tls_path("folder"),
    **dict.fromkeys(("ssl_password", "ssl_ciphers"), str),
    # A name, or redis-py's own form: the whole number of an ssl.TLSVersion (771 = TLSv1_2).
    "ssl_min_version": _value(_tls_version, "expected TLSv1_2, TLSv1_3 or its number (771, 772)"),
}
OPTIONS = {**CLUSTER_OPTIONS, **SINGLE_OPTIONS}


def url_error(url: str, why: str) -> BadArgument:
    """The one refusal of a connection URL (core/connection.py, core/sentinel.py), redacted."""
    return BadArgument(f"invalid Redis URL {redact(url)}: {why}")


def convert(url: str, name: str, text: str, parse: Parse) -> Any:
    """One query option's (or the database's) text converted, else url_error naming it (a
    secret's value never shown)."""
    try:
        return parse(text)
    except ValueError as exc:
        shown = REDACTED if is_secret_name(name) else repr(text)
        raise url_error(url, f"{name}={shown}: {exc}") from None

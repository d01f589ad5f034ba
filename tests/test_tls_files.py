"""A TLS file named by a connection URL (`?ssl_ca_certs=`, `ssl_certfile`, `ssl_keyfile`,
`ssl_ca_path`) or by a connection helper's keyword argument that is not there is a usage error
naming the option and the path, raised before any connection (core/url_options.py): it was
redis-py's `Error 2 connecting to ...: No such file or directory.` at the first command, which
the CLI reported as 'cannot reach Redis' (exit 3) and the worker as a crash."""

from __future__ import annotations

import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from scheduler import BadArgument, Queue, open_queue
from scheduler.cli.main import main
from scheduler.core.connection import connect, connect_async, parse_url
from scheduler.core.exits import EXIT_USAGE
from tests.faults.conftest import Tls, make_tls
from tests.redis_server import require_binary, require_server

ROOT = Path(__file__).resolve().parents[1]
CA = str(ROOT / "tests" / "fixtures" / "tls-ca.pem")  # a CA certificate whose key was not kept


@pytest.fixture
def listener() -> Iterator[socket.socket]:
    """A TCP port that accepts (nothing answers): a client that tried to connect shows up in
    its backlog, so a test can assert that no connection was attempted."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


def _no_connection(sock: socket.socket) -> bool:
    try:
        conn, _ = sock.accept()
    except BlockingIOError:
        return True
    conn.close()
    return False


def _url(sock: socket.socket, query: str, scheme: str = "rediss") -> str:
    return f"{scheme}://127.0.0.1:{sock.getsockname()[1]}/0?{query}&socket_timeout=3"


@pytest.mark.parametrize("name", ["ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_ca_path"])
def test_a_missing_tls_file_in_the_url_is_a_usage_error_naming_it(
    name: str, tmp_path: Path, listener: socket.socket
) -> None:
    missing = tmp_path / "nope" / "ca.pem"
    url = _url(listener, f"{name}={missing}")
    with pytest.raises(BadArgument) as info:
        parse_url(url)
    assert name in str(info.value) and str(missing) in str(info.value), str(info.value)
    for opener in (connect, lambda u: Queue.from_url(u, "q"), lambda u: open_queue(u, "q")):
        with pytest.raises(BadArgument, match=name):
            opener(url)
    with pytest.raises(BadArgument, match=name):
        connect_async(url)
    res = CliRunner().invoke(main, ["stats", "--url", url])
    assert res.exit_code == EXIT_USAGE, res.output
    assert name in res.output and str(missing) in res.output, res.output
    assert _no_connection(listener)


def test_a_file_of_the_wrong_kind_is_refused_and_a_present_one_taken(tmp_path: Path) -> None:
    base = "rediss://127.0.0.1:1/0?"
    with pytest.raises(BadArgument, match=r"ssl_ca_certs=.*is a directory"):
        parse_url(f"{base}ssl_ca_certs={tmp_path}")
    with pytest.raises(BadArgument, match=r"ssl_ca_path=.*not a directory"):
        parse_url(f"{base}ssl_ca_path={CA}")
    assert parse_url(f"{base}ssl_ca_certs={CA}").options["ssl_ca_certs"] == CA
    assert parse_url(f"{base}ssl_ca_path={tmp_path}").options["ssl_ca_path"] == str(tmp_path)


def test_cluster_and_sentinel_urls_check_their_tls_files_too(tmp_path: Path) -> None:
    missing = tmp_path / "ca.pem"
    for url in (
        f"rediss+cluster://127.0.0.1:1,127.0.0.1:2/?ssl_ca_certs={missing}",
        f"rediss://127.0.0.1:1/?cluster=1&ssl_certfile={missing}",
        f"rediss+sentinel://127.0.0.1:1/svc?ssl_keyfile={missing}&sentinel_ssl=1",
    ):
        with pytest.raises(BadArgument, match=str(missing)):
            parse_url(url)


def test_a_missing_tls_file_given_as_a_keyword_is_refused(
    tmp_path: Path, listener: socket.socket
) -> None:
    missing = tmp_path / "key.pem"
    url = _url(listener, "protocol=2")
    with pytest.raises(BadArgument, match=rf"ssl_keyfile=.*{missing}.*no such file"):
        connect(url, ssl_keyfile=str(missing))
    with pytest.raises(BadArgument, match=r"ssl_ca_certs"):
        connect_async(url, ssl_ca_certs=missing)

    with pytest.raises(BadArgument, match=r"ssl_ca_certs=.*is a directory"):
        connect(url, ssl_ca_certs=str(tmp_path))
    client = connect(url, ssl_ca_certs=Path(CA))  # present: passed on as given
    assert client.connection_pool.connection_kwargs["ssl_ca_certs"] == Path(CA)
    client.close()
    assert _no_connection(listener)


def test_the_worker_refuses_a_missing_tls_file_as_usage(
    tmp_path: Path, listener: socket.socket
) -> None:
    missing = tmp_path / "client.pem"
    url = _url(listener, f"ssl_certfile={missing}")
    for extra in ([], ["--processes", "2"]):
        res = subprocess.run(
            [sys.executable, "-m", "scheduler", "worker", "tests.workers.basic:registry",
             "--url", url, "-q", "q", *extra],
            cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert res.returncode == EXIT_USAGE, res.stderr
        assert "ssl_certfile" in res.stderr and str(missing) in res.stderr, res.stderr
    assert _no_connection(listener)


@pytest.fixture(scope="module")
def real_tls(tmp_path_factory: pytest.TempPathFactory) -> Tls:
    require_binary("openssl", "TLS tests make their certificates with it")
    return make_tls(str(tmp_path_factory.mktemp("tls")))


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("ssl_ca_certs", "holds no PEM CA certificate"),
        ("ssl_certfile", "holds no PEM certificate"),
        ("ssl_keyfile", "holds no PEM private key"),
    ],
)
def test_a_tls_file_that_is_not_pem_is_a_usage_error_naming_it(
    name: str, why: str, tmp_path: Path, listener: socket.socket, real_tls: Tls
) -> None:
    """A CA file that holds no certificate was redis-py's '[X509: NO_CERTIFICATE_OR_CRL_FOUND]'
    at connect time, a certificate file without one '[SSL] PEM lib': 'cannot reach Redis'."""
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    wrong = {"ssl_ca_certs": real_tls.key, "ssl_certfile": real_tls.key}.get(name, real_tls.cert)
    for path in (str(junk), wrong):  # junk, and the other PEM file of the pair by mistake
        url = _url(listener, f"{name}={path}")
        with pytest.raises(BadArgument, match=rf"{name}=.*{why}"):
            parse_url(url)
        res = CliRunner().invoke(main, ["stats", "--url", url])
        assert res.exit_code == EXIT_USAGE and why in res.output, res.output
    with pytest.raises(BadArgument, match=why):
        connect(_url(listener, "protocol=2"), **{name: str(junk)})
    assert _no_connection(listener)


def test_real_pem_files_are_taken(real_tls: Tls) -> None:
    t = parse_url(
        f"rediss://h:1/0?ssl_ca_certs={real_tls.ca}&ssl_certfile={real_tls.cert}"
        f"&ssl_keyfile={real_tls.key}"
    )
    assert t.options["ssl_ca_certs"] == real_tls.ca and t.options["ssl_keyfile"] == real_tls.key
    combined = Path(real_tls.dir) / "both.pem"  # certificate and key in one file
    combined.write_text(Path(real_tls.cert).read_text() + Path(real_tls.key).read_text())
    parse_url(f"rediss://h:1/0?ssl_certfile={combined}")


@pytest.fixture(scope="module")
def encrypted_key(real_tls: Tls) -> str:
    path = str(Path(real_tls.dir) / "enc.key")
    subprocess.run(["openssl", "pkey", "-in", real_tls.key, "-aes256", "-passout", "pass:pw",
                    "-out", path], check=True, capture_output=True)  # fmt: skip
    return path


def test_an_encrypted_key_without_its_password_is_refused_not_prompted_for(
    real_tls: Tls, encrypted_key: str, listener: socket.socket
) -> None:
    """OpenSSL asks for an encrypted key's passphrase on the terminal when no ssl_password is
    given: `scheduler stats` hung at 'Enter PEM pass phrase:' (a worker without a terminal:
    'cannot reach Redis'). Refused before any connection, naming the file; with the password
    it is taken."""
    pair = f"ssl_certfile={real_tls.cert}&ssl_keyfile={encrypted_key}"
    url = _url(listener, pair)
    with pytest.raises(BadArgument, match=r"ssl_keyfile=.*encrypted.*ssl_password"):
        parse_url(url)
    with pytest.raises(BadArgument, match=r"encrypted"):
        connect(_url(listener, "protocol=2"), ssl_certfile=real_tls.cert, ssl_keyfile=encrypted_key)
    res = subprocess.run(
        [sys.executable, "-m", "scheduler", "stats", "--url", url],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert res.returncode == EXIT_USAGE and "encrypted" in res.stderr, res.stderr
    cluster = f"rediss+cluster://127.0.0.1:{listener.getsockname()[1]}/?{pair}"
    with pytest.raises(BadArgument, match=r"encrypted"):
        parse_url(cluster)
    assert _no_connection(listener)
    t = parse_url(f"{url}&ssl_password=pw")
    assert t.options["ssl_keyfile"] == encrypted_key
    client = connect(_url(listener, "protocol=2"), ssl_certfile=real_tls.cert,
                     ssl_keyfile=encrypted_key, ssl_password="pw")  # fmt: skip
    client.close()


def test_a_wrong_key_password_is_refused_without_showing_it(
    real_tls: Tls, encrypted_key: str, listener: socket.socket
) -> None:
    """A wrong ssl_password was '[SSL] bad decrypt' at connect time: 'cannot reach Redis'."""
    url = _url(listener, f"ssl_certfile={real_tls.cert}&ssl_keyfile={encrypted_key}")
    with pytest.raises(BadArgument, match=r"ssl_password does not decrypt ssl_keyfile") as info:
        parse_url(f"{url}&ssl_password=Wr0ngPw")
    assert "Wr0ngPw" not in str(info.value)
    res = CliRunner().invoke(main, ["stats", "--url", f"{url}&ssl_password=Wr0ngPw"])
    assert res.exit_code == EXIT_USAGE and "does not decrypt" in res.output, res.output
    assert "Wr0ngPw" not in res.output
    with pytest.raises(BadArgument, match=r"does not decrypt"):
        connect(_url(listener, "protocol=2"), ssl_certfile=real_tls.cert,
                ssl_keyfile=encrypted_key, ssl_password="nope")  # fmt: skip
    assert _no_connection(listener)


def test_a_key_that_is_not_the_certificates_is_refused(
    real_tls: Tls, listener: socket.socket
) -> None:
    """A mismatched pair was '[X509: KEY_VALUES_MISMATCH]' at connect time: 'cannot reach'."""
    other_key = str(Path(real_tls.dir) / "other-ca.key")
    url = _url(listener, f"ssl_certfile={real_tls.cert}&ssl_keyfile={other_key}")
    with pytest.raises(BadArgument, match=r"ssl_keyfile=.* is not the private key of"):
        parse_url(url)
    res = CliRunner().invoke(main, ["stats", "--url", url])
    assert res.exit_code == EXIT_USAGE and "is not the private key" in res.output, res.output
    assert _no_connection(listener)


def test_a_client_certificate_the_checks_take_connects_to_a_mutual_tls_server(
    real_tls: Tls, encrypted_key: str
) -> None:
    """End to end: a server that requires a client certificate (signed by its CA) takes the
    pair the checks above let through, the encrypted key with its ssl_password too."""
    from scheduler._spawn import RedisProcess, free_port

    port = free_port()
    args = [*real_tls.server_args(port)]
    args[args.index("--tls-auth-clients") + 1] = "yes"
    with RedisProcess(require_server("a TLS server"), args) as server:
        assert server.client().ping()
        base = f"rediss://localhost:{port}/0?ssl_ca_certs={real_tls.ca}&socket_timeout=5"
        for pair in (
            f"ssl_certfile={real_tls.cert}&ssl_keyfile={real_tls.key}",
            f"ssl_certfile={real_tls.cert}&ssl_keyfile={encrypted_key}&ssl_password=pw",
        ):
            q = Queue.from_url(f"{base}&{pair}", "tls-files")
            job_id = q.enqueue("t", {"n": 1})
            assert q.status(job_id) == "due"
            q.close()
        bare = Queue.from_url(base, "tls-files")  # no client certificate: the server refuses
        with pytest.raises(redis.ConnectionError):
            bare.counts()
        bare.close()

"""`scheduler worker --metrics-port` on a port already taken: one line and exit 1, not a
traceback (before: the OSError of prometheus-client's bind ended the worker as a crash)."""

from __future__ import annotations

import socket
import subprocess
import sys


def test_a_taken_metrics_port_is_one_line_and_exit_1(redis_url: str) -> None:
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        held.listen()
        port = held.getsockname()[1]
        cmd = [sys.executable, "-c", "from scheduler.cli.main import main; main()", "worker",
               "tests.workers.basic:registry", "--url", redis_url, "-q", "metricsport",
               "--metrics-port", str(port)]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stderr
    assert f"error: cannot serve metrics on port {port}" in proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout

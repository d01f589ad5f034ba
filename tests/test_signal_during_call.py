"""A signal handler that raises (Ctrl-C's KeyboardInterrupt, a SIGTERM handler's sys.exit)
while a queue call is out raises in the caller; it crashed the interpreter with SIGSEGV when it
landed while hiredis.pack_command turned the script's KEYS count (an int) into text (hiredis 3.5
runs pending signal handlers there and does not survive one raising). An audit hit it within a
second, every time. And one landing between a call's send and its reply left the reply unread
on a pooled connection: the next call read it as its own (a counts() parsed an enqueue's reply
and raised IndexError); the connection is dropped now. A child process: a crash would take the
test runner with it."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from scheduler._spawn import RedisProcess

CHILD = textwrap.dedent(
    """
    import random, signal, sys, time
    from redis.exceptions import MaxConnectionsError
    from scheduler import Queue
    q = Queue.from_url(sys.argv[1], "sig")
    q.enqueue("t", {})
    armed = [False]
    def handler(sig, frame):
        if armed[0]:
            signal.default_int_handler(sig, frame)  # what Ctrl-C runs
    signal.signal(signal.SIGALRM, handler)
    calls = interrupted = 0
    end = time.monotonic() + float(sys.argv[2])
    while time.monotonic() < end:
        try:
            armed[0] = True
            signal.setitimer(signal.ITIMER_REAL, random.random() * 0.002)
            q.counts()
            q.enqueue("t", {"n": calls})
            calls += 1
        except KeyboardInterrupt:
            interrupted += 1
        except MaxConnectionsError:
            # An interrupt between a connection's checkout and the code that returns it
            # loses it (redis-py's own pool too): a storm of thousands exhausts the pool.
            break
        finally:
            armed[0] = False
            signal.setitimer(signal.ITIMER_REAL, 0)
    print(calls, interrupted)
    """
)


def test_a_raising_signal_handler_mid_call_raises_instead_of_crashing(
    module_server: RedisProcess,
) -> None:
    done = subprocess.run([sys.executable, "-c", CHILD, module_server.url, "4"],
                          capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])  # -11: SIGSEGV
    calls, interrupted = map(int, done.stdout.split())
    assert calls > 100 and interrupted > 10, done.stdout  # the signal did land mid-call

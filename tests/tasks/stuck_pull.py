"""Test task: the arith task, except that searcher rank STUCK_RANK hangs in its receive of the pushed weights from its
pull number STUCK_AFTER on, as a searcher whose engine hangs in C code mid-push would: it touches the file
STUCK_MARKER and sleeps an hour, alive, before it takes the first bucket in, so rank 0's broadcast to it never
completes, and with SIGTERM and SIGINT blocked (Python's handlers never run inside a hung C call) only SIGKILL ends
it. Used to check that a stopped rank 0 does not wait for that broadcast (tests/test_resilience.py)."""
import os
import signal
import time

import transport
from rewards import arith
from rewards.arith import DEFAULT_TEST, DEFAULT_TRAIN, load  # noqa: F401  (the task interface)

pulls = 0
_stream = transport.WeightTransport._stream


def stuck_stream(self):
    """WeightTransport._stream, hanging before its first receive from pull STUCK_AFTER on."""
    global pulls
    pulls += 1
    if pulls >= int(os.environ.get("STUCK_AFTER", "1")):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # deaf, as inside a C call
        open(os.environ["STUCK_MARKER"], "w").close()
        time.sleep(3600)
    yield from _stream(self)


if os.environ.get("RANK") == os.environ.get("STUCK_RANK"):  # every rank imports the task: only this one hangs
    transport.WeightTransport._stream = stuck_stream


def reward(completion, answer):
    return arith.reward(completion, answer)


def correct(completion, answer):
    return arith.reward(completion, answer) >= 1.0

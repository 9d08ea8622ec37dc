"""Stopping a process on SIGINT or SIGTERM without deadlocking it.

A Python signal handler runs in the main thread, between two bytecodes of whatever that thread was
doing. When the main thread waits on the very ``threading.Event`` the handler sets, it may be
holding the event's lock at that moment (``Event.wait`` takes it to check the flag, and takes it
again on waking), and ``Event.set`` from the handler then waits forever for a lock its own thread
holds: a daemon that ignores every further SIGTERM (seen in CI, `tuner daemon` under load).

And the handler runs only when the main thread runs bytecode. The kernel delivers a process's
signal to any thread that does not block it, gRPC's and uvicorn's included; then only a flag is
set, and a main thread blocked in an untimed ``Event.wait`` never looks at it: the daemon slept
through SIGTERM (seen in CI, one run in a few dozen). :func:`wait_for_stop` waits in slices.
"""

from __future__ import annotations

import signal
import threading
from typing import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# How late a stop signal delivered to another thread may be seen: the main thread wakes this often.
SIGNAL_CHECK_S = 0.25


def call_on_signals(action: Callable[[], None], signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
    """Run ``action`` (setting an event, asking a loop to stop) when one of ``signals`` arrives,
    on a short-lived thread of its own, so that it never waits on a lock the interrupted main
    thread holds. Call from the main thread."""

    def handler(signum, frame) -> None:
        threading.Thread(target=action, name="tunefleet-signal", daemon=True).start()

    for sig in signals:
        signal.signal(sig, handler)


def wait_for_stop(stop: threading.Event) -> None:
    """Wait in the main thread until ``stop`` is set, waking every :data:`SIGNAL_CHECK_S` so that a
    signal the kernel gave another thread still runs its handler (see the module's docstring)."""
    while not stop.wait(SIGNAL_CHECK_S):
        pass

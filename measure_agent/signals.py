"""Stopping a process on SIGINT or SIGTERM without deadlocking it.

A Python signal handler runs in the main thread, between two bytecodes of whatever that thread was
doing. When the main thread waits on the very ``threading.Event`` the handler sets, it may be
holding the event's lock at that moment (``Event.wait`` takes it to check the flag, and takes it
again on waking), and ``Event.set`` from the handler then waits forever for a lock its own thread
holds: a daemon that ignores every further SIGTERM (seen in CI, `tuner daemon` under load).
"""

from __future__ import annotations

import signal
import threading
from typing import Callable

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def call_on_signals(action: Callable[[], None], signals: tuple[signal.Signals, ...] = STOP_SIGNALS) -> None:
    """Run ``action`` (setting an event, asking a loop to stop) when one of ``signals`` arrives,
    on a short-lived thread of its own, so that it never waits on a lock the interrupted main
    thread holds. Call from the main thread."""

    def handler(signum, frame) -> None:
        threading.Thread(target=action, name="tunefleet-signal", daemon=True).start()

    for sig in signals:
        signal.signal(sig, handler)

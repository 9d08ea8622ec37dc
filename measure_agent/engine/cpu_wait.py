"""How long this process's threads waited for a CPU: tells a disturbed timing from a clean one.

A parallel kernel timed while other work runs on the same cores is slowed by however long its
threads sat runnable but descheduled, and the wall clock cannot tell that from a slow kernel. Linux
counts that time per thread (``/proc/<pid>/task/<tid>/schedstat``, second field: nanoseconds spent
waiting on a run queue). Summed over the process's threads around a repeat and divided by the
repeat's wall time it is the repeat's *wait share*: measured on a quiet 2-core host 0.000-0.034
for a 2-thread matmul (2.5-2.7 ms a call), and 0.49-0.76 with two other busy processes (4.3 ms a
call). The run worker times again a repeat whose share is above :data:`DISTURBED_WAIT_SHARE`
(:func:`measure_agent.engine.worker.time_repeats`).

Elsewhere (macOS, Windows, a /proc without schedstat) there is no such clock and timings are
taken as they come.
"""

from __future__ import annotations

import os
from typing import Callable

# A repeat whose threads waited for a CPU longer than this share of its wall time was disturbed.
DISTURBED_WAIT_SHARE = 0.05

_TASKS = "/proc/self/task"


def process_cpu_wait() -> float:
    """Seconds this process's live threads have waited for a CPU since they started."""
    waited = 0
    for tid in os.listdir(_TASKS):
        try:
            with open(f"{_TASKS}/{tid}/schedstat", "rb") as stat:
                waited += int(stat.read().split()[1])
        except (OSError, IndexError, ValueError):  # a thread that ended meanwhile
            continue
    return waited / 1e9


def cpu_wait_clock() -> Callable[[], float] | None:
    """:func:`process_cpu_wait` where this system keeps the counts, else None."""
    try:
        with open(f"{_TASKS}/{os.getpid()}/schedstat", "rb") as stat:
            int(stat.read().split()[1])
    except (OSError, IndexError, ValueError):
        return None
    return process_cpu_wait

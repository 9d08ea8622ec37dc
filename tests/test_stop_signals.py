"""SIGTERM and SIGINT stop the daemon, the dashboard and the agent even when they land while the
main thread holds the lock of the event it waits on, or land in another thread (a daemon in CI once
ignored every SIGTERM; another slept through one)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

pytestmark = pytest.mark.timeout(60)


def test_a_stop_signal_landing_while_the_main_thread_holds_the_events_lock_still_stops_it():
    # In a child process, so that the old handler's deadlock fails this test instead of hanging pytest.
    script = textwrap.dedent("""
        import os, signal, threading
        from measure_agent.signals import call_on_signals

        stop = threading.Event()
        call_on_signals(stop.set, (signal.SIGUSR1,))
        with stop._cond:  # where Event.wait is when the signal lands: holding the event's lock
            os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs here, in this thread
            for _ in range(1000):  # some bytecodes, so that it has run before the lock is let go
                pass
        print("stopped" if stop.wait(10) else "not stopped", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert done.stdout.strip() == "stopped", done.stderr


def test_the_stop_signals_are_handed_to_a_thread_of_their_own():
    from measure_agent.signals import call_on_signals

    previous = signal.getsignal(signal.SIGUSR1)
    on_main_thread = []
    done = threading.Event()

    def action():
        on_main_thread.append(threading.current_thread() is threading.main_thread())
        done.set()

    try:
        call_on_signals(action, (signal.SIGUSR1,))
        os.kill(os.getpid(), signal.SIGUSR1)
        assert done.wait(10)
        assert on_main_thread == [False]
    finally:
        signal.signal(signal.SIGUSR1, previous)


def test_a_stop_signal_the_kernel_gives_another_thread_still_wakes_the_waiting_main_thread():
    # The kernel may deliver a process's SIGTERM to any thread (gRPC's, uvicorn's); an untimed
    # Event.wait in the main thread then never ran the handler (a daemon in CI slept through it).
    script = textwrap.dedent("""
        import signal, threading, time
        from measure_agent.signals import call_on_signals, wait_for_stop

        stop = threading.Event()
        call_on_signals(stop.set, (signal.SIGUSR1,))

        def signal_this_thread():
            time.sleep(0.3)  # the main thread is waiting by then
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)

        threading.Thread(target=signal_this_thread).start()
        wait_for_stop(stop)
        print("stopped", flush=True)
    """)
    try:
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the main thread slept through a signal delivered to another thread")
    assert done.stdout.strip() == "stopped", done.stderr

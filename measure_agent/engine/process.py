"""A worker subprocess seen from the parent: send a request, wait with a deadline, survive crashes."""

from __future__ import annotations

import json
import math
import os
import re
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from measure_agent.engine.runtime import KernelRuntime

# "path.py:748: NumbaPerformanceWarning: ..." and the source line Python prints under it
_WARNING_LINE = re.compile(r"^\S.*:\d+: \w*Warning: ")
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


WORKER_ROLES = ("build", "run")


class WorkerCrashed(Exception):
    """The worker process died while handling a request."""


class WorkerTimedOut(Exception):
    """The worker did not answer within the deadline (it has been killed).

    ``stage``: which answer of :meth:`WorkerProcess.request_stages` was late (0 for ``request``)."""

    def __init__(self, message: str, stage: int = 0) -> None:
        super().__init__(message)
        self.stage = stage


class WorkerProcess:
    """One ``python -m measure_agent.engine.worker`` child, restarted on demand.

    ``role`` (``build`` or ``run``) goes on the worker's command line, so that an operator (and
    deploy/arm/smoke.sh, which reports a build worker's peak memory) can tell the two apart."""

    def __init__(
        self,
        catalog: str,
        cache_dir: Path,
        runtime: KernelRuntime | None = None,
        role: str = "build",
    ) -> None:
        if role not in WORKER_ROLES:
            raise ValueError(f"worker role must be one of {', '.join(WORKER_ROLES)}, not {role!r}")
        self.catalog = catalog
        self.cache_dir = cache_dir
        self.role = role
        self.runtime = runtime if runtime is not None else KernelRuntime.resolve()
        self._proc: subprocess.Popen | None = None
        self._stderr_path: str | None = None
        self._buffer = b""
        self._next_id = 0
        self._poller = None  # a select.poll() on the child's stdout, while it lives

    def start(self) -> None:
        # set before the child imports numba: what tuner.best_kernel applies in an application too
        env = {**os.environ, **self.runtime.environment()}
        fd, self._stderr_path = tempfile.mkstemp(prefix="tunefleet-worker-", suffix=".log")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "measure_agent.engine.worker", "--catalog", self.catalog,
             "--cache-dir", str(self.cache_dir), "--role", self.role],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=fd,
            env=env,
            start_new_session=True,  # a kernel's threads and children die with its group
        )
        os.close(fd)
        self._buffer = b""
        # one poll object for the child's life (making a selector per read cost an agent ~0.1 ms per
        # candidate), used directly: the selectors module's wrapper is Python run at every reply
        self._poller = select.poll()
        self._poller.register(self._proc.stdout.fileno(), select.POLLIN)  # type: ignore[union-attr]

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def request(self, message: dict, timeout_s: float) -> dict:
        """Send ``message`` and return the reply; raise on crash or timeout (worker then gone)."""
        return self.request_stages(message, [timeout_s])[-1]

    def request_stages(self, message: dict, timeouts_s: list[float]) -> list[dict]:
        """Send ``message`` and read up to one answer per stage, each within its own limit: a
        worker answers an intermediate stage with ``"stage": True`` and may end early with a final
        answer (a failure). Returns the answers read; raises as :meth:`request`, with the stage."""
        if not self.alive:
            self.stop()
            self.start()
        assert self._proc is not None and self._proc.stdin is not None
        self._next_id += 1
        message = dict(message, id=self._next_id)
        try:
            self._proc.stdin.write((json.dumps(message) + "\n").encode())
            self._proc.stdin.flush()
        except (BrokenPipeError, OSError):
            raise WorkerCrashed(self._death_message()) from None
        replies: list[dict] = []
        for stage, timeout_s in enumerate(timeouts_s):
            reply = self._read_reply(timeout_s, stage)
            replies.append(reply)
            if not reply.get("stage"):
                break
        return replies

    def _read_reply(self, timeout_s: float, stage: int) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            newline = self._buffer.find(b"\n")
            if newline >= 0:
                line, self._buffer = self._buffer[:newline], self._buffer[newline + 1:]
                reply = json.loads(line)
                if reply.get("id") == self._next_id:
                    return reply
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerTimedOut(f"no answer within {timeout_s:g} s", stage)
            chunk = self._read_some(remaining)
            if chunk == b"":
                raise WorkerCrashed(self._death_message())
            if chunk is not None:
                self._buffer += chunk

    def _read_some(self, timeout_s: float) -> bytes | None:
        assert self._proc is not None and self._proc.stdout is not None and self._poller is not None
        # poll() takes milliseconds, rounded up so that a wait never ends before its deadline
        if not self._poller.poll(math.ceil(min(timeout_s, 0.5) * 1000.0)):
            return None
        return os.read(self._proc.stdout.fileno(), 65536)

    def _death_message(self) -> str:
        code = None
        if self._proc is not None:
            try:
                code = self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.kill()
        if code is not None and code < 0:
            try:
                reason = f"worker killed by {signal.Signals(-code).name}"
            except ValueError:
                reason = f"worker killed by signal {-code}"
        else:
            reason = f"worker exited with code {code}"
        tail = self._stderr_tail()
        self.stop()
        return f"{reason}: {tail}" if tail else reason

    def _stderr_tail(self, lines: int = 3) -> str:
        if not self._stderr_path:
            return ""
        try:
            with open(self._stderr_path, "rb") as fh:
                fh.seek(0, os.SEEK_END)
                fh.seek(max(0, fh.tell() - 4096))
                text = fh.read().decode(errors="replace")
        except OSError:
            return ""
        kept = _error_lines(text)[-lines:]
        return " | ".join(kept)[:500]

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                self._proc.kill()
            self._proc.wait()
        self.stop()

    def stop(self) -> None:
        """Close the child (politely: EOF on stdin, then kill if it lingers)."""
        proc, self._proc = self._proc, None
        self._poller = None
        if proc is not None:
            if proc.poll() is None:
                try:
                    proc.stdin.close()  # type: ignore[union-attr]
                    proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    proc.kill()
                    proc.wait()
            for stream in (proc.stdin, proc.stdout):
                try:
                    stream.close()  # type: ignore[union-attr]
                except OSError:
                    pass
        if self._stderr_path:
            try:
                os.unlink(self._stderr_path)
            except OSError:
                pass
            self._stderr_path = None


def _error_lines(stderr_text: str) -> list[str]:
    """The non-empty lines of a worker's stderr without Python warnings (each warning line and the
    source line printed under it) and terminal colour codes: what a dead worker's message quotes
    must be its error, not the performance warning numba-cuda printed before it (seen on an H200:
    "Grid size 64 will likely result in GPU under-utilization" hid CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)."""
    kept: list[str] = []
    skip_next = False
    for raw in stderr_text.splitlines():
        line = _ANSI_ESCAPE.sub("", raw)
        if _WARNING_LINE.match(line.strip()):
            skip_next = True
            continue
        if skip_next and raw.startswith((" ", "\t")):
            skip_next = False
            continue
        skip_next = False
        if line.strip():
            kept.append(line.strip())
    return kept

"""The worker process: builds or runs one candidate at a time, on request.

Started by :mod:`measure_agent.engine.pool` as ``python -m measure_agent.engine.worker``. It reads
one JSON request per line on stdin and answers one JSON line on a private copy of the original
stdout; the kernel's own prints go to stderr. A candidate that crashes or hangs takes only this
process down; the parent sees EOF or a timeout and starts a new worker.

Requests (``op``):
- ``build``: render the kernel, compile it (numba caches it on disk) and report compile time; sent
  to the run worker too, where it loads the cached machine code before timing starts;
- ``run``: warm up, check the output against the reference, time it per :class:`TimingConfig`
  through the call an application makes (:class:`~measure_agent.engine.kernel_call.KernelCall`);
  its details carry the runtime settings read back from numba (:mod:`measure_agent.engine.runtime`:
  the process runs with the :class:`KernelRuntime` its parent put in its environment) and, on
  Linux, how long its threads waited for a CPU: a repeat that other work on the host slowed is
  timed again (:func:`time_repeats`, :mod:`measure_agent.engine.cpu_wait`).

CUDA candidates (``KernelSource.launch == "cuda"``, see :meth:`Worker._run_cuda`) differ in where
the arrays live and in the clock: the inputs are copied to the device once per workload, outside
any timing; ``out`` is a device array, copied back for the check; and a repeat's launches are timed
on the GPU, between two CUDA events (:func:`time_launches_with_events`), not by the host's clock
around ``cuda.synchronize()``, which would add the launch and synchronisation overheads. numba.cuda
is imported only for them.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from measure_agent.device import cuda_simulated, detect_device
from measure_agent.engine.arrays import empty_aligned
from measure_agent.engine.build import compile_cuda_kernel, compile_kernel, load_kernel, source_digest
from measure_agent.engine.checking import Problem, check_output, make_problem
from measure_agent.engine.cpu_wait import DISTURBED_WAIT_SHARE, cpu_wait_clock
from measure_agent.engine.kernel_call import KernelCall, time_kernel_calls
from measure_agent.engine.runtime import KernelRuntime, runtime_in_effect
from measure_agent.engine.types import MeasureStatus, TimingConfig
from measure_agent.space import ConfigError
from measure_agent.templates import TemplateCatalog, load_catalog
from measure_agent.workload import Workload, WorkloadError, parse_workload


class CandidateError(Exception):
    """A failure attributable to the candidate, carried back as a status."""

    def __init__(self, status: MeasureStatus, message: str) -> None:
        super().__init__(message)
        self.status = status


class Worker:
    def __init__(self, catalog: TemplateCatalog, cache_dir: Path) -> None:
        self.catalog = catalog
        self.cache_dir = cache_dir
        self.device = detect_device()
        self._problems: dict[str, Problem] = {}
        self._device_inputs: dict[str, tuple] = {}  # CUDA: the problem's inputs on the device
        self._cpu_wait = cpu_wait_clock()  # None where the system does not count it
        self.runtime = KernelRuntime.resolve()  # what the parent started this process with
        self.runtime.apply_malloc()  # glibc took them from the environment too; not every libc does

    def handle(self, request: dict, answer_stage=None) -> dict:
        """The final answer to ``request``. A ``run`` with ``"load_first": true`` loads (or
        compiles) the kernel first and, when that worked, answers that stage through
        ``answer_stage`` before timing starts, so the parent can hold each stage to its own limit."""
        op = request.get("op")
        if op == "ping":
            return {"ok": True, "pid": os.getpid()}
        try:
            workload, kernel_source = self._render(request)
            if op == "build":
                return self._build(workload, kernel_source)
            if op == "run":
                if request.get("load_first"):
                    loaded = self._build(workload, kernel_source)
                    if loaded.get("status") != MeasureStatus.OK.value or answer_stage is None:
                        return loaded
                    answer_stage(dict(loaded, stage=True))
                return self._run(workload, kernel_source, TimingConfig(**request["timing"]))
            return {"status": MeasureStatus.RUNTIME_ERROR.value, "message": f"unknown request {op!r}"}
        except CandidateError as exc:
            return {"status": exc.status.value, "message": str(exc)}

    def _render(self, request: dict):
        try:
            workload = parse_workload(request["workload"])
            target = request.get("target", "cpu")
            template = self.catalog.get(workload.op, target)
            config = self.catalog.space(workload, target, self.device).from_json(request["config"])
        except (WorkloadError, ConfigError, LookupError) as exc:
            raise CandidateError(MeasureStatus.INVALID_CONFIG, str(exc)) from None
        return workload, template.render(workload, config)

    def _problem(self, workload: Workload) -> Problem:
        if workload.key not in self._problems:
            self._problems.clear()  # one workload at a time in practice; bound memory
            self._device_inputs.clear()
            self._problems[workload.key] = make_problem(workload)
        return self._problems[workload.key]

    def _call_args(self, workload: Workload, kernel_source, problem_inputs) -> tuple:
        out = np.empty(workload.spec.output_shape(workload.params), dtype=workload.dtype)
        return (*problem_inputs, out, *kernel_source.runtime_args)

    def _build(self, workload: Workload, kernel_source) -> dict:
        try:
            kernel = load_kernel(kernel_source, self.cache_dir)
            # Types are all that matter for compiling: tiny arrays of the right dtype and rank.
            tiny = tuple(np.zeros((1,) * x.ndim, dtype=x.dtype) for x in self._tiny_inputs(workload))
            if kernel_source.launch == "cuda":
                seconds = compile_cuda_kernel(kernel, self._call_args(workload, kernel_source, tiny))
            else:
                seconds = compile_kernel(kernel, self._call_args(workload, kernel_source, tiny))
        except Exception as exc:  # noqa: BLE001 - any compile failure belongs to the candidate
            raise CandidateError(MeasureStatus.COMPILE_ERROR, _one_line(exc)) from None
        return {"status": MeasureStatus.OK.value, "compile_time_s": seconds, "kernel": source_digest(kernel_source)}

    def _tiny_inputs(self, workload: Workload) -> tuple[np.ndarray, ...]:
        # Types are all that matter: the workload's own (shape-only) arrays, never filled.
        return tuple(np.broadcast_to(np.zeros((), workload.dtype), shape)
                     for shape in workload.spec.array_shapes(workload.params)[:-1])

    def _run(self, workload: Workload, kernel_source, timing: TimingConfig) -> dict:
        try:
            kernel = load_kernel(kernel_source, self.cache_dir)
        except Exception as exc:  # noqa: BLE001
            raise CandidateError(MeasureStatus.COMPILE_ERROR, _one_line(exc)) from None
        if kernel_source.launch == "cuda":
            return self._run_cuda(workload, kernel, kernel_source, timing)
        problem = self._problem(workload)
        # the call an application makes through tuner.best_kernel: timed here with its checks
        call = KernelCall(kernel, workload, kernel_source.runtime_args, self.runtime)
        inputs = problem.inputs
        out = empty_aligned(workload.spec.output_shape(workload.params), workload.dtype)  # as the inputs are
        out.fill(np.nan)  # a kernel that leaves elements unwritten must not pass by luck
        try:
            for _ in range(max(1, timing.warmup)):
                call(*inputs, out=out)
        except Exception as exc:  # noqa: BLE001
            raise CandidateError(MeasureStatus.RUNTIME_ERROR, _one_line(exc)) from None
        # what numba runs it with, read back (an application's best_kernel reports the same); this
        # starts numba's threads if the kernel is serial, as an applied kernel's first call does
        runtime = runtime_in_effect().to_json()
        check = check_output(problem, out)
        details = {"max_abs_error": check.max_abs_error, "max_rel_error": check.max_rel_error}
        if not check.correct:
            return {
                "status": MeasureStatus.WRONG_ANSWER.value,
                "message": f"output differs from the reference: max abs error {check.max_abs_error:.3g}, "
                f"max rel error {check.max_rel_error:.3g}",
                "details": details,
            }
        try:
            # on the host's CPU: repeats that other work on the host slowed are timed again
            timed = time_repeats(lambda n: time_kernel_calls(call, inputs, out, n), timing, self._cpu_wait)
        except Exception as exc:  # noqa: BLE001
            raise CandidateError(MeasureStatus.RUNTIME_ERROR, _one_line(exc)) from None
        details["number"] = timed.number
        details["runtime"] = runtime
        details.update(timed.details())
        return {"status": MeasureStatus.OK.value, "costs": timed.costs, "details": details}

    # -- CUDA candidates ---------------------------------------------------------------------------
    def _run_cuda(self, workload: Workload, kernel, kernel_source, timing: TimingConfig) -> dict:
        """As :meth:`_run`, with device arrays, timed by CUDA events (the simulator's events time
        nothing, so under it the host's clock times each launch and synchronisation).

        A CUDA error can leave the process's context unusable (an illegal address is sticky), and
        every later candidate would fail with it. So a failing launch is not answered: the worker
        writes the error to stderr and exits, the engine reports a runtime error carrying that
        line, and the next request starts a fresh worker.
        """
        from numba import cuda

        problem = self._problem(workload)
        try:
            inputs = self._cuda_inputs(workload, problem)
            out = cuda.to_device(np.full(workload.spec.output_shape(workload.params), np.nan, dtype=workload.dtype))
        except Exception as exc:  # noqa: BLE001 - no device memory or no device: not the candidate's fault
            _abandon_cuda_context(exc)
        args = (*inputs, out, *kernel_source.runtime_args)

        def launch():
            kernel(*args)

        def call():
            launch()
            cuda.synchronize()

        if cuda_simulated():
            def time_calls(n: int) -> float:
                return time_calls_of(call, n)
        else:
            def time_calls(n: int) -> float:
                return time_launches_with_events(launch, n, cuda)

        try:
            for _ in range(max(1, timing.warmup)):
                call()
            actual = out.copy_to_host()
        except Exception as exc:  # noqa: BLE001
            _abandon_cuda_context(exc)
        check = check_output(problem, actual)
        details = {"max_abs_error": check.max_abs_error, "max_rel_error": check.max_rel_error}
        if not check.correct:
            return {
                "status": MeasureStatus.WRONG_ANSWER.value,
                "message": f"output differs from the reference: max abs error {check.max_abs_error:.3g}, "
                f"max rel error {check.max_rel_error:.3g}",
                "details": details,
            }
        try:
            costs, number = timed_costs(time_calls, timing)
        except Exception as exc:  # noqa: BLE001 - an asynchronous launch error surfaces at the event
            _abandon_cuda_context(exc)
        details["number"] = number
        return {"status": MeasureStatus.OK.value, "costs": costs, "details": details}

    def _cuda_inputs(self, workload: Workload, problem: Problem) -> tuple:
        """The problem's inputs on the device, copied once per workload (never during timing)."""
        from numba import cuda

        if workload.key not in self._device_inputs:
            self._device_inputs.clear()
            self._device_inputs[workload.key] = tuple(cuda.to_device(x) for x in problem.inputs)
        return self._device_inputs[workload.key]


@dataclass(frozen=True)
class TimedRepeats:
    """What :func:`time_repeats` measured: seconds per call for each repeat kept, the calls per
    repeat, and how the host disturbed it (``wait_shares``: per repeat kept, the share of its wall
    time this process's threads waited for a CPU; empty without a wait clock)."""

    costs: list[float]
    number: int
    wait_shares: list[float] = field(default_factory=list)
    redone: int = 0  # repeats timed again because their threads waited for a CPU

    def details(self) -> dict:
        """The result details that say how clean the timing was."""
        if not self.wait_shares:
            return {}
        return {"cpu_wait_share": round(max(self.wait_shares), 4), "repeats_redone": self.redone}


def time_repeats(time_calls, timing: TimingConfig, cpu_wait=None) -> TimedRepeats:
    """Time ``timing.repeat`` repeats of ``number`` back-to-back calls.

    ``time_calls(n)`` makes ``n`` back-to-back calls and returns the seconds they took. When a
    repeat takes less than ``min_repeat_ms``, the calls per repeat grow until it does not.

    With ``cpu_wait`` (seconds this process's threads have waited for a CPU, see
    :mod:`measure_agent.engine.cpu_wait`), a repeat whose threads waited longer than
    ``DISTURBED_WAIT_SHARE`` of it is timed again, at most ``2 * repeat`` times in all and for at
    most a quarter of ``run_timeout_s`` (a host that is always busy costs at most three times the
    timing, and never turns a slow kernel into a run timeout); the least disturbed attempt is kept.
    """
    number = timing.number
    if timing.min_repeat_ms > 0:
        elapsed = time_calls(number)
        while elapsed * 1000.0 < timing.min_repeat_ms and number < 1_000_000:
            scale = timing.min_repeat_ms / max(elapsed * 1000.0, 1e-3)
            number = min(1_000_000, max(number * 2, int(number * scale * 1.1) + 1))
            elapsed = time_calls(number)
    if cpu_wait is None:
        return TimedRepeats([time_calls(number) / number for _ in range(timing.repeat)], number)
    costs: list[float] = []
    shares: list[float] = []
    redo_left = 2 * timing.repeat
    redo_seconds_left = timing.run_timeout_s / 4
    redone = 0
    for _ in range(timing.repeat):
        best: tuple[float, float] | None = None  # (wait share, seconds) of the least disturbed attempt
        while True:
            waited_before = cpu_wait()
            elapsed = time_calls(number)
            share = max(0.0, cpu_wait() - waited_before) / max(elapsed, 1e-9)
            if best is None or share < best[0]:
                best = (share, elapsed)
            if share <= DISTURBED_WAIT_SHARE or redo_left == 0 or redo_seconds_left < elapsed:
                break
            redo_left -= 1
            redo_seconds_left -= elapsed
            redone += 1
        shares.append(best[0])
        costs.append(best[1] / number)
    return TimedRepeats(costs, number, shares, redone)


def timed_costs(time_calls, timing: TimingConfig, cpu_wait=None) -> tuple[list[float], int]:
    """Seconds per call for each repeat and the calls per repeat (:func:`time_repeats`)."""
    timed = time_repeats(time_calls, timing, cpu_wait)
    return timed.costs, timed.number


def time_calls_of(call, number: int) -> float:
    """Seconds for ``number`` back-to-back ``call()``s, by the host's clock."""
    start = time.perf_counter()
    for _ in range(number):
        call()
    return time.perf_counter() - start


def time_launches_with_events(launch, number: int, cuda) -> float:
    """Seconds the GPU took for ``number`` back-to-back ``launch()``es, between a CUDA event
    recorded before the first and one after the last on the default stream; the launches queue
    without waiting for each other. ``cuda``: the ``numba.cuda`` module (or one like it)."""
    start, end = cuda.event(), cuda.event()
    start.record()
    for _ in range(number):
        launch()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / 1000.0  # CUDA events count milliseconds


# Exit status of a worker that gave up its CUDA context after a failed launch (EX_SOFTWARE).
CUDA_FAILURE_EXIT_CODE = 70


def _abandon_cuda_context(exc: BaseException):
    """Report a CUDA failure on stderr and exit at once (see :meth:`Worker._run_cuda`)."""
    sys.stderr.write(f"CUDA candidate failed, worker exits for a fresh CUDA context: {_one_line(exc)}\n")
    sys.stderr.flush()
    os._exit(CUDA_FAILURE_EXIT_CODE)


_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*m")


def _one_line(exc: BaseException) -> str:
    text = _ANSI_ESCAPE.sub("", f"{type(exc).__name__}: {exc}").strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return " | ".join(lines)[:2000]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--catalog", default="default")
    parser.add_argument("--cache-dir", required=True)
    # what the parent uses this worker for; only shown (ps, /proc/PID/cmdline): both roles serve both ops
    parser.add_argument("--role", choices=("build", "run"), default="build")
    args = parser.parse_args(argv)
    # Protocol answers go to a private copy of stdout; fd 1 now points at stderr for kernel prints.
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    worker = Worker(load_catalog(args.catalog), Path(args.cache_dir))
    for line in sys.stdin:
        if not line.strip():
            continue
        request = None

        def answer_stage(stage: dict) -> None:
            stage["id"] = request.get("id")
            reply.write(json.dumps(stage) + "\n")

        try:
            request = json.loads(line)
            response = worker.handle(request, answer_stage)
        except Exception as exc:  # noqa: BLE001 - the worker must answer, whatever happened
            traceback.print_exc()
            response = {"status": MeasureStatus.RUNTIME_ERROR.value, "message": _one_line(exc)}
        response["id"] = request.get("id") if isinstance(request, dict) else None
        reply.write(json.dumps(response) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

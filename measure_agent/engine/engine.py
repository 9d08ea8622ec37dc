"""The measurement engine: validate, build in parallel, run one at a time, return typed results.

This is the code every agent runs, remote or embedded in ``tuner tune``. Builds of a batch run in
``build_workers`` processes at once; runs happen afterwards, one at a time in a single run worker,
so no compile or other kernel disturbs a timing. Each failure is contained in its worker process.
"""

from __future__ import annotations

import queue
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Sequence

from measure_agent.device import detect_device
from measure_agent.engine.build import default_kernel_cache_dir
from measure_agent.engine.process import WorkerCrashed, WorkerProcess, WorkerTimedOut
from measure_agent.engine.types import MeasureInput, MeasureResult, MeasureStatus, TimingConfig
from measure_agent.space import ConfigError
from measure_agent.templates import TemplateNotFound, load_catalog


class MeasureEngine:
    """Measures candidates on this host. Thread-safe for one ``measure`` call at a time."""

    def __init__(
        self,
        timing: TimingConfig = TimingConfig(),
        build_workers: int = 1,
        catalog: str = "default",
        cache_dir: Path | None = None,
    ) -> None:
        if build_workers < 1:
            raise ValueError("build_workers must be >= 1")
        self.timing = timing
        self.catalog_name = catalog
        self.catalog = load_catalog(catalog)
        self.device = detect_device()
        self.cache_dir = Path(cache_dir) if cache_dir else default_kernel_cache_dir()
        self._builders: queue.Queue[WorkerProcess] = queue.Queue()
        self._all_workers = [WorkerProcess(catalog, self.cache_dir) for _ in range(build_workers)]
        for worker in self._all_workers:
            self._builders.put(worker)
        self._runner = WorkerProcess(catalog, self.cache_dir)
        self._pool = ThreadPoolExecutor(max_workers=build_workers, thread_name_prefix="tunefleet-build")
        self._lock = threading.Lock()

    @property
    def template_version(self) -> str:
        return self.catalog.version

    def validate(self, item: MeasureInput) -> str | None:
        """Why ``item`` cannot be measured here, or None when it is a member of its space."""
        try:
            self.catalog.space(item.workload, item.target, self.device).validate(item.config)
        except (TemplateNotFound, ConfigError) as exc:
            return str(exc)
        return None

    def measure(self, items: Sequence[MeasureInput], timing: TimingConfig | None = None) -> list[MeasureResult]:
        """One result per item, in order. Never raises for a candidate's fault.

        ``timing`` overrides the engine's timing for this call (a fleet job brings its own).
        """
        timing = timing or self.timing
        with self._lock:
            results: list[MeasureResult | None] = [None] * len(items)
            to_build = []
            for i, item in enumerate(items):
                problem = self.validate(item)
                if problem is not None:
                    results[i] = MeasureResult(MeasureStatus.INVALID_CONFIG, message=problem)
                else:
                    to_build.append(i)
            built = list(self._pool.map(lambda i: (i, self._build(items[i], timing)), to_build))
            for i, build_result in built:
                if build_result.status is not MeasureStatus.OK:
                    results[i] = build_result
                else:
                    results[i] = self._run(items[i], build_result.compile_time_s, timing)
            return [r for r in results if r is not None]

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        for worker in self._all_workers + [self._runner]:
            worker.stop()

    def __enter__(self) -> "MeasureEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- internals --------------------------------------------------------------------------
    @staticmethod
    def _request(item: MeasureInput, op: str, timing: TimingConfig) -> dict:
        message = {"op": op, "workload": item.workload.key, "config": item.config.to_json(), "target": item.target}
        if op == "run":
            message["timing"] = {
                "number": timing.number,
                "repeat": timing.repeat,
                "min_repeat_ms": timing.min_repeat_ms,
                "warmup": timing.warmup,
            }
        return message

    def _build(self, item: MeasureInput, timing: TimingConfig) -> MeasureResult:
        worker = self._builders.get()
        try:
            reply = worker.request(self._request(item, "build", timing), timing.build_timeout_s)
        except WorkerTimedOut:
            return MeasureResult(MeasureStatus.BUILD_TIMEOUT, message=f"build exceeded {timing.build_timeout_s:g} s")
        except WorkerCrashed as exc:
            return MeasureResult(MeasureStatus.COMPILE_ERROR, message=f"build crashed: {exc}")
        finally:
            self._builders.put(worker)
        return _result_from_reply(reply)

    def _run(self, item: MeasureInput, compile_time_s: float, timing: TimingConfig) -> MeasureResult:
        try:
            # Loads the machine code the builder cached; a cache miss compiles under the build limit.
            loaded = self._runner.request(self._request(item, "build", timing), timing.build_timeout_s)
            if loaded.get("status") != MeasureStatus.OK.value:
                return _result_from_reply(loaded, compile_time_s)
            reply = self._runner.request(self._request(item, "run", timing), timing.run_timeout_s)
        except WorkerTimedOut:
            return MeasureResult(
                MeasureStatus.RUN_TIMEOUT, compile_time_s=compile_time_s,
                message=f"run exceeded {timing.run_timeout_s:g} s",
            )
        except WorkerCrashed as exc:
            return MeasureResult(MeasureStatus.RUNTIME_ERROR, compile_time_s=compile_time_s, message=str(exc))
        return _result_from_reply(reply, compile_time_s)


def _result_from_reply(reply: dict, compile_time_s: float | None = None) -> MeasureResult:
    try:
        status = MeasureStatus(reply.get("status"))
    except ValueError:
        status = MeasureStatus.RUNTIME_ERROR
    return MeasureResult(
        status=status,
        costs=tuple(float(c) for c in reply.get("costs", ())),
        compile_time_s=float(reply.get("compile_time_s", 0.0) if compile_time_s is None else compile_time_s),
        message=str(reply.get("message", "")),
        details=dict(reply.get("details", {})),
    )

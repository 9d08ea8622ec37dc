"""The measurement engine: validate, build in parallel, run one at a time, return typed results.

This is the code every agent runs, remote or embedded in ``tuner tune``. Builds of a batch run in
``build_workers`` processes at once; runs happen one at a time in a single run worker. Each
failure is contained in its worker process.

Two stages, :meth:`MeasureEngine.prepare` (validate and build) and :meth:`MeasureEngine.run`, so
that an agent can build its next batch while it runs this one where that cannot disturb a timing
(:meth:`MeasureEngine.builds_may_overlap_runs`); :meth:`MeasureEngine.measure` does both in turn.

The kernel cache is held to ``cache_max_mb`` (:mod:`measure_agent.engine.kernel_cache`): when the
kernels built since the last scan may have taken it past the cap, the least recently used kernels
are evicted (down to ``LOW_WATER`` of it), never one that a prepared candidate not yet run needs.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from measure_agent.device import detect_device
from measure_agent.engine.build import default_kernel_cache_dir, source_digest
from measure_agent.engine.kernel_cache import DEFAULT_CACHE_MAX_MB, LOW_WATER, ScanSchedule, evict_to_cap
from measure_agent.engine.process import WorkerCrashed, WorkerProcess, WorkerTimedOut
from measure_agent.engine.runtime import KernelRuntime
from measure_agent.engine.types import MeasureInput, MeasureResult, MeasureStatus, TimingConfig
from measure_agent.space import ConfigError
from measure_agent.templates import TemplateNotFound, load_catalog

logger = logging.getLogger("measure_agent.engine")


@dataclass(frozen=True)
class Prepared:
    """A candidate after :meth:`MeasureEngine.prepare`: built (``failed`` is None) or failed."""

    item: MeasureInput
    failed: MeasureResult | None = None
    compile_time_s: float = 0.0
    kernel: str = ""  # the digest of its kernel-cache entry, kept until it has run


class MeasureEngine:
    """Measures candidates on this host. Thread-safe: one ``prepare`` and one ``run`` (or one
    ``measure``) at a time, which may overlap each other."""

    def __init__(
        self,
        timing: TimingConfig = TimingConfig(),
        build_workers: int = 1,
        catalog: str = "default",
        cache_dir: Path | None = None,
        cache_max_mb: int = DEFAULT_CACHE_MAX_MB,
    ) -> None:
        if build_workers < 1:
            raise ValueError("build_workers must be >= 1")
        if cache_max_mb < 0:
            raise ValueError("cache_max_mb must be >= 0 (0: no cap)")
        self.timing = timing
        self.catalog_name = catalog
        self.catalog = load_catalog(catalog)
        self.device = detect_device()
        self.cache_dir = Path(cache_dir) if cache_dir else default_kernel_cache_dir()
        self.cache_max_bytes = cache_max_mb * 1024 * 1024
        # how the workers run kernels (threads, threading layer, wait policy, codegen): resolved
        # once, from this process's environment, as tuner.best_kernel resolves it in an application
        self.runtime = KernelRuntime.resolve()
        self._kernels_in_use: Counter[str] = Counter()  # prepared, not yet run: never evicted
        self._built_kernels: set[str] = set()  # built by this engine and still in the cache
        self._in_use_lock = threading.Lock()
        self._cache_scans = ScanSchedule(self.cache_max_bytes)
        self._builders: queue.Queue[WorkerProcess] = queue.Queue()
        self._all_workers = [WorkerProcess(catalog, self.cache_dir, self.runtime) for _ in range(build_workers)]
        for worker in self._all_workers:
            self._builders.put(worker)
        self._runner = WorkerProcess(catalog, self.cache_dir, self.runtime, role="run")
        self._pool = ThreadPoolExecutor(max_workers=build_workers, thread_name_prefix="tunefleet-build")
        self._build_lock = threading.Lock()
        self._run_lock = threading.Lock()

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
        return self.run(self.prepare(items, timing), timing)

    def prepare(self, items: Sequence[MeasureInput], timing: TimingConfig | None = None) -> list[Prepared]:
        """Validate and build ``items`` (in parallel); never raises for a candidate's fault."""
        timing = timing or self.timing

        def build(item: MeasureInput) -> Prepared:
            problem = self.validate(item)
            if problem is not None:
                return Prepared(item, MeasureResult(MeasureStatus.INVALID_CONFIG, message=problem))
            result, kernel = self._build(item, timing)
            if result.status is not MeasureStatus.OK:
                return Prepared(item, result)
            return Prepared(item, compile_time_s=result.compile_time_s, kernel=kernel)

        with self._build_lock:
            if len(items) == 1:  # no thread hop for the common one-candidate lease
                prepared = [build(items[0])]
            else:
                prepared = list(self._pool.map(build, items))
            built = [p.kernel for p in prepared if p.kernel]
            with self._in_use_lock:
                self._kernels_in_use.update(built)
            self._evict(len(built))
            return prepared

    def run(self, prepared: Sequence[Prepared], timing: TimingConfig | None = None) -> list[MeasureResult]:
        """Time the built candidates one at a time; one result per candidate, in order."""
        timing = timing or self.timing
        with self._run_lock:
            results = []
            for p in prepared:
                results.append(p.failed or self._run(p.item, p.compile_time_s, timing))
                if p.kernel:
                    with self._in_use_lock:
                        self._kernels_in_use -= Counter({p.kernel: 1})
            return results

    def builds_may_overlap_runs(self, items: Sequence[MeasureInput]) -> bool:
        """Whether building other candidates while these run leaves their timings alone: only when
        no kernel is timed on this host's CPU (a GPU kernel, or the testing sleep kernel)."""
        try:
            return all(not self.catalog.get(item.workload.op, item.target).timed_on_host_cpu for item in items)
        except TemplateNotFound:
            return False

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

    def _build(self, item: MeasureInput, timing: TimingConfig) -> tuple[MeasureResult, str]:
        """The build's result and the digest of the kernel it cached ("" when it failed).

        A config that renders a kernel this engine built before (configs differing only in knobs
        the kernel takes at run time share one) needs no build: the run worker loads the machine
        code from numba's disk cache (or compiles it, under the build limit, if it was evicted)."""
        kernel = self._kernel_digest(item)
        with self._in_use_lock:
            if kernel is not None and kernel in self._built_kernels:
                return MeasureResult(MeasureStatus.OK, compile_time_s=0.0), kernel
        worker = self._builders.get()
        try:
            reply = worker.request(self._request(item, "build", timing), timing.build_timeout_s)
        except WorkerTimedOut:
            return MeasureResult(MeasureStatus.BUILD_TIMEOUT, message=f"build exceeded {timing.build_timeout_s:g} s"), ""
        except WorkerCrashed as exc:
            return MeasureResult(MeasureStatus.COMPILE_ERROR, message=f"build crashed: {exc}"), ""
        finally:
            self._builders.put(worker)
        result, built = _result_from_reply(reply), str(reply.get("kernel", ""))
        if result.status is MeasureStatus.OK and built:
            with self._in_use_lock:
                self._built_kernels.add(built)
        return result, built

    def _kernel_digest(self, item: MeasureInput) -> str | None:
        """The digest of the kernel source ``item`` renders (as the worker renders it); None when
        it does not render here (the build worker then reports why)."""
        try:
            return source_digest(self.catalog.get(item.workload.op, item.target).render(item.workload, item.config))
        except Exception:  # noqa: BLE001 - a template's failure belongs to the candidate's build
            return None

    def _evict(self, kernels_built: int) -> None:
        """Hold the kernel cache to its cap, keeping every kernel a prepared candidate needs."""
        if not self._cache_scans.built(kernels_built):
            return
        with self._in_use_lock:
            keep = set(self._kernels_in_use)
        try:
            eviction = evict_to_cap(self.cache_dir, self.cache_max_bytes, keep,
                                    target_bytes=int(LOW_WATER * self.cache_max_bytes))
        except OSError as exc:  # a cache we cannot clean is no reason to stop measuring
            logger.warning("kernel cache %s: eviction failed: %s", self.cache_dir, exc)
            return
        self._cache_scans.scanned(eviction)
        with self._in_use_lock:
            self._built_kernels.difference_update(e.digest for e in eviction.evicted)
        if eviction.evicted:
            logger.debug("kernel cache: evicted %d kernels (%d bytes)", len(eviction.evicted),
                         sum(e.size_bytes for e in eviction.evicted))

    def _run(self, item: MeasureInput, compile_time_s: float, timing: TimingConfig) -> MeasureResult:
        try:
            # One request, two answers: the worker loads the machine code the builder cached (a
            # cache miss compiles, under the build limit), answers, then times (under the run limit).
            request = dict(self._request(item, "run", timing), load_first=True)
            replies = self._runner.request_stages(request, [timing.build_timeout_s, timing.run_timeout_s])
        except WorkerTimedOut as exc:
            if exc.stage == 0:
                return MeasureResult(MeasureStatus.BUILD_TIMEOUT, compile_time_s=compile_time_s,
                                     message=f"loading the kernel exceeded {timing.build_timeout_s:g} s")
            return MeasureResult(
                MeasureStatus.RUN_TIMEOUT, compile_time_s=compile_time_s,
                message=f"run exceeded {timing.run_timeout_s:g} s",
            )
        except WorkerCrashed as exc:
            return MeasureResult(MeasureStatus.RUNTIME_ERROR, compile_time_s=compile_time_s, message=str(exc))
        final = replies[-1]
        if final.get("stage"):  # the worker never answers a load with a stage and stops: defensive
            return MeasureResult(MeasureStatus.RUNTIME_ERROR, compile_time_s=compile_time_s,
                                 message="the run worker did not answer the run")
        return _result_from_reply(final, compile_time_s)


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

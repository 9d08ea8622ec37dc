"""The runtime settings of a process that runs kernels: one definition for the engine's workers and
for ``tuner.best_kernel``, so that an application runs a kernel the way it was measured.

A numba kernel's speed depends on more than its code: the threading layer (OpenMP, TBB or numba's
workqueue), the number of threads, how idle OpenMP threads wait (spinning or sleeping), and the
code-generation settings numba compiled it with. The engine's run worker used to get
``OMP_WAIT_POLICY=passive`` and the code-generation settings while an application calling
``best_kernel`` left libgomp spinning: on a host busier than its cores the spinning threads take
the cores their partners need, and the applied kernel ran 1.7-2x slower than recorded.

:class:`KernelRuntime` is what such a process sets, resolved once from the environment (an
operator's exported values win over the defaults, except the code-generation settings kernels need).
:meth:`KernelRuntime.apply` puts it in effect in this process, before numba starts its threads;
:func:`runtime_in_effect` reads back what numba actually uses, which the run worker reports with
every timing and :class:`tuner.apply.TunedKernel` keeps as ``runtime``.
"""

from __future__ import annotations

import ctypes
import os
import sys
from dataclasses import asdict, dataclass, field
from typing import Mapping, MutableMapping

from measure_agent.engine import build
from measure_agent.engine.build import NUMBA_ENVIRONMENT

# numba's threading layers (NUMBA_THREADING_LAYER): concrete ones, and the choices numba resolves
THREADING_LAYERS = ("default", "safe", "threadsafe", "forksafe", "omp", "tbb", "workqueue")
WAIT_POLICIES = ("passive", "active")

# Defaults an operator may override by exporting them. numba's OpenMP threads spin while they wait
# by default; on a host busier than its cores a spinning thread takes the core its partner needs (a
# 0.5 ms parallel kernel took 7 ms); waiting passively it took its serial time or less.
DEFAULT_WAIT_POLICY = "passive"
DEFAULT_THREADING_LAYER = "default"
# libgomp's GOMP_SPINCOUNT: how long (in busy-wait iterations, ~100,000 a millisecond by libgomp's
# own estimate) a waiting thread spins before it sleeps. Sleeping at once (passive alone) made every
# call of a small parallel kernel wait for its other thread to be woken, which on a VM costs more than
# the kernel: quiet 2-core AMD EPYC, dense 1x1000x2048 156 -> 80 us (OpenBLAS 77), matmul 128^3
# 100 -> 35 us, and the engine's timings of one config 0.24-0.31 ms passive, 0.087-0.093 ms with a
# spin. Short, because a thread that spins long enough to use up its scheduler slice is descheduled
# for a whole slice whenever any other process is runnable, even at nice 19: beside a nice-19 busy
# loop the engine recorded a 0.85 MFLOP depthwise kernel at 0.6-1.7 GFLOPS with 30000, 5-6 with
# 2000, 17-19 sleeping at once (quiet: 30-32, 28-30, 13-14). 2000 keeps the quiet-host gain and
# bounds the loss (docs/applying.md).
DEFAULT_SPIN_COUNT = 2000
MAX_SPIN_COUNT = 10**10
# glibc's malloc hands blocks from this size up to mmap, and gives the top of its heap back to the
# system once this much is free there. Its defaults (128 KiB, adjusted upwards to the largest block
# freed) made a kernel's per-call scratch arrays (packed weights, padded inputs, Winograd's
# transforms: megabytes) fresh pages on some calls, depending on the sizes: one Winograd conv2d ran
# at 74-98 GFLOPS instead of 187-355 (the whole call faulting its pages in again). 32 MiB is the
# largest mmap threshold glibc takes on 64-bit hosts; an operator may export either variable.
DEFAULT_MALLOC_MMAP_THRESHOLD = 32 * 1024 * 1024
DEFAULT_MALLOC_TRIM_THRESHOLD = 512 * 1024 * 1024
MALLOC_VARIABLES = {"MALLOC_MMAP_THRESHOLD_": DEFAULT_MALLOC_MMAP_THRESHOLD,
                    "MALLOC_TRIM_THRESHOLD_": DEFAULT_MALLOC_TRIM_THRESHOLD}
# mallopt's parameter numbers (malloc.h)
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


class RuntimeSettingsError(ValueError):
    """An exported runtime setting (threading layer, threads, wait policy) is not a valid value."""


def default_thread_count() -> int:
    """numba's own default: the CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


@dataclass(frozen=True)
class KernelRuntime:
    """How a process runs kernels. ``spin_count``: libgomp's ``GOMP_SPINCOUNT``, how long a waiting
    thread spins before it sleeps (``None``: libgomp's default for the wait policy; ``resolve`` gives
    ``DEFAULT_SPIN_COUNT`` unless the operator exported a count or the active policy);
    ``codegen``: numba's code-generation variables (sorted pairs);
    ``warmup_calls``: untimed calls an applied kernel makes when it is created (the run worker warms
    up per :class:`~measure_agent.engine.types.TimingConfig` before timing), so that the thread pool is
    started and the code paged in before the application's first real call.
    ``malloc``: glibc's ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` (sorted pairs),
    so that the scratch arrays a kernel allocates on each call reuse the pages of the last call."""

    threading_layer: str = DEFAULT_THREADING_LAYER
    num_threads: int = field(default_factory=default_thread_count)
    wait_policy: str = DEFAULT_WAIT_POLICY
    codegen: tuple[tuple[str, str], ...] = ()
    warmup_calls: int = 1
    spin_count: int | None = None
    malloc: tuple[tuple[str, str], ...] = ()

    def __post_init__(self) -> None:
        if self.threading_layer not in THREADING_LAYERS:
            raise RuntimeSettingsError(f"NUMBA_THREADING_LAYER must be one of {', '.join(THREADING_LAYERS)}, "
                                       f"not {self.threading_layer!r}")
        if not isinstance(self.num_threads, int) or self.num_threads < 1:
            raise RuntimeSettingsError(f"NUMBA_NUM_THREADS must be a whole number >= 1, not {self.num_threads!r}")
        if self.wait_policy not in WAIT_POLICIES:
            raise RuntimeSettingsError(f"OMP_WAIT_POLICY must be one of {', '.join(WAIT_POLICIES)}, "
                                       f"not {self.wait_policy!r}")
        if self.spin_count is not None and (isinstance(self.spin_count, bool) or not isinstance(self.spin_count, int)
                                            or not 0 <= self.spin_count <= MAX_SPIN_COUNT):
            raise RuntimeSettingsError(f"GOMP_SPINCOUNT must be a whole number from 0 to {MAX_SPIN_COUNT}, "
                                       f"not {self.spin_count!r}")
        if self.warmup_calls < 0:
            raise RuntimeSettingsError(f"warmup_calls must be >= 0, not {self.warmup_calls!r}")
        for name, value in self.malloc:
            if name not in MALLOC_VARIABLES or not value.isdigit() or int(value) > 2**62:
                raise RuntimeSettingsError(f"{name} must be a whole number of bytes, not {value!r}")

    @classmethod
    def resolve(cls, environ: Mapping[str, str] | None = None, host_features: str | None = None) -> "KernelRuntime":
        """The runtime for this host: the defaults, overridden by what ``environ`` (default
        ``os.environ``) exports, then the code-generation settings kernels need (never overridden)."""
        environ = os.environ if environ is None else environ
        threads_text = environ.get("NUMBA_NUM_THREADS", "").strip()
        try:
            threads = int(threads_text) if threads_text else default_thread_count()
        except ValueError:
            raise RuntimeSettingsError(f"NUMBA_NUM_THREADS must be a whole number >= 1, not {threads_text!r}") from None
        wait_policy = environ.get("OMP_WAIT_POLICY", "").strip().lower() or DEFAULT_WAIT_POLICY
        spin_text = environ.get("GOMP_SPINCOUNT", "").strip()
        try:
            # an exported active policy spins as libgomp does (a default count would bound it)
            spin_count = int(spin_text) if spin_text else (None if wait_policy == "active" else DEFAULT_SPIN_COUNT)
        except ValueError:
            raise RuntimeSettingsError(f"GOMP_SPINCOUNT must be a whole number from 0 to {MAX_SPIN_COUNT}, "
                                       f"not {spin_text!r}") from None
        codegen = {**build.codegen_environment(host_features), **_exported_codegen(environ), **NUMBA_ENVIRONMENT}
        malloc = {name: environ.get(name, "").strip() or str(default) for name, default in MALLOC_VARIABLES.items()}
        return cls(threading_layer=environ.get("NUMBA_THREADING_LAYER", "").strip().lower() or DEFAULT_THREADING_LAYER,
                   num_threads=threads,
                   wait_policy=wait_policy, codegen=tuple(sorted(codegen.items())), spin_count=spin_count,
                   malloc=tuple(sorted(malloc.items())))

    def environment(self) -> dict[str, str]:
        """The variables that carry these settings into a process started with them."""
        spin = {} if self.spin_count is None else {"GOMP_SPINCOUNT": str(self.spin_count)}
        return {"NUMBA_THREADING_LAYER": self.threading_layer,
                "NUMBA_NUM_THREADS": str(self.num_threads),
                "OMP_WAIT_POLICY": self.wait_policy,
                **spin,
                **dict(self.malloc),
                **dict(self.codegen)}

    def apply(self, environ: MutableMapping[str, str] | None = None) -> bool:
        """Put these settings in effect in this process (``environ``: default ``os.environ``).

        Returns True when all took effect: numba had not started its threads (threading layer,
        thread pool and OpenMP's wait policy are fixed then; :meth:`call_threads` still sets the
        thread count per call) and, for the code generation of kernels compiled here, numba was
        not imported yet. Never raises for a late call: the kernels are correct either way.
        """
        environ = os.environ if environ is None else environ
        if environ is os.environ:
            self.apply_malloc()  # glibc read the variables at start-up: set them in effect now
        numba_imported = "numba" in sys.modules
        launched = numba_imported and _threads_launched()
        for name, value in self.environment().items():
            if name == "NUMBA_NUM_THREADS" and numba_imported:
                continue  # numba sized its pool at import: changing it now makes numba raise
            if launched and name in ("NUMBA_THREADING_LAYER", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
                continue  # read when the threads started: too late, and a value that lies
            environ[name] = value
        if numba_imported and not launched and environ is os.environ:
            from numba.core import config

            config.reload_config()  # the threading layer is read from numba's config at launch
        return not numba_imported

    def apply_malloc(self) -> bool:
        """Put the malloc thresholds in effect in this process (glibc's ``mallopt``); False where
        the C library has no ``mallopt`` (not glibc) or refused a value."""
        try:
            mallopt = ctypes.CDLL(None).mallopt
        except (OSError, AttributeError):
            return False
        settings = dict(self.malloc)
        done = True
        for name, parameter in (("MALLOC_TRIM_THRESHOLD_", _M_TRIM_THRESHOLD),
                                ("MALLOC_MMAP_THRESHOLD_", _M_MMAP_THRESHOLD)):
            if name in settings:
                done = bool(mallopt(ctypes.c_int(parameter), ctypes.c_int(min(int(settings[name]), 2**31 - 1)))) and done
        return done

    def call_threads(self) -> int:
        """The thread count for a call: ``num_threads``, capped at the pool numba started."""
        from numba.core import config

        return min(self.num_threads, config.NUMBA_NUM_THREADS)


def _exported_codegen(environ: Mapping[str, str]) -> dict[str, str]:
    """Code-generation variables the operator exported (they key numba's disk cache too)."""
    return {name: environ[name] for name in ("NUMBA_CPU_FEATURES", "NUMBA_CPU_NAME") if environ.get(name)}


def _threads_launched() -> bool:
    parallel = sys.modules.get("numba.np.ufunc.parallel")
    return bool(parallel is not None and getattr(parallel, "_is_initialized", False))


@dataclass(frozen=True)
class RuntimeReport:
    """The settings read back from numba in a process that runs kernels: what
    :func:`runtime_in_effect` returns."""

    threading_layer: str | None
    num_threads: int
    pool_threads: int
    wait_policy: str | None
    codegen: dict[str, str]
    spin_count: str | None = None
    malloc: dict[str, str] = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


def runtime_in_effect() -> RuntimeReport:
    """What numba uses in this process: threading layer, threads per call and pool size, the
    OpenMP wait policy, spin count and malloc thresholds in the environment and the code-generation
    settings numba's config holds."""
    import numba
    from numba.core import config

    # Starts numba's threads if no parallel kernel has yet: an applied kernel sets its thread count
    # before its first call, which starts them too, so both sides time with the pool running.
    num_threads = int(numba.get_num_threads())
    try:
        layer: str | None = numba.threading_layer()
    except ValueError:  # no threading layer could start
        layer = None
    cpu_features = config.CPU_FEATURES or ""
    codegen = {"NUMBA_OPT": str(int(config.OPT)), "NUMBA_SLP_VECTORIZE": str(int(config.SLP_VECTORIZE))}
    if cpu_features:
        codegen["NUMBA_CPU_FEATURES"] = cpu_features
    if config.CPU_NAME:
        codegen["NUMBA_CPU_NAME"] = str(config.CPU_NAME)
    return RuntimeReport(threading_layer=layer, num_threads=num_threads,
                         pool_threads=int(config.NUMBA_NUM_THREADS), wait_policy=os.environ.get("OMP_WAIT_POLICY"),
                         codegen=codegen, spin_count=os.environ.get("GOMP_SPINCOUNT"),
                         malloc={name: os.environ[name] for name in MALLOC_VARIABLES if name in os.environ})


__all__ = ["KernelRuntime", "RuntimeReport", "RuntimeSettingsError", "THREADING_LAYERS", "WAIT_POLICIES",
           "default_thread_count", "runtime_in_effect"]

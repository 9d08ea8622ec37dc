"""Turning rendered kernel source into a callable, with numba's on-disk cache.

Each distinct source is written once to ``<cache_dir>/kernels/k_<digest>.py`` and imported from
there; numba's ``cache=True`` then stores the machine code beside it (in ``kernels/__pycache__``;
:mod:`measure_agent.engine.kernel_cache` holds the whole to a size cap). A build worker compiles and
caches; the run worker imports the same file and loads the machine code instead of compiling again.
CUDA kernels (``KernelSource.launch == "cuda"``) work the same way through numba.cuda's
``cache=True`` (:func:`compile_cuda_kernel`).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from measure_agent.device import arch_family
from measure_agent.engine.kernel_cache import mark_used
from measure_agent.templates.base import KernelSource

# numba reads these once, at import: they must be in the environment of any process that compiles
# kernels. SLP vectorisation turns unrolled register tiles into vector code (see docs/architecture.md).
NUMBA_ENVIRONMENT = {"NUMBA_SLP_VECTORIZE": "1", "NUMBA_OPT": "3"}


def codegen_environment(host_features: str | None = None, arch: str | None = None) -> dict[str, str]:
    """numba code-generation settings for this host, defaults an operator may override by exporting
    them; every process that compiles or loads kernels must use the same (numba's disk cache is
    keyed by them).

    On AVX-512 hosts LLVM's tuning for Intel server cores (skylake-avx512 up to emeraldrapids)
    prefers 256-bit vectors, so numba emitted AVX2-width code there: the default 1024^3 matmul ran at
    146 GFLOPS on a 2-core Emerald Rapids, 292 with 512-bit vectors (OpenBLAS: 300). Turning the
    preference off is a no-op on CPUs without it (AMD Zen 4/5). ``host_features``: LLVM's feature
    string (``+avx2,-avx512f,...``), read from the host when None; ``arch``: ``platform.machine()``
    when None. Only x86 hosts get settings: an aarch64 agent under qemu-user on an x86 host must
    never be told the host's features (LLVM may read them from the host's /proc/cpuinfo).
    """
    if arch_family(arch or platform.machine()) != "x86":
        return {}
    if host_features is None:
        host_features = _host_cpu_features()
    if "+avx512f" not in host_features.split(","):
        return {}
    return {"NUMBA_CPU_FEATURES": f"{host_features},-prefer-256-bit"}


@functools.lru_cache(maxsize=1)
def _host_cpu_features() -> str:
    try:
        import llvmlite.binding as llvm

        return llvm.get_host_cpu_features().flatten()
    except Exception:  # noqa: BLE001 - no LLVM host info (unusual platform): numba's own defaults
        return ""


def worker_environment() -> dict[str, str]:
    """The environment of a worker process: this one's, with the kernel runtime settings
    (:class:`~measure_agent.engine.runtime.KernelRuntime`, the same ``tuner.best_kernel`` applies)."""
    from measure_agent.engine.runtime import KernelRuntime

    return {**os.environ, **KernelRuntime.resolve().environment()}


def default_kernel_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tunefleet"


def source_digest(source: KernelSource) -> str:
    return hashlib.sha1(f"{source.entry}\n{source.text}".encode()).hexdigest()[:20]


_KNOWN_DIRECTORIES: set[Path] = set()  # created by this process: no mkdir per candidate


def kernel_path(source: KernelSource, cache_dir: Path) -> Path:
    """Write the source (once, atomically) and return its path."""
    directory = Path(cache_dir) / "kernels"
    if directory not in _KNOWN_DIRECTORIES:
        directory.mkdir(parents=True, exist_ok=True)
        _KNOWN_DIRECTORIES.add(directory)
    path = directory / f"k_{source_digest(source)}.py"
    if not path.exists():
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        except FileNotFoundError:  # the cache was cleared under a running agent
            directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
        with os.fdopen(fd, "w") as fh:
            fh.write(source.text)
        os.replace(tmp, path)
    return path


def load_kernel(source: KernelSource, cache_dir: Path) -> Callable:
    """Import the kernel module and return its entry point (a numba dispatcher or function).
    Every load counts as a use of its cache entry (the cache evicts least recently used first)."""
    path = kernel_path(source, cache_dir)
    mark_used(path)
    name = f"tunefleet_kernels.{path.stem}"
    module = sys.modules.get(name)
    if module is None:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules[name] = module
    return getattr(module, source.entry)


def numba_dispatcher(kernel: Callable, source: KernelSource):
    """The numba dispatcher that holds ``kernel``'s compiled loop nest: the kernel itself, or, for a
    serial kernel (a Python wrapper that sets the thread count around its outlined loop nest, see
    ``templates/cpu/_common.py``), the module's ``_<entry>``. Its ``inspect_asm`` and ``stats`` are
    what tests and benches read to see the code the agent ran."""
    if hasattr(kernel, "inspect_asm"):
        return kernel
    return kernel.__globals__["_" + source.entry]


def kernel_assembly(kernel: Callable, source: KernelSource) -> str:
    """The machine code of ``kernel``'s first compiled signature (compile it first); a parallel
    kernel's outlined gufuncs are part of it."""
    dispatcher = numba_dispatcher(kernel, source)
    return dispatcher.inspect_asm(dispatcher.signatures[0])


def compile_cuda_kernel(entry: Callable, args: tuple) -> float:
    """Compile the ``cuda.jit`` kernels a ``launch="cuda"`` entry launches, for the types of
    ``args`` (host arrays of the right dtype and rank stand in for device arrays); returns seconds.

    With ``cache=True`` numba.cuda stores the code beside the kernel file, so the run worker loads
    it instead of compiling. Under ``NUMBA_ENABLE_CUDASIM=1`` there is nothing to compile (the
    simulator interprets the Python) and this returns 0. Raises when no CUDA GPU is usable.
    """
    from numba import cuda, typeof

    if not cuda.is_available():
        raise RuntimeError("no usable CUDA GPU on this host (set NUMBA_ENABLE_CUDASIM=1 to simulate one)")
    start = time.perf_counter()
    signature = tuple(typeof(a) for a in args)
    for kernel in getattr(entry, "kernels", ()):
        compile_method = getattr(kernel, "compile", None)  # the simulator's kernels have none
        if compile_method is not None:
            compile_method(signature)
    return time.perf_counter() - start


def compile_kernel(kernel: Callable, args: tuple) -> float:
    """Compile ``kernel`` for the types of ``args`` (no call); returns seconds spent.

    Plain Python kernels (only the testing templates have them) need no compiling.
    """
    compile_method = getattr(kernel, "compile", None)
    if compile_method is None:
        return 0.0
    from numba import typeof

    start = time.perf_counter()
    compile_method(tuple(typeof(a) for a in args))
    return time.perf_counter() - start

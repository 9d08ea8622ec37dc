"""Tuned kernels in applications: ``tuner.best_kernel(workload)`` -> a compiled callable.

::

    import numpy as np
    import tuner

    matmul = tuner.best_kernel("matmul(M=512,N=512,K=512)")   # float32 by default
    C = matmul(A, B)                                           # A: 512x512, B: 512x512 float32
    matmul.kind, matmul.config                                 # "tuned", {...}

Where the config comes from, in order:

1. the best ok trial of exactly this workload on the device (``device_key``, default this host:
   its detected key and every key under which the log recorded a device of the same identity, such
   as a fleet's ``--rpc-key rpi4`` for this Raspberry Pi; a glob such as ``x86_64-*`` ranks the
   matching devices together) and target; the kernel's ``device_key`` says which key it came from;
2. else, for a shape inside a tuned shape range, the config of the range's nearest representative;
   else, with ``nearest`` (default), the best config of the nearest tuned shape of the same
   operator and dtype that is valid for this shape; either with a :class:`NotTunedWarning`;
3. else the template's default config, with a :class:`NotTunedWarning` saying why.

Steps 1 and 2 are :func:`tuner.log.resolve_best_config`, which ``tuner best`` and
``tuner show-kernel --best`` ask too, so all three give the same answer.

``db`` is a database URL, a SQLite file, a best-configs file (``tuner log export --best-only``:
what an application ships instead of a database), or an open ``TuningLog`` / ``BestConfigs``;
default ``$TUNEFLEET_DB``, else the per-user SQLite log (if it does not exist: step 3). A database
is opened read-only in spirit: never created or migrated (``TuningLog(create=False)``).

Compiling: the kernel source is written to the kernel cache (``cache_dir``, default
``$XDG_CACHE_HOME/tunefleet``, the tuner's own) and compiled by numba with ``cache=True``, so
another process loads the machine code from disk instead of compiling; within a process each
kernel is compiled once (memoised) however often ``best_kernel`` is called.

Running as measured: ``best_kernel`` applies the same
:class:`~measure_agent.engine.runtime.KernelRuntime` the engine's workers run with (threading layer,
thread count, OpenMP wait policy, numba's code-generation settings: SLP vectorisation, ``-O3``,
512-bit vectors on AVX-512 hosts), resolved the same way from the environment, then warms the
kernel up as the run worker does before timing. The settings read back from numba are on the
kernel as ``runtime_report``. numba reads the code-generation settings when imported and the
threading ones when it starts its threads (at the first parallel call): if the application imported
numba earlier, they may not take effect for kernels compiled in this process (kernels loaded from
the on-disk cache keep the code they were compiled with), and if it already ran a parallel numba
function, the threading layer and wait policy are the application's (the thread count is still set
per call). Results are correct either way, only speed may differ. ``numba_environment_applied`` on
the returned kernel says whether numba was imported after ``best_kernel`` applied them; import
``tuner`` and call ``best_kernel`` before numba to be sure, or export the variables in the
application's environment (docs/applying.md).
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

import numpy as np

from measure_agent.engine.build import default_kernel_cache_dir, source_digest
from measure_agent.engine.kernel_call import KernelCall
from measure_agent.engine.runtime import KernelRuntime, RuntimeReport, runtime_in_effect
from measure_agent.templates import KernelSource, default_catalog
from measure_agent.workload import Workload, parse_workload

if TYPE_CHECKING:
    from tuner.log import BestConfig, BestSource

KINDS = ("tuned", "approximate", "default")

_COMPILE_LOCK = threading.Lock()
_COMPILED: dict[tuple[str, str], Callable] = {}


class NotTunedWarning(UserWarning):
    """``best_kernel`` did not find a config tuned for exactly this workload and device."""


class TunedKernel(KernelCall):
    """A compiled kernel for one workload, and where its config came from.

    Call it with the operator's inputs (numpy arrays of the workload's dtype and shapes; other
    layouts are made C-contiguous) and it returns the output array: ``C = f(A, B)`` for matmul.
    ``out=`` may pass a preallocated C-contiguous output. The call is
    :class:`~measure_agent.engine.kernel_call.KernelCall`'s, the one the engine's run worker timed
    (its checks and thread count included), so a kernel applied runs as it was measured.

    Attributes: ``workload`` (:class:`Workload`), ``target``, ``config`` (JSON form), ``kind``
    (``"tuned"``, ``"approximate"`` or ``"default"``) and the booleans ``tuned``, ``approximate``,
    ``is_default``; ``tuned_workload`` and ``device_key`` (where the config was measured; ``None``
    for the default), ``mean_s`` (its measured time there), ``kernel_source``, ``kernel`` (the
    numba dispatcher) and ``numba_environment_applied``; ``runtime``, the
    :class:`~measure_agent.engine.runtime.KernelRuntime` it runs with (the engine's workers run with
    the same), and ``runtime_report``, those settings as read back from numba after its warm-up.
    """

    def __init__(self, workload: Workload, target: str, config: dict[str, Any], kind: str, kernel: Callable,
                 kernel_source: KernelSource, *, tuned_workload: str | None = None, device_key: str | None = None,
                 mean_s: float | None = None, numba_environment_applied: bool = True,
                 runtime: KernelRuntime | None = None) -> None:
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
        super().__init__(kernel, workload, kernel_source.runtime_args, runtime)
        self.target = target
        self.config = config
        self.kind = kind
        self.kernel_source = kernel_source
        self.tuned_workload = tuned_workload
        self.device_key = device_key
        self.mean_s = mean_s
        self.numba_environment_applied = numba_environment_applied
        self.runtime_report: RuntimeReport | None = None  # set by warm_up

    @property
    def tuned(self) -> bool:
        return self.kind == "tuned"

    @property
    def approximate(self) -> bool:
        return self.kind == "approximate"

    @property
    def is_default(self) -> bool:
        return self.kind == "default"

    def __repr__(self) -> str:
        where = {"tuned": f"tuned on {self.device_key}",
                 "approximate": f"approximate: tuned for {self.tuned_workload} on {self.device_key}",
                 "default": "default config"}[self.kind]
        return f"<TunedKernel {self.workload.key} ({where})>"

    def warm_up(self, calls: int | None = None) -> RuntimeReport:
        """Call the kernel ``calls`` times (default ``runtime.warmup_calls``) on zeros, as the run
        worker warms up before timing: numba starts its threads and the code is paged in before the
        application's first call. Returns (and keeps as ``runtime_report``) the settings read back."""
        calls = self.runtime.warmup_calls if calls is None else calls
        if calls > 0:
            arrays = [np.zeros(shape, dtype=self._dtype) for shape in self._input_shapes]
            out = np.empty(self._output_shape, dtype=self._dtype)
            for _ in range(calls):
                self(*arrays, out=out)
        self.runtime_report = runtime_in_effect()
        return self.runtime_report


def best_kernel(
    workload: Workload | str,
    device_key: str | None = None,
    db: Any = None,
    *,
    target: str = "cpu",
    nearest: bool = True,
    cache_dir: str | os.PathLike | None = None,
) -> TunedKernel:
    """A compiled kernel for ``workload`` with the best known config (see the module docstring).

    Raises ``ValueError`` (:class:`~measure_agent.workload.WorkloadError`) for a bad workload,
    :class:`~measure_agent.templates.TemplateNotFound` for an operator/target without a template
    and :class:`~tuner.log.TuningLogError` when ``db`` cannot be read (missing file, unreachable
    server, database not migrated).
    """
    if isinstance(workload, str):
        workload = parse_workload(workload)
    elif not isinstance(workload, Workload):
        raise TypeError('workload must be a Workload or its key (e.g. "matmul(M=512,N=512,K=512)"), '
                        f"not {type(workload).__name__}")
    if device_key is not None and not isinstance(device_key, str):
        raise TypeError(f"device_key must be a string, not {type(device_key).__name__}")
    runtime = KernelRuntime.resolve()  # the engine's workers resolve theirs the same way
    env_applied = runtime.apply()
    from measure_agent.device import detect_device

    template = default_catalog().get(workload.op, target)
    this_host = detect_device()
    # Asked for this host (no key): also what a fleet measured on a device of this host's identity
    # under its own --rpc-key; an explicit key means exactly that key.
    identity = this_host.default_key if device_key is None else None
    if device_key is None:
        device_key = this_host.default_key

    best = _best_config(workload, device_key, db, target, nearest, identity)
    if not best.found:
        config = template.default_config(workload, template.space(workload, this_host))
        warnings.warn(f"tuner.best_kernel: no tuned config for {workload.key} on {device_key} ({best.why}); "
                      "using the template's default config", NotTunedWarning, stacklevel=2)
        kind, tuned_workload, matched_device, mean_s = "default", None, None, None
    else:
        # checked by the resolver against the space of the device that measured it
        config = default_catalog().space(workload, target, best.tuned_on).from_json(best.config)
        kind = "approximate" if best.approximate else "tuned"  # a family's config is approximate too
        record = best.record
        tuned_workload, matched_device, mean_s = record.workload_key, record.device_key, record.mean_s
        if best.approximate:
            warnings.warn(f"tuner.best_kernel: {best.why}", NotTunedWarning, stacklevel=2)

    source = template.render(workload, config)
    directory = Path(cache_dir) if cache_dir is not None else default_kernel_cache_dir()
    kernel = _compiled(workload, source, directory)
    tuned_kernel = TunedKernel(workload, target, config.to_json(), kind, kernel, source,
                               tuned_workload=tuned_workload,
                               device_key=matched_device, mean_s=mean_s,
                               numba_environment_applied=env_applied, runtime=runtime)
    tuned_kernel.warm_up()
    return tuned_kernel


# -- internals ---------------------------------------------------------------------------------
def _best_config(workload: Workload, device_key: str, db: Any, target: str, nearest: bool,
                 device_identity: str | None) -> BestConfig:
    from tuner.log import BestConfig, resolve_best_config

    if db is None:
        missing = _missing_default_log()
        if missing is not None:  # nothing tuned yet: fall back without creating the log
            return BestConfig(workload, target, device_key, (device_key,), why=f"no tuning log at {missing}")
    with _open_source(db) as source:
        return resolve_best_config(source, workload, device_key, target, nearest=nearest, catalog=default_catalog(),
                                   device_identity=device_identity)


def _missing_default_log() -> Path | None:
    """The default SQLite log's path when it does not exist (``None``: it exists, or is a server)."""
    from tuner.settings import resolve_db_url

    path = _sqlite_file(resolve_db_url(None, create_directory=False))
    return path if path is not None and not path.exists() else None


@contextmanager
def _open_source(db: Any) -> Iterator[BestSource]:
    """The log or best-configs file ``db`` names (default: the configured log), open for the block."""
    from tuner.log import BestConfigs, TuningLog, TuningLogError
    from tuner.log.bestfile import load_best_file, looks_like_best_file
    from tuner.settings import resolve_db_url

    if isinstance(db, (TuningLog, BestConfigs)):
        yield db  # the caller's: left open
        return
    if db is None:
        url = resolve_db_url(None, create_directory=False)
    elif not isinstance(db, (str, os.PathLike)):
        raise TypeError(f"db must be a database URL, a file path, a TuningLog or BestConfigs, not {type(db).__name__}")
    elif "://" in os.fspath(db):
        url = os.fspath(db)
    else:
        path = Path(os.fspath(db)).expanduser()
        if not path.is_file():
            raise TuningLogError(f"no tuning log or best-configs file at {path}")
        if looks_like_best_file(path):
            yield load_best_file(path)
            return
        url = "sqlite:///" + str(path.absolute())
    with TuningLog(url, create=False) as log:
        yield log


def _sqlite_file(url: str) -> Path | None:
    from tuner.log.migrate import sqlite_path

    return sqlite_path(url)


def _compiled(workload: Workload, source: KernelSource, cache_dir: Path) -> Callable:
    from measure_agent.engine.build import compile_kernel, load_kernel

    key = (source_digest(source), str(cache_dir.absolute()))
    with _COMPILE_LOCK:
        kernel = _COMPILED.get(key)
        if kernel is None:
            kernel = load_kernel(source, cache_dir)
            # numba compiles for the arrays' types (dtype, rank), not their sizes: 1-element arrays will do
            spec, params = workload.spec, workload.params
            tiny_inputs = tuple(np.zeros((1,) * len(shape), dtype=workload.dtype) for shape in spec.input_shapes(params))
            tiny_out = np.zeros((1,) * len(spec.output_shape(params)), dtype=workload.dtype)
            compile_kernel(kernel, (*tiny_inputs, tiny_out, *source.runtime_args))
            _COMPILED[key] = kernel
    return kernel


__all__ = ["KINDS", "NotTunedWarning", "TunedKernel", "best_kernel"]

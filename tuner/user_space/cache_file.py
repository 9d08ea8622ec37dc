"""Kernel Tuner-format cache files for :func:`tuner.user_space.tune_function`: every evaluation is
appended as it happens, so an interrupted run resumes where it stopped.

The file is the format Kernel Tuner writes and reads (and :mod:`tuner.replay` reads): a JSON
object with ``device_name``, ``kernel_name``, ``tune_params_keys``, ``tune_params``, optional
``restrictions``, ``objective`` and ``cache``, where each entry is ``"v1,v2,...": {param: value,
..., "time": cost}`` and a failed config has the time ``"RuntimeFailedConfig"``. Kernel Tuner resumes
from a cache only when its ``device_name``, ``kernel_name`` and ``tune_params_keys`` match the run.
Like Kernel Tuner, entries are appended one line each and the closing braces are written at the
end, so a file cut short by a crash is still read (see :func:`read_cache_json`).
"""

from __future__ import annotations

import gzip
import json
import math
import os
import zlib
from pathlib import Path
from typing import Any, Mapping, Sequence

from measure_agent.bounded_json import JSONBoundsError, loads_bounded
from measure_agent.device import host_cpu_model

FAILED_TIME = "RuntimeFailedConfig"
DEFAULT_KERNEL_NAME = "objective"
# Real Kernel Tuner caches are up to tens of megabytes (12 MB for CLBlast's GEMM space); a longer
# text (a gzip file may unpack to anything) is refused before it is decoded.
MAX_CACHE_FILE_CHARS = 256 * 2**20
_MISSING = object()


class CacheFileError(ValueError):
    """A cache file that cannot be read or does not belong to this tuning space (one line)."""


def read_cache_json(path: str | os.PathLike) -> dict:
    """The JSON object of a cache file (``.json`` or gzip), also when its writer stopped before
    closing it: Kernel Tuner and :class:`CacheFile` append entries as ``"key": {...},`` lines and
    close the object only at the end. Raises :class:`CacheFileError` with a one-line message."""
    path = Path(path)
    try:
        with open(path, "rb") as fh:
            head = fh.read(2)
        opener = gzip.open if head == b"\x1f\x8b" else open
        with opener(path, "rt", encoding="utf-8") as fh:
            text = fh.read(MAX_CACHE_FILE_CHARS + 1)
    except OSError as exc:
        raise CacheFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, zlib.error) as exc:  # zlib: a corrupt gzip body
        raise CacheFileError(f"{path} is not a JSON cache file: {exc}") from None
    try:
        data = _loads(text)
    except JSONBoundsError as exc:
        raise CacheFileError(f"{path}: {exc}") from None
    except json.JSONDecodeError as exc:
        data = _unterminated(text)
        if data is None:
            raise CacheFileError(f"{path} is not a JSON cache file: {exc}") from None
    if not isinstance(data, dict):
        raise CacheFileError(f"{path}: expected a JSON object at the top level")
    return data


def _loads(text: str) -> Any:
    return loads_bounded(text, "the cache file", max_chars=MAX_CACHE_FILE_CHARS)


def _unterminated(text: str) -> dict | None:
    """A cache left open by its writer: drop a half-written last entry, close the braces."""
    body = text.rstrip()
    if '"cache"' not in body:
        return None
    for _ in range(2):  # as written, then without a last line cut in the middle
        candidate = body.rstrip().removesuffix(",")
        if candidate.endswith("{"):
            candidate += "}}"  # "cache": { with no entries yet
        else:
            candidate += "\n}\n}"
        try:
            data = _loads(candidate)
        except ValueError:  # not JSON (or, within 4 characters of the limit, too long) as cut here
            cut = body.rfind("\n")
            if cut <= 0:
                return None
            body = body[:cut]
            continue
        return data if isinstance(data, dict) else None
    return None


def _key(values: Sequence[Any]) -> str:
    return ",".join(str(v) for v in values)


def _plain_json(value: Any) -> bool:
    return value is None or isinstance(value, (bool, int, str)) or (isinstance(value, float) and math.isfinite(value))


class CacheFile:
    """Appends evaluations of one tuning space to a Kernel Tuner-format cache file.

    ``CacheFile.open(path, tune_params, restrictions, device_name=, kernel_name=)`` reads the
    evaluations already in the file (``previous``: ``{values tuple: cost or None}``) after checking
    that it was written for the same ``tune_params`` (and, where the file names them, the same
    device and kernel, as Kernel Tuner checks), then ``record`` appends one evaluation (flushed and
    synced to disk at once) and ``close`` writes the closing braces. A file that does not exist yet
    is created. ``device_name`` defaults to this host's CPU model; ``kernel_name`` to the one the
    file names, else ``default_kernel_name``.
    """

    def __init__(self, path: Path, keys: list[str], previous: dict[tuple, float | None], fh) -> None:
        self.path = path
        self.keys = keys
        self.previous = previous
        self._fh = fh

    @classmethod
    def open(cls, path: str | os.PathLike, tune_params: Mapping[str, Sequence[Any]],
             restrictions: Sequence[str] = (), *, device_name: str | None = None,
             kernel_name: str | None = None, default_kernel_name: str = DEFAULT_KERNEL_NAME) -> CacheFile:
        path = Path(path)
        device_name = host_cpu_model() if device_name is None else device_name
        for name, value in (("device_name", device_name), ("kernel_name", kernel_name)):
            if not (value is None or isinstance(value, str) and value.strip()):
                raise CacheFileError(f"{name} must be a non-empty string, not {value!r}")
        keys = list(tune_params)
        for name, values in tune_params.items():
            odd = next((v for v in values if not _plain_json(v)), None)
            if odd is not None:
                raise CacheFileError(f"a cache file holds numbers, strings, booleans and None; tune_params[{name!r}] "
                                     f"has {odd!r} ({type(odd).__name__})")
        previous: dict[tuple, float | None] = {}
        data: dict = {}
        if path.exists() and not (path.is_file() and path.stat().st_size == 0):  # an empty file is a new cache
            data = read_cache_json(path)
            if kernel_name is None and isinstance(data.get("kernel_name"), str):
                kernel_name = data["kernel_name"]  # a rerun that does not name the kernel goes on with it
            _check_names(path, data, device_name=device_name, kernel_name=kernel_name)
            previous = _entries(path, data, {k: list(v) for k, v in tune_params.items()})
        kernel_name = kernel_name or default_kernel_name
        # Kernel Tuner's header, in its order (it ignores the restrictions); what else the file's
        # header holds (Kernel Tuner's problem_size, its objective) is kept.
        header = {"device_name": device_name, "kernel_name": kernel_name}
        header.update((k, v) for k, v in data.items() if k not in header and k not in (
            "cache", "tune_params_keys", "tune_params", "restrictions", "objective"))
        header |= {"tune_params_keys": keys, "tune_params": {k: list(v) for k, v in tune_params.items()}}
        if restrictions:
            header["restrictions"] = list(restrictions)
        header["objective"] = data.get("objective", "time")
        lines = [json.dumps(header)[:-1] + ', "cache": {']
        # Entries as the file has them: Kernel Tuner's carry more than the time (times, compile_time, ...).
        lines += [json.dumps({key: entry})[1:-1] + "," for key, entry in data.get("cache", {}).items()]
        # Rewrite the file whole (atomically), then append: a closed file is reopened, a broken
        # last line of a crashed run is dropped.
        tmp = path.with_name(path.name + ".tmp")
        try:
            with open(tmp, "w", encoding="utf-8") as fh:
                fh.write("\n".join(lines) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, path)
            fh = open(path, "a", encoding="utf-8")
        except OSError as exc:
            raise CacheFileError(f"cannot write cache file {path}: {exc.strerror or exc}") from None
        return cls(path, keys, previous, fh)

    def record(self, params: Mapping[str, Any], cost: float | None) -> None:
        values = tuple(params[k] for k in self.keys)
        self._fh.write(_line(self.keys, values, cost) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        """Close the JSON object (the file then is a plain JSON cache file). A cache without
        entries stays open, as Kernel Tuner leaves one: its reader cannot reopen ``{}}``."""
        if self._fh.closed:
            return
        self._fh.close()
        text = self.path.read_text(encoding="utf-8").rstrip().removesuffix(",")
        if text.endswith("{"):
            return
        text += "\n}\n}"
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(text + "\n", encoding="utf-8")
        os.replace(tmp, self.path)

    def __enter__(self) -> CacheFile:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _line(keys: list[str], values: tuple, cost: float | None) -> str:
    entry = dict(zip(keys, values))
    entry["time"] = FAILED_TIME if cost is None else cost
    return json.dumps({_key(values): entry})[1:-1] + ","


def _check_names(path: Path, data: dict, **names: str | None) -> None:
    """A cache of another device or kernel is refused, as Kernel Tuner refuses it (a file that
    names neither, as written before they were recorded, is taken)."""
    for field, value in names.items():
        recorded = data.get(field)
        if recorded is not None and value is not None and recorded != value:
            raise CacheFileError(f"{path} holds results of {field} {str(recorded)[:200]!r}, not {value!r}; "
                                 f"pass {field}={str(recorded)[:200]!r} or use another cache file")


def _entries(path: Path, data: dict, tune_params: dict[str, list]) -> dict[tuple, float | None]:
    """The evaluations in a cache file written for ``tune_params``: {values tuple: cost or None}."""
    if data.get("tune_params") != tune_params:
        other = json.dumps(data.get("tune_params"))[:200]
        raise CacheFileError(f"{path} holds results of other tune_params ({other}); "
                             "use another cache file for this space")
    cache = data.get("cache", {})
    if not isinstance(cache, dict):
        raise CacheFileError(f"{path}: 'cache' must be an object")
    keys = list(tune_params)
    out: dict[tuple, float | None] = {}
    for key, entry in cache.items():
        if not isinstance(entry, dict) or any(k not in entry for k in keys):
            raise CacheFileError(f"{path}: cache entry {key!r} lacks some of {', '.join(keys)}")
        values = []
        for k in keys:
            allowed = next((a for a in tune_params[k] if _same(entry[k], a)), _MISSING)
            if allowed is _MISSING:
                raise CacheFileError(f"{path}: cache entry {key!r} has {k}={entry[k]!r}, outside tune_params")
            values.append(allowed)  # the space's own value (1 and 1.0 compare equal in JSON)
        t = entry.get("time")
        try:
            cost = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else math.nan
        except OverflowError:
            cost = math.nan
        if isinstance(t, str) and t.endswith("Config"):
            out[tuple(values)] = None
        elif math.isfinite(cost) and cost > 0:
            out[tuple(values)] = cost
        else:
            raise CacheFileError(f"{path}: cache entry {key!r} has no usable time ({t!r})")
    return out


def _same(a: Any, b: Any) -> bool:
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def prior_from_cache(path: str | os.PathLike, weight: float = 0.5, group: str | None = None) -> list:
    """Every evaluation in a cache file (another device, input size or kernel version) as transfer
    records for ``tune_function(prior=...)``: :class:`~tuner.search.PriorObservation` with the
    entry's params, its time (None: failed) and ``weight`` (0..1] against the run's own results.
    Costs are compared only within one file (``group``, default: the file's path)."""
    from tuner.search import PriorObservation  # the tuner side only; keeps this module light

    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight <= 1:
        raise ValueError(f"weight must be a number in (0, 1], not {weight!r}")
    path = Path(path)
    data = read_cache_json(path)
    tune_params = data.get("tune_params")
    cache = data.get("cache")
    if not isinstance(tune_params, dict) or not isinstance(cache, dict):
        raise CacheFileError(f"{path}: a cache file needs 'tune_params' and 'cache' objects")
    keys = list(tune_params)
    out = []
    for key, entry in cache.items():
        if not isinstance(entry, dict) or any(k not in entry for k in keys):
            raise CacheFileError(f"{path}: cache entry {key!r} lacks some of {', '.join(keys)}")
        t = entry.get("time")
        try:
            cost = float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else None
        except OverflowError:
            cost = None
        if cost is None and not (isinstance(t, str) and t.endswith("Config")):
            raise CacheFileError(f"{path}: cache entry {key!r} has no usable time ({t!r})")
        if cost is not None and not (math.isfinite(cost) and cost > 0):
            raise CacheFileError(f"{path}: cache entry {key!r} has no usable time ({t!r})")
        out.append(PriorObservation({k: entry[k] for k in keys}, cost, group=group or str(path), weight=float(weight)))
    return out

"""Best-configs files: the best configs per workload, device and target, without a database.

``tuner log export --best-only`` writes one; an application ships it and passes its path to
``tuner.best_kernel(..., db=PATH)``; ``tuner log import`` reads it too (its entries are real
measured trials). The format, version 1, is one JSON object (UTF-8, sorted keys, 2-space indent)::

    {
      "format": "tunefleet-best",
      "version": 1,
      "top": 1,
      "devices": {"<device key>": {<DeviceInfo.to_json()>}, ...},
      "entries": [
        {"workload": "matmul(M=512,N=512,K=512,dtype=float32)", "device_key": "...",
         "target": "cpu", "rank": 1, "config": {...}, "status": "ok", "mean_s": 0.0012,
         "costs": [...], "compile_time_s": 1.9, "message": "", "agent": "...",
         "template_version": "1", "timestamp": "2024-05-01T12:00:00.000001Z"},
        ...
      ]
    }

``top`` is how many entries per (workload, device_key, target) were kept; ``rank`` is 1 for the
fastest. An entry has exactly the fields of a trial's JSON line (:data:`tuner.log.records.LINE_FIELDS`)
but ``format``, ``version`` and ``device_info`` (the info is in ``devices``), plus ``rank``; its
``status`` is always ``ok``. Entries are sorted by workload, device key, target and rank, so the
same log exports to the same bytes. Readers refuse other formats and versions; unknown extra fields
are ignored, so adding a field does not need a new version, changing or removing one does.
"""

from __future__ import annotations

import json
from fnmatch import fnmatchcase
from pathlib import Path
from typing import IO, Any, Iterable, Mapping, Sequence

from measure_agent.bounded_json import MAX_JSON_CHARS, JSONBoundsError, loads_bounded
from tuner.log.records import LOG_FORMAT, LOG_VERSION, RecordError, TrialRecord, canonical_workload_key
from tuner.log.storage import NotFoundError, TuningLog, TuningLogError, is_device_pattern

BEST_FORMAT = "tunefleet-best"
BEST_VERSION = 1
# Entries are about a kilobyte each: tens of thousands of workloads and devices fit in this.
MAX_BEST_FILE_CHARS = MAX_JSON_CHARS
_NOT_ENTRY_FIELDS = ("format", "version", "device_info")


class BestFileError(TuningLogError):
    """A best-configs file that cannot be read (one-line message naming the problem)."""


class BestConfigs:
    """Best configs held in memory, queried like a :class:`TuningLog`: a
    :class:`~tuner.log.best_config.BestSource` (``best``, ``tuned_workload_keys``, ``families``,
    ``recorded_device_info``, ``recorded_devices``, ``resolve_device_keys``, ``name``), plus ``device_keys`` and
    ``device_info``. ``name`` is the file it was read from."""

    def __init__(self, records: Iterable[TrialRecord], devices: Mapping[str, Mapping[str, Any]] | None = None,
                 *, name: str = "best configs") -> None:
        self.records: tuple[TrialRecord, ...] = tuple(records)
        for record in self.records:
            if not record.is_ok:
                raise ValueError(f"best configs hold ok trials only, not {record.status}")
        self.devices = {key: dict(info) for key, info in (devices or {}).items()}
        self.name = name

    def __repr__(self) -> str:
        return f"BestConfigs({self.name!r}, {len(self.records)} entries)"

    def __len__(self) -> int:
        return len(self.records)

    def best(self, workload_key: str, device_key: str | Sequence[str], target: str = "cpu",
             top: int | None = 1) -> list[TrialRecord]:
        if top is not None and (type(top) is not int or top < 1):
            raise ValueError(f"top must be a positive integer, not {top!r}")
        workload_key = canonical_workload_key(workload_key)
        keys = {device_key} if isinstance(device_key, str) else set(device_key)
        found = [(r.mean_s, r.created_at, i, r) for i, r in enumerate(self.records)
                 if r.workload_key == workload_key and r.device_key in keys and r.target == target]
        ranked = [r for *_, r in sorted(found, key=lambda item: item[:3])]
        return ranked if top is None else ranked[:top]

    def tuned_workload_keys(self, op: str, dtype: str, device_key: str | Sequence[str],
                            target: str = "cpu") -> list[str]:
        from measure_agent.workload import parse_workload

        keys = {device_key} if isinstance(device_key, str) else set(device_key)
        found = set()
        for record in self.records:
            if record.device_key in keys and record.target == target:
                workload = parse_workload(record.workload_key)
                if workload.op == op and workload.dtype == dtype:
                    found.add(record.workload_key)
        return sorted(found)

    def device_keys(self, pattern: str | None = None) -> list[str]:
        keys = sorted(set(self.devices) | {r.device_key for r in self.records})
        return keys if pattern is None else [k for k in keys if fnmatchcase(k, pattern)]

    def resolve_device_keys(self, key_or_pattern: str) -> list[str]:
        if is_device_pattern(key_or_pattern):
            return self.device_keys(key_or_pattern)
        return [key_or_pattern]

    def recorded_devices(self) -> dict[str, dict[str, Any]]:
        return {key: dict(self.devices.get(key, {})) for key in self.device_keys()}

    def families(self, op: str, dtype: str) -> list[tuple[str, list[str]]]:
        """Always ``[]``: a best-configs file records no shape-range families."""
        return []

    def device_info(self, device_key: str) -> dict[str, Any]:
        info = self.recorded_device_info(device_key)
        if info is None:
            raise NotFoundError(f"no device {device_key!r} in {self.name}")
        return info

    def recorded_device_info(self, device_key: str) -> dict[str, Any] | None:
        if device_key not in self.device_keys():
            return None
        return dict(self.devices.get(device_key, {}))

    # -- the file form ---------------------------------------------------------------------------
    def to_document(self, top: int) -> dict[str, Any]:
        entries = []
        group, rank = None, 0
        ordered = sorted(self.records, key=lambda r: (r.workload_key, r.device_key, r.target, r.mean_s, r.created_at))
        for record in ordered:
            key = (record.workload_key, record.device_key, record.target)
            rank = rank + 1 if key == group else 1
            group = key
            entry = record.to_json()
            for name in _NOT_ENTRY_FIELDS:
                del entry[name]
            entry["rank"] = rank
            entries.append(entry)
        used = sorted({r.device_key for r in self.records})
        return {
            "format": BEST_FORMAT,
            "version": BEST_VERSION,
            "top": top,
            "devices": {key: self.devices.get(key, {}) for key in used},
            "entries": entries,
        }


def best_configs_from_log(log: TuningLog, top: int = 1, workload_key: str | None = None,
                          device_key: str | Sequence[str] | None = None,
                          target: str | None = None) -> BestConfigs:
    """The ``top`` best ok trials of every workload/device/target of ``log`` (optionally filtered)."""
    records = log.best_per_group(top, workload_key=workload_key, device_key=device_key, target=target)
    devices = {key: log.device_info(key) for key in sorted({r.device_key for r in records})}
    return BestConfigs(records, devices, name=log.url)


def dumps_best(configs: BestConfigs, top: int) -> str:
    """The text of a best-configs file (records must be in rank order within each group)."""
    return json.dumps(configs.to_document(top), sort_keys=True, indent=2, ensure_ascii=False,
                      allow_nan=False) + "\n"


def export_best(log: TuningLog, fh: IO[str], top: int = 1, workload_key: str | None = None,
                device_key: str | Sequence[str] | None = None, target: str | None = None) -> int:
    """Write a best-configs file of ``log`` to ``fh``; returns the number of entries."""
    configs = best_configs_from_log(log, top, workload_key, device_key, target)
    fh.write(dumps_best(configs, top))
    return len(configs)


def parse_best_document(obj: Any, name: str = "best configs") -> BestConfigs:
    """Validate a decoded best-configs document; raises :class:`BestFileError` naming the problem."""
    at = f"{name}: " if name else ""
    if not isinstance(obj, dict):
        raise BestFileError(f"{at}not a best-configs file (expected a JSON object)")
    if obj.get("format") == LOG_FORMAT:
        raise BestFileError(f"{at}is a JSON-lines tuning log, not a best-configs file "
                            "(make one with 'tuner log export --best-only')")
    if obj.get("format") != BEST_FORMAT:
        raise BestFileError(f"{at}format is {obj.get('format')!r}, expected {BEST_FORMAT!r}")
    version = obj.get("version")
    if type(version) is not int or version != BEST_VERSION:
        raise BestFileError(f"{at}unsupported version {version!r}; this tunefleet reads version {BEST_VERSION}")
    devices = obj.get("devices", {})
    if not isinstance(devices, dict) or not all(isinstance(v, dict) for v in devices.values()):
        raise BestFileError(f"{at}'devices' must map device keys to objects")
    entries = obj.get("entries")
    if not isinstance(entries, list):
        raise BestFileError(f"{at}'entries' must be a list")
    records = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict):
            raise BestFileError(f"{at}entries[{index}]: must be an object")
        line = {k: v for k, v in entry.items() if k != "rank"}
        device_key = entry.get("device_key")
        line.update(format=LOG_FORMAT, version=LOG_VERSION,
                    device_info=devices.get(device_key, {}) if isinstance(device_key, str) else {})
        try:
            record = TrialRecord.from_json(line)
        except RecordError as exc:
            raise BestFileError(f"{at}entries[{index}]: {exc}") from None
        if not record.is_ok:
            raise BestFileError(f"{at}entries[{index}]: status is {record.status!r}; best configs are ok trials")
        records.append(record)
    return BestConfigs(records, devices, name=name or "best configs")


def load_best_file(path: str | Path) -> BestConfigs:
    """Read a best-configs file; raises :class:`BestFileError` (one line) if it cannot."""
    try:
        with open(path, encoding="utf-8") as fh:
            text = fh.read(MAX_BEST_FILE_CHARS + 1)  # a longer file is refused unread
    except OSError as exc:
        raise BestFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise BestFileError(f"{path}: not UTF-8 text ({exc.reason})") from None
    return loads_best(text, str(path))


def loads_best(text: str, name: str = "best configs") -> BestConfigs:
    at = f"{name}: " if name else ""
    try:
        obj = loads_bounded(text, "the file", max_chars=MAX_BEST_FILE_CHARS)
    except json.JSONDecodeError as exc:
        raise BestFileError(f"{at}line {exc.lineno}: not valid JSON ({exc.msg} at column {exc.colno})") from None
    except JSONBoundsError as exc:
        raise BestFileError(f"{at}{exc}") from None
    return parse_best_document(obj, name)


def looks_like_best_file(path: str | Path) -> bool:
    """Whether ``path`` is a file that starts (after blanks) with ``{`` or ``[``: JSON (a best-configs file or a
    JSON-lines log, or a mistake load_best_file reports), never a SQLite database (``SQLite format 3``)."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64).lstrip()
    except OSError:
        return False
    return head.startswith((b"{", b"["))


__all__ = [
    "BEST_FORMAT",
    "BEST_VERSION",
    "BestConfigs",
    "BestFileError",
    "MAX_BEST_FILE_CHARS",
    "best_configs_from_log",
    "dumps_best",
    "export_best",
    "load_best_file",
    "loads_best",
    "looks_like_best_file",
    "parse_best_document",
]

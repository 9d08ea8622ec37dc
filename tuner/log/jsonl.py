"""Export and import of the tuning log as JSON lines; merging logs from several sites.

One trial per line: a JSON object with sorted keys, in compact form, carrying the info of its
device (see :data:`tuner.log.records.LINE_FIELDS`). Export order is deterministic (workload key,
device key, target, timestamp, config digest) and every value survives a round trip exactly, so
export -> import into an empty log -> export reproduces the file byte for byte.

Import reads JSON-lines logs and best-configs files (:mod:`tuner.log.bestfile`) alike, from one
or several sources (sites), all in one transaction: every line of every source is validated first,
and the first bad one names its source and line; then all trials are written, or none.

Device info: within one source, all lines of a device must carry the same info (else the line is
bad). Between sources, and between a source and the log, infos of a device may differ (a site
upgraded numba, say); such a conflict is reported (:class:`DeviceConflict`), and resolved by the
policy: ``keep`` (default: the log's info if it has one, else the first source's; the log is the
source of truth), ``replace`` (the last source's info overwrites the log's) or ``error`` (import
nothing). An empty info (``{}``) never conflicts. Trials are never affected by the policy.
"""

from __future__ import annotations

import itertools
import json
from dataclasses import dataclass
from typing import IO, Any, Iterable, Iterator, Sequence

from measure_agent.bounded_json import JSONBoundsError, loads_bounded
from tuner.log.bestfile import BEST_FORMAT, MAX_BEST_FILE_CHARS, BestFileError, parse_best_document
from tuner.log.records import RecordError, TrialRecord
from tuner.log.storage import DeviceKeys, NotFoundError, TuningLog, TuningLogError

DEVICE_INFO_POLICIES = ("keep", "replace", "error")
# A trial's line is a few kilobytes (its message is cut at 4000 characters): a longer one is refused
# before it is decoded. No line is read longer than MAX_BEST_FILE_CHARS (a best-configs file may
# be one line), so a file of one endless line does not fill the memory.
MAX_LOG_LINE_CHARS = 2**20


class LogFormatError(TuningLogError):
    """A line of a log file that cannot be imported; nothing of the file was imported.

    ``line`` is the 1-based line number (``None`` for a problem of a best-configs file's structure)
    and ``source`` the name of the file when several were imported together.
    """

    def __init__(self, line: int | None, problem: str, source: str | None = None) -> None:
        super().__init__(problem if line is None else f"line {line}: {problem}")
        self.line = line
        self.problem = problem
        self.source = source


class DeviceInfoConflict(TuningLogError):
    """Device info that differs between sources, refused by the ``error`` policy."""


@dataclass(frozen=True)
class DeviceConflict:
    """Two infos of one device: ``kept`` won, ``other`` lost (each names where it came from)."""

    device_key: str
    kept: str  # "the log" or "SOURCE line N"
    other: str
    fields: tuple[str, ...]  # top-level fields whose values differ

    def describe(self) -> str:
        return (f"device {self.device_key}: info from {self.other} differs from {self.kept} "
                f"in {', '.join(self.fields)}; kept {self.kept}'s")


@dataclass(frozen=True)
class ImportSummary:
    """What an import did: lines ``read`` = ``inserted`` + ``duplicates`` (already in the log)."""

    read: int
    inserted: int
    duplicates: int
    sources: int = 1
    conflicts: tuple[DeviceConflict, ...] = ()


@dataclass
class _Parsed:
    name: str
    records: list[TrialRecord]
    infos: dict[str, tuple[dict[str, Any], int | None]]  # device key -> (info, first line)


def dump_line(record: TrialRecord, device_info: dict[str, Any]) -> str:
    """The JSON line of a trial, newline included."""
    return json.dumps(record.to_json(device_info), sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"


def export_trials(
    log: TuningLog,
    fh: IO[str],
    workload_key: str | None = None,
    device_key: DeviceKeys | None = None,
    target: str | None = None,
) -> int:
    """Write the matching trials to the text stream ``fh``, one per line; returns how many."""
    records = sorted(
        log.trials(workload_key=workload_key, device_key=device_key, target=target),
        key=lambda r: (r.workload_key, r.device_key, r.target, r.created_at, r.config_digest),
    )
    infos: dict[str, dict[str, Any]] = {}
    for record in records:
        if record.device_key not in infos:
            infos[record.device_key] = log.device_info(record.device_key)
        fh.write(dump_line(record, infos[record.device_key]))
    return len(records)


def import_trials(log: TuningLog, fh: Iterable[str]) -> ImportSummary:
    """Import the lines of ``fh``: all of them, in one transaction, or none.

    Every line is validated before anything is written; the first bad one raises
    :class:`LogFormatError` naming its line number. Blank lines are skipped. Trials already in the
    log are skipped and counted as duplicates. Devices new to the log get the ``device_info`` of
    their lines, which must agree for all lines of one device; known devices keep their info.
    ``fh`` may also hold a best-configs file.
    """
    return import_sources(log, [("", fh)])


def import_sources(
    log: TuningLog,
    sources: Sequence[tuple[str, Iterable[str]]],
    device_info: str = "keep",
) -> ImportSummary:
    """Import several ``(name, lines)`` sources in one transaction (see the module docstring)."""
    if device_info not in DEVICE_INFO_POLICIES:
        raise ValueError(f"device info policy must be one of {', '.join(DEVICE_INFO_POLICIES)}, not {device_info!r}")
    parsed = [_parse_source(name, lines) for name, lines in sources]
    chosen, conflicts = _merge_device_infos(log, parsed, device_info)
    records = [record for p in parsed for record in p.records]
    inserted = log.record_trials(records, device_info=chosen, replace_device_info=device_info == "replace")
    return ImportSummary(read=len(records), inserted=inserted, duplicates=len(records) - inserted,
                         sources=len(parsed), conflicts=tuple(conflicts))


# -- parsing ---------------------------------------------------------------------------------------
def _parse_source(name: str, lines: Iterable[str]) -> _Parsed:
    numbered = _numbered_lines(lines, name)
    head: list[tuple[int, str]] = []
    for number, line in numbered:
        head.append((number, line))
        if line.strip():
            break
    if head and head[-1][1].strip() and _starts_best_file(head[-1][1]):
        return _parse_best(name, _best_file_text(name, itertools.chain(head, numbered)))
    return _parse_lines(name, itertools.chain(head, numbered))


def _starts_best_file(first: str) -> bool:
    if first.strip() == "{":  # a pretty-printed JSON object; a JSON line is never just "{"
        return True
    try:
        obj = loads_bounded(first)
    except ValueError:  # not JSON, or beyond the bounds: _parse_lines says which, with the line
        return False
    return isinstance(obj, dict) and obj.get("format") == BEST_FORMAT


def _best_file_text(name: str, numbered: Iterable[tuple[int, str]]) -> str:
    parts, total = [], 0
    for number, line in numbered:
        total += len(line)
        if total > MAX_BEST_FILE_CHARS:
            raise LogFormatError(number, f"best-configs file longer than {MAX_BEST_FILE_CHARS} characters", name)
        parts.append(line)
    return "".join(parts)


def _parse_best(name: str, text: str) -> _Parsed:
    try:
        obj = loads_bounded(text, max_chars=MAX_BEST_FILE_CHARS)
    except json.JSONDecodeError as exc:
        raise LogFormatError(exc.lineno, f"not valid JSON ({exc.msg} at column {exc.colno})", name) from None
    except JSONBoundsError as exc:
        raise LogFormatError(None, f"best-configs file: {exc}", name) from None
    try:
        configs = parse_best_document(obj, name="")
    except BestFileError as exc:
        raise LogFormatError(None, f"best-configs file: {exc}", name) from None
    infos = {key: (info, None) for key, info in configs.devices.items()}
    for record in configs.records:
        infos.setdefault(record.device_key, ({}, None))
    return _Parsed(name, list(configs.records), infos)


def _parse_lines(name: str, numbered: Iterable[tuple[int, str]]) -> _Parsed:
    records: list[TrialRecord] = []
    infos: dict[str, tuple[dict[str, Any], int | None]] = {}
    for number, line in numbered:
        if not line.strip():
            continue
        try:
            obj = loads_bounded(line, max_chars=MAX_LOG_LINE_CHARS)
        except json.JSONDecodeError as exc:
            raise LogFormatError(number, f"not valid JSON ({exc.msg} at column {exc.colno})", name) from None
        except JSONBoundsError as exc:
            raise LogFormatError(number, str(exc), name) from None
        try:
            record = TrialRecord.from_json(obj)
        except RecordError as exc:
            raise LogFormatError(number, str(exc), name) from None
        info = obj["device_info"]
        if record.device_key not in infos:
            infos[record.device_key] = (info, number)
        elif infos[record.device_key][0] != info:
            raise LogFormatError(
                number,
                f"device_info of {record.device_key} differs from line {infos[record.device_key][1]}",
                name,
            )
        records.append(record)
    return _Parsed(name, records, infos)


def _numbered_lines(fh: Iterable[str], name: str) -> Iterator[tuple[int, str]]:
    """The lines of ``fh`` with their numbers; one longer than MAX_BEST_FILE_CHARS is refused
    before it is read whole."""
    number = 0
    readline = getattr(fh, "readline", None)
    lines = iter(lambda: readline(MAX_BEST_FILE_CHARS + 1), "") if readline is not None else iter(fh)
    while True:
        try:
            line = next(lines)
        except StopIteration:
            return
        except UnicodeDecodeError as exc:
            raise LogFormatError(number + 1, f"not UTF-8 text ({exc.reason})", name) from None
        number += 1
        if len(line) > MAX_BEST_FILE_CHARS:
            raise LogFormatError(number, f"longer than {MAX_BEST_FILE_CHARS} characters", name)
        yield number, line


# -- device info -------------------------------------------------------------------------------------
def _merge_device_infos(log: TuningLog, parsed: list[_Parsed], policy: str):
    """The info to record per device, and the conflicts met (see the module docstring)."""
    chosen: dict[str, dict[str, Any]] = {}
    where: dict[str, str] = {}
    conflicts: list[DeviceConflict] = []
    keys = sorted({key for p in parsed for key in p.infos})
    for key in keys:
        try:
            in_log = log.device_info(key)
        except NotFoundError:
            in_log = {}
        if in_log:
            chosen[key], where[key] = in_log, "the log"
    for p in parsed:
        for key, (info, line) in p.infos.items():
            origin = _origin(p.name, line)
            if not info:
                chosen.setdefault(key, {})
                continue
            if not chosen.get(key):
                chosen[key], where[key] = info, origin
                continue
            if chosen[key] == info:
                continue
            fields = _differing_fields(chosen[key], info)
            if policy == "error":
                raise DeviceInfoConflict(
                    f"device {key}: info from {origin} differs from {where[key]} in {', '.join(fields)}; "
                    "nothing imported (choose --device-info keep or replace)"
                )
            if policy == "replace":
                conflicts.append(DeviceConflict(key, kept=origin, other=where[key], fields=fields))
                chosen[key], where[key] = info, origin
            else:
                conflicts.append(DeviceConflict(key, kept=where[key], other=origin, fields=fields))
    return chosen, conflicts


def _origin(name: str, line: int | None) -> str:
    label = name or "the input"
    return label if line is None else f"{label} line {line}"


def _differing_fields(a: dict[str, Any], b: dict[str, Any]) -> tuple[str, ...]:
    return tuple(sorted(k for k in set(a) | set(b) if a.get(k, object()) != b.get(k, object())))


__all__ = [
    "DEVICE_INFO_POLICIES",
    "DeviceConflict",
    "DeviceInfoConflict",
    "ImportSummary",
    "LogFormatError",
    "MAX_LOG_LINE_CHARS",
    "dump_line",
    "export_trials",
    "import_sources",
    "import_trials",
]

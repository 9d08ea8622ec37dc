"""Export and import of the tuning log as JSON lines.

One trial per line: a JSON object with sorted keys, in compact form, carrying the info of its
device (see :data:`tuner.log.records.LINE_FIELDS`). Export order is deterministic (workload key,
device key, target, timestamp, config digest) and every value survives a round trip exactly, so
export -> import into an empty log -> export reproduces the file byte for byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import IO, Any, Iterable

from tuner.log.records import RecordError, TrialRecord
from tuner.log.storage import TuningLog, TuningLogError


class LogFormatError(TuningLogError):
    """A line of a log file that cannot be imported; nothing of the file was imported."""

    def __init__(self, line: int, problem: str) -> None:
        super().__init__(f"line {line}: {problem}")
        self.line = line
        self.problem = problem


@dataclass(frozen=True)
class ImportSummary:
    """What an import did: lines ``read`` = ``inserted`` + ``duplicates`` (already in the log)."""

    read: int
    inserted: int
    duplicates: int


def dump_line(record: TrialRecord, device_info: dict[str, Any]) -> str:
    """The JSON line of a trial, newline included."""
    return json.dumps(record.to_json(device_info), sort_keys=True, separators=(",", ":"), allow_nan=False) + "\n"


def export_trials(
    log: TuningLog,
    fh: IO[str],
    workload_key: str | None = None,
    device_key: str | None = None,
) -> int:
    """Write the matching trials to the text stream ``fh``, one per line; returns how many."""
    records = sorted(
        log.trials(workload_key=workload_key, device_key=device_key),
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
    """
    records: list[TrialRecord] = []
    infos: dict[str, dict[str, Any]] = {}
    first_line: dict[str, int] = {}
    for number, line in _numbered_lines(fh):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as exc:
            raise LogFormatError(number, f"not valid JSON ({exc.msg} at column {exc.colno})") from None
        try:
            record = TrialRecord.from_json(obj)
        except RecordError as exc:
            raise LogFormatError(number, str(exc)) from None
        info = obj["device_info"]
        if record.device_key not in infos:
            infos[record.device_key] = info
            first_line[record.device_key] = number
        elif infos[record.device_key] != info:
            raise LogFormatError(
                number,
                f"device_info of {record.device_key} differs from line {first_line[record.device_key]}",
            )
        records.append(record)
    inserted = log.record_trials(records, device_info=infos)
    return ImportSummary(read=len(records), inserted=inserted, duplicates=len(records) - inserted)


def _numbered_lines(fh: Iterable[str]):
    number = 0
    lines = iter(fh)
    while True:
        try:
            line = next(lines)
        except StopIteration:
            return
        except UnicodeDecodeError as exc:
            raise LogFormatError(number + 1, f"not UTF-8 text ({exc.reason})") from None
        number += 1
        yield number, line


__all__ = ["ImportSummary", "LogFormatError", "dump_line", "export_trials", "import_trials"]

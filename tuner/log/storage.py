"""The tuning log: the source of truth for measured results, in SQLite or PostgreSQL.

Contract of :class:`TuningLog`:

* A config is measured at most once per workload, device and target. Recording it again is a
  no-op that reports ``False``; this holds with many writers at once (processes or threads, each
  with its own ``TuningLog``), because the database's unique constraint decides, not a prior read.
* Workload keys are canonicalised (``parse_workload(key).key``) on the way in, for writes and for
  queries alike, so two spellings of one problem are one workload. An unparseable key raises
  :class:`~measure_agent.workload.WorkloadError` (a ``ValueError``).
* Every write method is one transaction: it happens entirely or not at all.
* Whatever goes wrong in the database (bad URL, server unreachable, corrupt or foreign file,
  schema not at this tunefleet's revision) raises :class:`TuningLogError` with a one-line message;
  SQLAlchemy and driver exceptions do not escape.
* Timestamps are aware UTC datetimes with microseconds, in and out.
* SQLite and PostgreSQL behave the same: device-key patterns are matched in Python
  (:func:`fnmatch.fnmatchcase`), orders are on numbers and times with the row id as last tie-break.

The schema is managed by Alembic migrations (:mod:`tuner.log.migrate`): opening a log checks that
the database is at the head revision, and migrates an *empty* database there when ``create`` is
true; anything else not at head is refused with a message saying to run ``tuner db upgrade``.

SQLite files run in WAL mode with a 30 s busy timeout and foreign keys enforced; write transactions
start with ``BEGIN IMMEDIATE`` so that concurrent writers queue on the busy timeout instead of
failing when a read lock cannot be upgraded.
"""

from __future__ import annotations

import json
import threading
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timezone
from fnmatch import fnmatchcase
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from sqlalchemy import Connection, Engine, and_, case, delete, func, or_, select, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.exc import IntegrityError

from measure_agent.workload import parse_workload
from tuner.log import schema
from tuner.log.database import (
    IMMEDIATE as _IMMEDIATE,
    SQLITE_BUSY_TIMEOUT_S,
    TuningLogError,
    create_log_engine,
    guard,
    one_line,
    redact as _redact,
)
from tuner.log.records import (
    TRIAL_STATUSES,
    JobRecord,
    TrialRecord,
    canonical_json,
    canonical_workload_key,
    utcnow,
)

GLOB_CHARS = frozenset("*?[")
DeviceKeys = str | Sequence[str]


def is_device_pattern(text: str) -> bool:
    """Whether a device key given by a user is a glob pattern (has ``*``, ``?`` or ``[``)."""
    return any(c in GLOB_CHARS for c in text)


@dataclass(frozen=True)
class PruneSummary:
    """What :meth:`TuningLog.prune` did (or, with ``dry_run``, would do)."""

    groups: int  # workload/device/target groups that lost trials
    deleted_ok: int
    deleted_failed: int
    kept: int  # trials left in the pruned scope

    @property
    def deleted(self) -> int:
        return self.deleted_ok + self.deleted_failed


@dataclass(frozen=True)
class JobTrialStats:
    """A job's trials in the log: how many, how many failed, the fastest ok mean time."""

    trials: int
    failed: int
    best_mean_s: float | None


@dataclass(frozen=True)
class AgentTrialStats:
    """What one agent (by name) measured: trials, failures, when it last recorded one."""

    trials: int
    failed: int
    last_at: datetime | None


def _aware(moment: datetime | None) -> datetime | None:
    """Aggregates skip the column's type processing on SQLite: give a naive result its UTC zone."""
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=timezone.utc)


class NotFoundError(TuningLogError, LookupError):
    """A job or device that the log does not hold."""


class TuningLog:
    """A tuning log in the database at ``url`` (any SQLAlchemy URL; SQLite and PostgreSQL tested).

    Opening checks the schema revision (see :mod:`tuner.log.migrate`): with ``create`` (the
    default) an empty database is migrated to head, otherwise it is refused like any database not
    at head. Applications that only read (``tuner.best_kernel``) open with ``create=False``.
    Usable as a context manager, which closes the log on exit; a closed log refuses all calls.
    """

    def __init__(self, url: str, *, create: bool = True) -> None:
        from tuner.log.migrate import EMPTY, MISSING, SchemaState, sqlite_path, ensure_current, head_revision

        self._display_url = _redact(url)
        self._closed = False
        # Row ids of workloads, devices and jobs seen in committed transactions: such rows are never
        # deleted or re-keyed, so recording a trial need not look them up again.
        self._committed_ids = _CommittedIds()
        self._insert_ignore_statements: dict[tuple[str, tuple[str, ...], bool], Any] = {}
        self._write_fence: Callable[[Connection], None] | None = None
        path = sqlite_path(url) if not create else None
        if path is not None and not path.exists():  # do not leave an empty file behind
            raise TuningLogError(SchemaState(self._display_url, MISSING, None, head_revision()).refusal())
        if path is not None and path.is_file() and path.stat().st_size == 0:  # connecting would write a header
            raise TuningLogError(SchemaState(self._display_url, EMPTY, None, head_revision()).refusal())
        engine = create_log_engine(url)
        self._engine: Engine = engine
        self._dialect = engine.dialect.name
        # SQLite has one writer at a time, and a writer that finds the database locked sleeps in
        # growing steps (up to 100 ms) before it tries again: under a daemon's job drivers one of
        # them missed every free moment for 1.7 s while the other wrote. This log's own writers take
        # turns on a lock instead, which hands over at once; other processes still meet SQLite's.
        self._write_turns: threading.RLock | None = threading.RLock() if self._dialect == "sqlite" else None
        try:
            ensure_current(engine, self._display_url, create)
        except BaseException:
            engine.dispose()
            raise

    # -- lifecycle ---------------------------------------------------------------------------
    def close(self) -> None:
        """Release all connections. Idempotent."""
        if not self._closed:
            self._closed = True
            self._engine.dispose()

    def __enter__(self) -> "TuningLog":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TuningLog({self._display_url!r})"

    @property
    def url(self) -> str:
        """The database URL with any password masked."""
        return self._display_url

    @property
    def name(self) -> str:
        """What messages call the log (:class:`~tuner.log.best_config.BestSource`): its masked URL."""
        return self._display_url

    # -- devices and jobs -----------------------------------------------------------------
    def upsert_device(self, key: str, info: Mapping[str, Any]) -> None:
        """Create device ``key`` or replace its info; either way ``last_seen`` becomes now."""
        _require_key("device key", key)
        info_text = _json_object("device info", info)
        now = utcnow()
        with self._write("record a device") as conn:
            table = schema.devices
            values = {"key": key, "info": info_text, "first_seen": now, "last_seen": now}
            stmt = self._dialect_insert(table)
            if stmt is not None:
                conn.execute(
                    stmt.values(**values).on_conflict_do_update(
                        index_elements=[table.c.key], set_={"info": info_text, "last_seen": now}
                    )
                )
            elif not _insert_ignore_savepoint(conn, table, values):
                conn.execute(update(table).where(table.c.key == key).values(info=info_text, last_seen=now))

    def device_info(self, device_key: str) -> dict[str, Any]:
        """The info recorded for a device (``{}`` if it only ever appeared in trials); raises
        :class:`NotFoundError` for a device the log does not hold."""
        info = self.recorded_device_info(device_key)
        if info is None:
            raise NotFoundError(f"no device {device_key!r} in the tuning log")
        return info

    def recorded_device_info(self, device_key: str) -> dict[str, Any] | None:
        """:meth:`device_info`, or ``None`` for a device the log does not hold (see
        :class:`~tuner.log.best_config.BestSource`)."""
        with self._read("read a device") as conn:
            info = conn.execute(select(schema.devices.c.info).where(schema.devices.c.key == device_key)).scalar()
        return None if info is None else self._decode(info, f"device record ({device_key!r})")

    def create_job(
        self,
        workload_key: str,
        device_key: str,
        target: str,
        strategy: str,
        trials: int,
        options: Mapping[str, Any] | None = None,
    ) -> int:
        """Record a new ``running`` job and return its id. ``trials`` is the budget (>= 1)."""
        workload_key = canonical_workload_key(workload_key)
        _require_key("device key", device_key)
        _require_key("target", target)
        _require_key("strategy", strategy)
        if type(trials) is not int or trials < 1:
            raise ValueError(f"trial budget must be a positive integer, not {trials!r}")
        options_text = _json_object("job options", options or {})
        with self._write("create a job") as conn:
            ids = _IdCache(self, conn)
            result = conn.execute(
                schema.jobs.insert().values(
                    workload_id=ids.workload(workload_key),
                    device_id=ids.device(device_key),
                    target=target,
                    strategy=strategy,
                    trials=trials,
                    options=options_text,
                    status="running",
                    created_at=utcnow(),
                )
            )
            return int(result.inserted_primary_key[0])

    def finish_job(self, job_id: int, status: str) -> bool:
        """Move a running job to ``done``, ``failed`` or ``cancelled`` and stamp ``finished_at``.

        Returns ``False``, changing nothing, when the job had already finished: the first final
        status wins, so a cancel racing a completion is not an error. Raises
        :class:`NotFoundError` for an unknown job and ``ValueError`` for another status.
        """
        if status not in schema.FINAL_JOB_STATUSES:
            raise ValueError(f"final job status must be one of {', '.join(schema.FINAL_JOB_STATUSES)}, not {status!r}")
        jobs = schema.jobs
        with self._write("finish a job") as conn:
            result = conn.execute(
                update(jobs)
                .where(jobs.c.id == job_id, jobs.c.status == "running")
                .values(status=status, finished_at=utcnow())
            )
            if result.rowcount:
                return True
            if conn.execute(select(jobs.c.id).where(jobs.c.id == job_id)).first() is None:
                raise NotFoundError(f"no job {job_id} in the tuning log")
            return False

    def get_job(self, job_id: int) -> JobRecord:
        """The job with this id; raises :class:`NotFoundError` if there is none."""
        jobs = self._select_jobs(schema.jobs.c.id == job_id)
        if not jobs:
            raise NotFoundError(f"no job {job_id} in the tuning log")
        return jobs[0]

    def jobs(self, status: str | None = None) -> list[JobRecord]:
        """Jobs in id order, optionally only those with ``status`` (``running`` finds unfinished ones)."""
        return self._select_jobs(schema.jobs.c.status == status if status is not None else None)

    def _select_jobs(self, where) -> list[JobRecord]:
        j, w, d = schema.jobs, schema.workloads, schema.devices
        stmt = (
            select(j, w.c.key.label("workload_key"), d.c.key.label("device_key"))
            .join(w, j.c.workload_id == w.c.id)
            .join(d, j.c.device_id == d.c.id)
            .order_by(j.c.id)
        )
        if where is not None:
            stmt = stmt.where(where)
        with self._read("read jobs") as conn:
            rows = conn.execute(stmt).mappings().all()
        return [
            JobRecord(
                id=row["id"],
                workload_key=row["workload_key"],
                device_key=row["device_key"],
                target=row["target"],
                strategy=row["strategy"],
                trials=row["trials"],
                options=self._decode(row["options"], f"job (id {row['id']})"),
                status=row["status"],
                created_at=row["created_at"],
                finished_at=row["finished_at"],
            )
            for row in rows
        ]

    # -- shape-range families ------------------------------------------------------------
    def record_family(self, family_key: str, op: str, dtype: str, member_keys: Sequence[str]) -> None:
        """Record a shape-range family and its representative workloads (idempotent)."""
        _require_key("family key", family_key)
        with self._write("record a workload family") as conn:
            ids = _IdCache(self, conn)
            table = schema.families
            self._insert_ignore(conn, table, {"key": family_key, "op": op, "dtype": dtype, "created_at": utcnow()},
                                [table.c.key])
            family_id = conn.execute(select(table.c.id).where(table.c.key == family_key)).scalar_one()
            members = schema.family_members
            for key in member_keys:
                self._insert_ignore(conn, members, {"family_id": family_id, "workload_id": ids.workload(key)},
                                    [members.c.family_id, members.c.workload_id])

    def families(self, op: str, dtype: str) -> list[tuple[str, list[str]]]:
        """(family key, member workload keys) of every family of ``op`` and ``dtype``."""
        f, m, w = schema.families, schema.family_members, schema.workloads
        stmt = (select(f.c.key, w.c.key).join(m, m.c.family_id == f.c.id).join(w, m.c.workload_id == w.c.id)
                .where(f.c.op == op, f.c.dtype == dtype).order_by(f.c.key, w.c.key))
        with self._read("read workload families") as conn:
            rows = conn.execute(stmt).all()
        grouped: dict[str, list[str]] = {}
        for family_key, workload_key in rows:
            grouped.setdefault(family_key, []).append(workload_key)
        return list(grouped.items())

    # -- trials --------------------------------------------------------------------------
    def record_trial(self, record: TrialRecord) -> bool:
        """Store one trial; ``True`` if inserted, ``False`` if its config was already measured.

        Creates the workload and device rows as needed. A ``job_id`` must name a job of the same
        workload, device and target, else :class:`TuningLogError`.
        """
        return self.record_trials([record]) == 1

    def record_trials(
        self,
        records: Iterable[TrialRecord],
        *,
        device_info: Mapping[str, Mapping[str, Any]] | None = None,
        replace_device_info: bool = False,
    ) -> int:
        """Store trials in one transaction and return how many were new (duplicates are skipped).

        ``device_info`` maps device keys to info for devices the log does not know yet, or knows
        without info; the info of a known device is kept (the log is the source of truth) unless
        ``replace_device_info``, which overwrites it.
        """
        records = list(records)
        for record in records:
            if not isinstance(record, TrialRecord):
                raise TypeError(f"expected TrialRecord, got {type(record).__name__}")
        infos = {key: _json_object("device info", info) for key, info in (device_info or {}).items()}
        for key in infos:
            _require_key("device key", key)
        with self._write("record trials") as conn:
            ids = _IdCache(self, conn)
            for key, info_text in infos.items():
                ids.device(key, info_text, replace=replace_device_info)
            inserted = self._insert_trials(conn, ids, records)
        self._committed_ids.merge(ids)  # only now: a rolled-back transaction's new ids never existed
        return inserted

    def measured_digests(self, workload_key: str, device_key: str, target: str) -> set[str]:
        """Digests of every config recorded for this workload, device and target, whatever its status."""
        t, w, d = schema.trials, schema.workloads, schema.devices
        stmt = (
            select(t.c.config_digest)
            .join(w, t.c.workload_id == w.c.id)
            .join(d, t.c.device_id == d.c.id)
            .where(w.c.key == canonical_workload_key(workload_key), d.c.key == device_key, t.c.target == target)
        )
        with self._read("read trials") as conn:
            return set(conn.execute(stmt).scalars())

    def trials(
        self,
        workload_key: str | None = None,
        device_key: DeviceKeys | None = None,
        target: str | None = None,
        status: str | None = None,
        *,
        job_id: int | None = None,
        limit: int | None = None,
        created_before: datetime | None = None,
        config_digest: str | None = None,
    ) -> list[TrialRecord]:
        """Trials matching every given filter, ordered by ``created_at`` then insertion order.

        ``device_key`` is one key or a sequence of keys (any of them). With ``limit``, only the
        ``limit`` most recent matching trials are returned (still oldest first). With
        ``created_before`` (aware), only trials recorded before that moment. With ``config_digest``
        (``Config.digest``), only the trials of that config (one per workload, device and target).
        """
        if status is not None and status not in TRIAL_STATUSES:
            raise ValueError(f"status {status!r} is not one of {', '.join(TRIAL_STATUSES)}")
        if limit is not None and (type(limit) is not int or limit < 1):
            raise ValueError(f"limit must be a positive integer, not {limit!r}")
        t = schema.trials
        stmt = self._trial_select(workload_key, device_key, target)
        if status is not None:
            stmt = stmt.where(t.c.status == status)
        if job_id is not None:
            stmt = stmt.where(t.c.job_id == job_id)
        if created_before is not None:
            stmt = stmt.where(t.c.created_at < created_before)
        if config_digest is not None:
            stmt = stmt.where(t.c.config_digest == config_digest)
        if limit is None:
            return self._fetch_trials(stmt.order_by(t.c.created_at, t.c.id))
        newest = self._fetch_trials(stmt.order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit))
        return newest[::-1]

    def count_trials(
        self,
        workload_key: str | None = None,
        device_key: DeviceKeys | None = None,
        target: str | None = None,
        status: str | None = None,
    ) -> int:
        """How many trials :meth:`trials` would return for these filters without a limit."""
        t = schema.trials
        inner = self._trial_select(workload_key, device_key, target)
        if status is not None:
            inner = inner.where(t.c.status == status)
        with self._read("count trials") as conn:
            return conn.execute(select(func.count()).select_from(inner.subquery())).scalar_one()

    def best(self, workload_key: str, device_key: DeviceKeys, target: str = "cpu", top: int | None = 1) -> list[TrialRecord]:
        """Up to ``top`` ok trials, fastest (lowest ``mean_s``) first; ties go to the earlier trial.

        ``device_key`` is one key or a sequence of keys: with several, trials of all of them are
        ranked together (each record names its device). ``top=None`` returns every ok trial.
        """
        if top is not None and (type(top) is not int or top < 1):
            raise ValueError(f"top must be a positive integer, not {top!r}")
        t = schema.trials
        stmt = (
            self._trial_select(workload_key, device_key, target)
            .where(t.c.status == "ok", t.c.mean_s.is_not(None))
            .order_by(t.c.mean_s, t.c.created_at, t.c.id)
        )
        if top is not None:
            stmt = stmt.limit(top)
        return self._fetch_trials(stmt)

    def best_per_group(
        self,
        top: int = 1,
        workload_key: str | None = None,
        device_key: DeviceKeys | None = None,
        target: str | None = None,
    ) -> list[TrialRecord]:
        """The ``top`` fastest ok trials of every workload/device/target group (optionally only the
        given workload, device(s), target), ordered by workload key, device key, target, then rank
        (the order of :meth:`best`)."""
        if type(top) is not int or top < 1:
            raise ValueError(f"top must be a positive integer, not {top!r}")
        t = schema.trials
        rank = func.row_number().over(
            partition_by=(t.c.workload_id, t.c.device_id, t.c.target),
            order_by=(t.c.mean_s, t.c.created_at, t.c.id),
        )
        ranked = (
            self._trial_select(workload_key, device_key, target)
            .add_columns(rank.label("rank"))
            .where(t.c.status == "ok", t.c.mean_s.is_not(None))
            .subquery()
        )
        stmt = select(ranked).where(ranked.c.rank <= top).order_by(ranked.c.rank)
        records = self._fetch_trials(stmt)
        # Python's sort is stable: within a group the rank order of the query survives.
        return sorted(records, key=lambda r: (r.workload_key, r.device_key, r.target))

    def tuned_workload_keys(
        self, op: str, dtype: str, device_key: DeviceKeys, target: str = "cpu"
    ) -> list[str]:
        """Keys of the workloads of operator ``op`` and ``dtype`` with at least one ok trial on
        the device(s) and target, sorted."""
        t, w, d = schema.trials, schema.workloads, schema.devices
        stmt = (
            select(w.c.key)
            .distinct()
            .join(t, t.c.workload_id == w.c.id)
            .join(d, t.c.device_id == d.c.id)
            .where(w.c.op == op, w.c.dtype == dtype, t.c.target == target, t.c.status == "ok")
            .where(_key_filter(d.c.key, device_key))
        )
        with self._read("read workloads") as conn:
            return sorted(conn.execute(stmt).scalars())

    def prune(
        self,
        keep_best: int,
        workload_key: str | None = None,
        device_key: DeviceKeys | None = None,
        target: str | None = None,
        *,
        drop_failed: bool = False,
        dry_run: bool = False,
    ) -> PruneSummary:
        """Delete all but the ``keep_best`` fastest ok trials of every workload/device/target.

        Failed trials (any status but ``ok``) are kept unless ``drop_failed``: they are what stops
        a tuner from measuring a crashing or hanging config again. The kept ok trials are exactly
        ``best(..., top=keep_best)``. One transaction. A pruned config is no longer "measured":
        ``tune`` may measure it again (``--trials`` counts configs the log holds). Jobs are kept.
        """
        if type(keep_best) is not int or keep_best < 0:
            raise ValueError(f"keep_best must be a non-negative integer, not {keep_best!r}")
        t, w, d = schema.trials, schema.workloads, schema.devices
        scope = []
        if workload_key is not None:
            scope.append(t.c.workload_id.in_(
                select(w.c.id).where(w.c.key == canonical_workload_key(workload_key))))
        if device_key is not None:
            scope.append(t.c.device_id.in_(select(d.c.id).where(_key_filter(d.c.key, device_key))))
        if target is not None:
            scope.append(t.c.target == target)
        rank = func.row_number().over(
            partition_by=(t.c.workload_id, t.c.device_id, t.c.target),
            order_by=(t.c.mean_s, t.c.created_at, t.c.id),
        )
        ranked = select(t.c.id, rank.label("rank")).where(*scope, t.c.status == "ok").subquery()
        doomed = t.c.id.in_(select(ranked.c.id).where(ranked.c.rank > keep_best))
        if drop_failed:
            doomed = or_(doomed, and_(t.c.status != "ok", *scope))
        is_ok = case((t.c.status == "ok", 1), else_=0)
        per_group = (
            select(func.sum(is_ok), func.count())
            .where(doomed)
            .group_by(t.c.workload_id, t.c.device_id, t.c.target)
        )
        with self._write("prune trials") as conn:
            groups = conn.execute(per_group).all()
            deleted_ok = sum(int(ok) for ok, _ in groups)
            deleted_failed = sum(int(n) for _, n in groups) - deleted_ok
            total = conn.execute(select(func.count()).select_from(t).where(*scope)).scalar_one()
            if groups and not dry_run:
                conn.execute(delete(t).where(doomed))
        return PruneSummary(groups=len(groups), deleted_ok=deleted_ok, deleted_failed=deleted_failed,
                            kept=total - deleted_ok - deleted_failed)

    # -- aggregates for the dashboard -----------------------------------------------------------
    def job_trial_stats(self) -> dict[int, JobTrialStats]:
        """Trials, failures and best mean time of every job that has trials, in one query."""
        t = schema.trials
        failed = func.sum(case((t.c.status != "ok", 1), else_=0))
        stmt = (select(t.c.job_id, func.count(), failed, func.min(case((t.c.status == "ok", t.c.mean_s))))
                .where(t.c.job_id.is_not(None)).group_by(t.c.job_id))
        with self._read("read job statistics") as conn:
            rows = conn.execute(stmt).all()
        return {int(job): JobTrialStats(int(n), int(bad or 0), best) for job, n, bad, best in rows}

    def agent_trial_stats(self) -> dict[str, AgentTrialStats]:
        """Trials, failures and the last record time per agent name (trials without an agent are left out)."""
        t = schema.trials
        failed = func.sum(case((t.c.status != "ok", 1), else_=0))
        stmt = (select(t.c.agent, func.count(), failed, func.max(t.c.created_at))
                .where(t.c.agent != "").group_by(t.c.agent))
        with self._read("read agent statistics") as conn:
            rows = conn.execute(stmt).all()
        return {agent: AgentTrialStats(int(n), int(bad or 0), _aware(last)) for agent, n, bad, last in rows}

    def recent_failures(self, limit: int = 20) -> list[TrialRecord]:
        """The ``limit`` most recent trials of any status but ``ok``, newest first."""
        if type(limit) is not int or limit < 1:
            raise ValueError(f"limit must be a positive integer, not {limit!r}")
        t = schema.trials
        stmt = (self._trial_select(None, None, None).where(t.c.status != "ok")
                .order_by(t.c.created_at.desc(), t.c.id.desc()).limit(limit))
        return self._fetch_trials(stmt)

    def count_trials_since(self, since: datetime) -> int:
        """How many trials were recorded at or after ``since`` (an aware datetime)."""
        t = schema.trials
        with self._read("count trials") as conn:
            return conn.execute(select(func.count()).select_from(t).where(t.c.created_at >= since)).scalar_one()

    def workload_keys(self) -> list[str]:
        """Keys of all workloads in the log, sorted."""
        with self._read("read workloads") as conn:
            return sorted(conn.execute(select(schema.workloads.c.key)).scalars())

    def device_keys(self, pattern: str | None = None) -> list[str]:
        """Keys of all devices in the log, sorted; with ``pattern``, those it matches as a glob
        (``x86_64-*``; case-sensitive, the same on every backend)."""
        with self._read("read devices") as conn:
            keys = sorted(conn.execute(select(schema.devices.c.key)).scalars())
        return keys if pattern is None else [k for k in keys if fnmatchcase(k, pattern)]

    def recorded_devices(self) -> dict[str, dict[str, Any]]:
        """Every device key with its recorded info (``{}`` where none was recorded), in key order."""
        with self._read("read devices") as conn:
            rows = conn.execute(select(schema.devices.c.key, schema.devices.c.info).order_by(schema.devices.c.key))
            return {key: self._decode(info, f"device record ({key!r})") for key, info in rows}

    def resolve_device_keys(self, key_or_pattern: str) -> list[str]:
        """A device key as a user gave it: a glob pattern becomes the matching keys, a plain key
        stays itself (known to the log or not)."""
        if is_device_pattern(key_or_pattern):
            return self.device_keys(key_or_pattern)
        return [key_or_pattern]

    # -- internals -----------------------------------------------------------------------
    def _guard(self, action: str):
        return guard(action, self._display_url)

    @contextmanager
    def _read(self, action: str) -> Iterator[Connection]:
        self._check_open()
        with self._guard(action), self._engine.connect() as conn:
            yield conn

    def fence_writes(self, fence: Callable[[Connection], None] | None) -> None:
        """Run ``fence`` first in every write transaction of this log; what it raises aborts the
        transaction, so nothing of it is written. A leading daemon fences its writes with its epoch
        (:class:`tuner.log.leadership.LeaderLease`); ``None`` removes the fence."""
        self._write_fence = fence

    @contextmanager
    def _write(self, action: str) -> Iterator[Connection]:
        self._check_open()
        with self._write_turns or nullcontext(), self._guard(action), self._engine.connect() as conn:
            conn.info[_IMMEDIATE] = True
            with conn.begin():
                if self._write_fence is not None:
                    self._write_fence(conn)
                yield conn

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (for the leadership lease, which shares the log's database)."""
        return self._engine

    def _decode(self, text: Any, what: str, kind: type = dict) -> Any:
        """A JSON column, or a one-line error naming the row: a corrupt row must not surface as a
        JSONDecodeError traceback in every command that reads it."""
        try:
            value = json.loads(text)
        except (TypeError, ValueError) as exc:
            raise TuningLogError(f"the tuning log {self._display_url} holds a corrupt {what}: {one_line(exc)}") from None
        if not isinstance(value, kind):
            raise TuningLogError(f"the tuning log {self._display_url} holds a corrupt {what}: "
                                 f"expected a JSON {'object' if kind is dict else 'list'}")
        return value

    def _check_open(self) -> None:
        if self._closed:
            raise TuningLogError(f"the tuning log {self._display_url} is closed")

    def _dialect_insert(self, table):
        """An insert with ``ON CONFLICT`` support, or ``None`` for dialects without it."""
        if self._dialect == "sqlite":
            return sqlite_insert(table)
        if self._dialect == "postgresql":
            return pg_insert(table)
        return None

    def _insert_ignore_statement(self, table, conflict: list, *, returning: bool = True):
        """``INSERT ... ON CONFLICT (conflict) DO NOTHING`` (returning the new row's id where the
        database can and ``returning``), or None for dialects without it."""
        returning = returning and self._engine.dialect.insert_returning
        key = (table.name, tuple(c.name for c in conflict), returning)
        stmt = self._insert_ignore_statements.get(key)
        if stmt is None:
            stmt = self._dialect_insert(table)
            if stmt is None:
                return None
            # Built once and given the values as parameters: building a statement around literal
            # values cost more CPU than the insert itself (about 1 ms per trial).
            stmt = stmt.on_conflict_do_nothing(index_elements=conflict)
            if returning:
                stmt = stmt.returning(table.c.id)
            self._insert_ignore_statements[key] = stmt
        return stmt

    def _insert_ignore(self, conn: Connection, table, values: dict[str, Any], conflict: list) -> bool:
        """Insert unless a row with the same ``conflict`` columns exists; ``True`` if inserted."""
        stmt = self._insert_ignore_statement(table, conflict)
        if stmt is None:
            return _insert_ignore_savepoint(conn, table, values)
        if self._engine.dialect.insert_returning:
            # With RETURNING, drivers report no rowcount (psycopg gives -1): count returned rows.
            return conn.execute(stmt, values).first() is not None
        return conn.execute(stmt, values).rowcount == 1

    def _insert_trials(self, conn: Connection, ids: "_IdCache", records: list[TrialRecord]) -> int:
        """Insert ``records`` unless recorded already (by their unique key); how many were new.
        One statement for the lot (SQLite: one prepared statement run for each row, PostgreSQL: a
        multi-row insert returning what it inserted): a daemon records each arrival group of
        results so, and a statement per trial cost more CPU than the rest of a result's way
        through the daemon."""
        if not records:
            return 0
        t = schema.trials
        if len(records) > 1 and self._engine.dialect.name == "sqlite":
            # sqlite3 sums an executemany's rowcount over the rows it inserted, skipped conflicts
            # not counted: exact without RETURNING (so on any SQLite), whose multi-row rewrite cost
            # SQLAlchemy half again as much CPU (16 trials: 0.69 -> 0.45 ms a transaction).
            # psycopg reports -1 for an executemany's rowcount.
            values = [self._trial_values(ids, record) for record in records]
            return conn.execute(self._insert_ignore_statement(t, _trial_key(t), returning=False), values).rowcount
        stmt = self._insert_ignore_statement(t, _trial_key(t))
        if len(records) == 1 or stmt is None or not self._engine.dialect.insert_returning:
            return sum(self._insert_trial(conn, ids, record) for record in records)
        values = [self._trial_values(ids, record) for record in records]
        # ON CONFLICT DO NOTHING returns only the rows it inserted, also when two of the rows
        # collide with each other: the count is exact.
        return len(conn.execute(stmt, values).all())

    def _insert_trial(self, conn: Connection, ids: "_IdCache", record: TrialRecord) -> bool:
        t = schema.trials
        return self._insert_ignore(conn, t, self._trial_values(ids, record), _trial_key(t))

    def _trial_values(self, ids: "_IdCache", record: TrialRecord) -> dict[str, Any]:
        """The trials row of ``record`` (ids of its workload, device and job found or created)."""
        workload_id = ids.workload(record.workload_key)
        device_id = ids.device(record.device_key)
        if record.job_id is not None:
            job = ids.job(record.job_id)
            if job != (workload_id, device_id, record.target):
                raise TuningLogError(
                    f"trial of {record.workload_key} on {record.device_key}/{record.target} "
                    f"does not belong to job {record.job_id}"
                )
        return {
            "job_id": record.job_id,
            "workload_id": workload_id,
            "device_id": device_id,
            "target": record.target,
            "config_json": record.config_text,
            "config_digest": record.config_digest,
            "status": record.status,
            "costs": json.dumps(list(record.costs)),
            "mean_s": record.mean_s,
            "compile_time_s": record.compile_time_s,
            "message": record.message,
            "agent": record.agent,
            "template_version": record.template_version,
            "created_at": record.created_at,
        }

    def _trial_select(self, workload_key: str | None, device_key: DeviceKeys | None, target: str | None):
        t, w, d = schema.trials, schema.workloads, schema.devices
        stmt = (
            select(t, w.c.key.label("workload_key"), d.c.key.label("device_key"))
            .join(w, t.c.workload_id == w.c.id)
            .join(d, t.c.device_id == d.c.id)
        )
        if workload_key is not None:
            stmt = stmt.where(w.c.key == canonical_workload_key(workload_key))
        if device_key is not None:
            stmt = stmt.where(_key_filter(d.c.key, device_key))
        if target is not None:
            stmt = stmt.where(t.c.target == target)
        return stmt

    def _fetch_trials(self, stmt) -> list[TrialRecord]:
        with self._read("read trials") as conn:
            rows = conn.execute(stmt).mappings().all()
        return [
            TrialRecord(
                workload_key=row["workload_key"],
                device_key=row["device_key"],
                target=row["target"],
                config=self._decode(row["config_json"], f"trial (id {row['id']})"),
                status=row["status"],
                costs=tuple(self._decode(row["costs"], f"trial (id {row['id']})", list)),
                mean_s=row["mean_s"],
                compile_time_s=row["compile_time_s"],
                message=row["message"],
                agent=row["agent"],
                template_version=row["template_version"],
                created_at=row["created_at"],
                job_id=row["job_id"],
            )
            for row in rows
        ]


class _CommittedIds:
    def __init__(self) -> None:
        self.workloads: dict[str, int] = {}
        self.devices: dict[str, int] = {}
        self.jobs: dict[int, tuple[int, int, str]] = {}
        self._lock = threading.Lock()

    def get(self, kind: str, key) -> Any:
        """The committed id of ``key`` among ``workloads``, ``devices`` or ``jobs``, or None."""
        with self._lock:
            return getattr(self, kind).get(key)

    def merge(self, ids: "_IdCache") -> None:
        with self._lock:
            self.workloads.update(ids._workloads)
            self.devices.update(ids._devices)
            self.jobs.update(ids._jobs)


class _IdCache:
    """Row ids of workloads, devices and jobs within one write transaction, created as needed
    (those of committed transactions are known without a query)."""

    def __init__(self, log: TuningLog, conn: Connection) -> None:
        self._log = log
        self._conn = conn
        self._workloads: dict[str, int] = {}
        self._devices: dict[str, int] = {}
        self._jobs: dict[int, tuple[int, int, str]] = {}

    def _known(self, kind: str, cache: dict, key) -> bool:
        """Whether ``key``'s id is in ``cache``, filling it from committed transactions."""
        if key not in cache:
            committed = self._log._committed_ids.get(kind, key)
            if committed is None:
                return False
            cache[key] = committed
        return True

    def workload(self, key: str) -> int:
        if not self._known("workloads", self._workloads, key):
            table = schema.workloads
            workload = parse_workload(key)
            self._workloads[key] = self._get_or_create(
                table,
                key,
                {
                    "key": workload.key,
                    "op": workload.op,
                    "params": json.dumps(workload.params, separators=(",", ":")),
                    "dtype": workload.dtype,
                },
            )
        return self._workloads[key]

    def device(self, key: str, info_text: str | None = None, replace: bool = False) -> int:
        """Id of device ``key``; ``info_text`` fills in the info of a new or info-less device, or
        of any device with ``replace``."""
        if info_text is not None or not self._known("devices", self._devices, key):
            table = schema.devices
            now = utcnow()
            values = {"key": key, "info": info_text or "{}", "first_seen": now, "last_seen": now}
            self._devices[key] = self._get_or_create(table, key, values)
            if info_text is not None and replace and info_text != "{}":
                self._conn.execute(update(table).where(table.c.key == key).values(info=info_text))
            elif info_text is not None and info_text != "{}":
                self._conn.execute(
                    update(table).where(table.c.key == key, table.c.info == "{}").values(info=info_text)
                )
        return self._devices[key]

    def job(self, job_id: int) -> tuple[int, int, str]:
        if not self._known("jobs", self._jobs, job_id):
            j = schema.jobs
            row = self._conn.execute(
                select(j.c.workload_id, j.c.device_id, j.c.target).where(j.c.id == job_id)
            ).first()
            if row is None:
                raise NotFoundError(f"no job {job_id} in the tuning log")
            self._jobs[job_id] = (row[0], row[1], row[2])
        return self._jobs[job_id]

    def _get_or_create(self, table, key: str, values: dict[str, Any]) -> int:
        select_id = select(table.c.id).where(table.c.key == key)
        found = self._conn.execute(select_id).scalar()
        if found is None:
            # Another writer may create the same row meanwhile: insert-or-ignore, then read back.
            self._log._insert_ignore(self._conn, table, values, [table.c.key])
            found = self._conn.execute(select_id).scalar_one()
        return int(found)


def _key_filter(column, keys: DeviceKeys):
    """``column == keys`` for one key, ``column IN keys`` for a sequence (none: matches nothing)."""
    if isinstance(keys, str):
        return column == keys
    return column.in_(list(keys))


def _trial_key(t) -> list:
    """The trials table's unique key (schema: one trial per config, workload, device and target)."""
    return [t.c.workload_id, t.c.device_id, t.c.target, t.c.config_digest]


def _insert_ignore_savepoint(conn: Connection, table, values: dict[str, Any]) -> bool:
    try:
        with conn.begin_nested():
            conn.execute(table.insert().values(**values))
    except IntegrityError:
        return False
    return True


def _require_key(name: str, value: Any) -> None:
    if not isinstance(value, str) or not value.strip() or value != value.strip():
        raise ValueError(f"{name} must be a non-empty string without surrounding spaces, not {value!r}")


def _json_object(name: str, value: Any) -> str:
    if not isinstance(value, Mapping):
        raise ValueError(f"{name} must be a JSON object (a mapping), not {type(value).__name__}")
    try:
        return canonical_json(dict(value))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} is not JSON-serialisable: {exc}") from None


__all__ = [
    "AgentTrialStats",
    "JobTrialStats",
    "NotFoundError",
    "PruneSummary",
    "SQLITE_BUSY_TIMEOUT_S",
    "TuningLog",
    "TuningLogError",
    "is_device_pattern",
]

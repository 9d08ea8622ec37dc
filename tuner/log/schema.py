"""Tables of the tuning log (SQLAlchemy 2.x declarative models).

The whole schema lives here; the migrations in :mod:`tuner.log.migrations` build exactly this
schema at their head revision (a test compares the two), so a change here needs a new revision. Constraint names come
from :data:`NAMING_CONVENTION`, so migrations can refer to them by stable names on every backend.

Normalisation: a workload and a device are each one row, referred to by id from jobs and trials.
JSON payloads (workload params, device info, job options, trial config and costs) are stored as
canonical JSON text, so that what is read back is byte-for-byte what was written.
Timestamps are stored as naive UTC (``TIMESTAMP WITHOUT TIME ZONE``) and read back as aware UTC
datetimes, so neither the server's nor the session's time zone can shift them.
"""

from __future__ import annotations

from datetime import datetime, timezone

from sqlalchemy import (
    BigInteger,
    CheckConstraint,
    DateTime,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

NAMING_CONVENTION = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

JOB_STATUSES = ("running", "done", "failed", "cancelled")
FINAL_JOB_STATUSES = ("done", "failed", "cancelled")


class UTCDateTime(TypeDecorator):
    """An aware datetime stored as naive UTC; naive datetimes are refused, not guessed at."""

    impl = DateTime(timezone=False)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None or value.utcoffset() is None:
            raise ValueError("timestamps written to the tuning log must be timezone-aware")
        return value.astimezone(timezone.utc).replace(tzinfo=None)

    def process_result_value(self, value: datetime | None, dialect) -> datetime | None:
        return None if value is None else value.replace(tzinfo=timezone.utc)


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


metadata = Base.metadata


class WorkloadRow(Base):
    """A workload by its canonical key (``matmul(M=512,N=512,K=512,dtype=float32)``)."""

    __tablename__ = "workloads"
    __table_args__ = (Index("ix_workloads_op_dtype", "op", "dtype"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String, unique=True)
    op: Mapped[str] = mapped_column(String)
    params: Mapped[str] = mapped_column(Text)  # JSON object of sizes, in the operator's order
    dtype: Mapped[str] = mapped_column(String)


class DeviceRow(Base):
    """A measuring device by its key; ``info`` is the JSON of ``DeviceInfo.to_json()``."""

    __tablename__ = "devices"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String, unique=True)
    info: Mapped[str] = mapped_column(Text, default="{}")
    first_seen: Mapped[datetime] = mapped_column(UTCDateTime)
    last_seen: Mapped[datetime] = mapped_column(UTCDateTime)


class JobRow(Base):
    """One tuning run: a strategy given a trial budget for a workload on a device and target."""

    __tablename__ = "jobs"
    __table_args__ = (
        CheckConstraint(
            "status IN (" + ", ".join(f"'{s}'" for s in JOB_STATUSES) + ")", name="status"
        ),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"), index=True)
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"), index=True)
    target: Mapped[str] = mapped_column(String)
    strategy: Mapped[str] = mapped_column(String)
    trials: Mapped[int] = mapped_column(Integer)
    options: Mapped[str] = mapped_column(Text, default="{}")
    status: Mapped[str] = mapped_column(String(16))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime, nullable=True)


class TrialRow(Base):
    """One measured config. A config is measured at most once per workload, device and target."""

    __tablename__ = "trials"
    __table_args__ = (
        UniqueConstraint("workload_id", "device_id", "target", "config_digest"),
        # Only a successful measurement has a mean time; ranking relies on it.
        CheckConstraint("mean_s IS NULL OR status = 'ok'", name="mean_only_ok"),
        Index("ix_trials_best", "workload_id", "device_id", "target", "mean_s"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    job_id: Mapped[int | None] = mapped_column(
        ForeignKey("jobs.id", ondelete="SET NULL"), nullable=True, index=True
    )
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))
    device_id: Mapped[int] = mapped_column(ForeignKey("devices.id"))
    target: Mapped[str] = mapped_column(String)
    config_json: Mapped[str] = mapped_column(Text)  # canonical text, as Config.json_text()
    config_digest: Mapped[str] = mapped_column(String(16))  # as Config.digest
    status: Mapped[str] = mapped_column(String(32))  # a MeasureStatus value
    costs: Mapped[str] = mapped_column(Text)  # JSON list of seconds per call
    mean_s: Mapped[float | None] = mapped_column(Double, nullable=True)
    compile_time_s: Mapped[float] = mapped_column(Double)
    message: Mapped[str] = mapped_column(Text, default="")
    agent: Mapped[str] = mapped_column(String, default="")
    template_version: Mapped[str] = mapped_column(String, default="")
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, index=True)


class FamilyRow(Base):
    """A shape range tuned as one family (``matmul(M=1..512,N=768,K=768,dtype=float32)``)."""

    __tablename__ = "workload_families"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String, unique=True)
    op: Mapped[str] = mapped_column(String, index=True)
    dtype: Mapped[str] = mapped_column(String)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class FamilyMemberRow(Base):
    """A representative shape of a family: a workload tuned on its behalf."""

    __tablename__ = "workload_family_members"
    __table_args__ = (UniqueConstraint("family_id", "workload_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    family_id: Mapped[int] = mapped_column(ForeignKey("workload_families.id", ondelete="CASCADE"))
    workload_id: Mapped[int] = mapped_column(ForeignKey("workloads.id"))


class LeadershipRow(Base):
    """Which daemon leads a tune-cluster on this database: one row (id 1), a lease in time.

    ``epoch`` grows by one at every change of leader and is never reused; a leader's writes are
    fenced by it (:mod:`tuner.log.leadership`). ``expires_at`` is in seconds of the database
    server's clock, so the daemons' clocks never matter.
    """

    __tablename__ = "daemon_leadership"
    __table_args__ = (CheckConstraint("id = 1", name="single_row"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=False)
    epoch: Mapped[int] = mapped_column(BigInteger)
    holder: Mapped[str] = mapped_column(String)  # the leading daemon's id (host, pid, a random part)
    address: Mapped[str] = mapped_column(String)  # where clients and agents reach it (HOST:PORT)
    expires_at: Mapped[float] = mapped_column(Double)


workloads = WorkloadRow.__table__
families = FamilyRow.__table__
family_members = FamilyMemberRow.__table__
devices = DeviceRow.__table__
jobs = JobRow.__table__
leadership = LeadershipRow.__table__
trials = TrialRow.__table__

__all__ = [
    "Base",
    "DeviceRow",
    "FamilyMemberRow",
    "FamilyRow",
    "FINAL_JOB_STATUSES",
    "JOB_STATUSES",
    "JobRow",
    "LeadershipRow",
    "NAMING_CONVENTION",
    "TrialRow",
    "UTCDateTime",
    "WorkloadRow",
    "devices",
    "families",
    "family_members",
    "jobs",
    "leadership",
    "metadata",
    "trials",
    "workloads",
]

"""Leadership of a tune-cluster in its PostgreSQL log: the lease, the epoch and the fence (issue 22)."""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from tuner.log import TuningLog
from tuner.log.database import TuningLogError
from tuner.log.leadership import Deposed, LeaderLease, SingleDaemonLock

from test_tuning_log import PG_URL, pg_admin, trial  # noqa: F401 - fixture

pytestmark = pytest.mark.postgres


@pytest.fixture()
def pg_url(pg_admin):
    """A fresh PostgreSQL database's URL (dropped afterwards); skipped when the server is unreachable.
    Other modules' PostgreSQL tests take it from here."""
    name = f"tf_test_{uuid.uuid4().hex[:12]}"
    with pg_admin.connect() as conn:
        conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with pg_admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def expire(log: TuningLog) -> None:
    """What time does to a lease nobody renews."""
    with log.engine.begin() as conn:
        conn.execute(text("UPDATE daemon_leadership SET expires_at = 0"))


def test_one_leads_the_other_waits_and_takes_over_an_expired_lease_with_a_new_epoch(pg_url):
    with TuningLog(pg_url) as log_a, TuningLog(pg_url) as log_b:
        a = LeaderLease(log_a, "a:9190", ttl_s=5)
        b = LeaderLease(log_b, "b:9190", ttl_s=5)
        assert b.current() is None
        assert a.try_acquire() and a.epoch == 1
        assert not b.try_acquire() and b.epoch is None
        leader = b.current()
        assert (leader.address, leader.epoch, leader.holder) == ("a:9190", 1, a.holder) and leader.live
        assert a.try_acquire() and a.epoch == 1  # renewing keeps the epoch
        expire(log_a)
        assert b.try_acquire() and b.epoch == 2  # a takeover: a new epoch
        assert not a.try_acquire()  # a lost it, and knows
        assert a.current().address == "b:9190"
        b.release()
        assert a.try_acquire() and a.epoch == 3  # released: taken at once, never an old epoch again


def test_a_deposed_leader_records_nothing(pg_url):
    with TuningLog(pg_url) as log_a, TuningLog(pg_url) as log_b:
        a = LeaderLease(log_a, "a:9190")
        b = LeaderLease(log_b, "b:9190")
        log_a.fence_writes(a.fence)
        log_b.fence_writes(b.fence)
        assert a.try_acquire()
        log_a.record_trials([trial({"x": 1})])
        with pytest.raises(Deposed):
            log_b.record_trials([trial({"x": 2})])  # a standby cannot write
        expire(log_a)
        assert b.try_acquire()
        log_b.record_trials([trial({"x": 3})])
        # a wakes up believing it leads: the fence refuses its writes, whole transactions at a time
        with pytest.raises(Deposed, match="no longer leads"):
            log_a.record_trials([trial({"x": 4}), trial({"x": 5})])
        with pytest.raises(Deposed):
            log_a.create_job("matmul(M=8,N=8,K=8)", "dev-a", "cpu", "random", 4)
        assert sorted(t.config["x"] for t in log_b.trials()) == [1, 3]
        assert log_b.jobs() == []


def test_leadership_needs_postgresql_and_sqlite_holds_one_daemon(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'log.db'}") as log:
        with pytest.raises(TuningLogError, match="needs a PostgreSQL"):
            LeaderLease(log, "a:9190")
    first, second = SingleDaemonLock(tmp_path / "log.db"), SingleDaemonLock(tmp_path / "log.db")
    first.acquire()
    with pytest.raises(TuningLogError, match="SQLite holds one daemon.*PostgreSQL") as refused:
        second.acquire()
    assert f"pid {__import__('os').getpid()}" in str(refused.value) and "\n" not in str(refused.value)
    first.release()
    second.acquire()  # released (or its holder died): the next daemon starts
    second.release()

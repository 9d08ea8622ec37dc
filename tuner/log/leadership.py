"""Which daemon of a tune-cluster leads: a lease with an epoch in the tuning log's own database.

Several ``tuner daemon`` processes share one PostgreSQL database; PostgreSQL decides which one leads,
instead of a consensus protocol of our own. The choice, and why:

- **A lease, not an advisory lock.** A session-level advisory lock is released only when the
  holder's connection ends: a leader frozen by SIGSTOP (or a VM pause, a long GC) keeps its TCP
  connection and so its lock, and no standby could ever take over. A lease has an expiry in the
  database server's clock (``daemon_leadership.expires_at``; the daemons' clocks never matter); the
  leader renews it every third of its time to live, and any daemon may take an expired lease.
- **Fencing by epoch.** Each change of leader increments ``epoch``. Every write transaction of a
  leader first reads the row ``FOR SHARE`` and compares the epoch with its own
  (:meth:`LeaderLease.fence`, installed with :meth:`TuningLog.fence_writes`); a stale leader's
  transaction is aborted before it writes anything (:class:`Deposed`). The share lock orders
  writes and takeovers: a takeover waits for the writes in flight, and a write that starts after
  a takeover sees the new epoch. So a deposed leader that wakes up (SIGCONT) records nothing.
- **Bounded waits.** A takeover waits at most :data:`LOCK_TIMEOUT_S` for a lock; a leader's write
  transaction that goes idle (its process frozen mid-transaction) is ended by the server after the
  lease's time to live (``idle_in_transaction_session_timeout``), so a frozen leader cannot hold the
  row's lock past its lease.

Failure modes: a leader cut from the database cannot renew; once its lease expires a standby that
reaches the database takes over, and the old leader's writes are refused (it exits when it notices,
to come back as a standby). A database that is down for everyone stops every daemon's writes:
nothing is lost (jobs hold their results) and nobody takes over until it returns. Leadership moves
at most every ``ttl_s``; takeover after a leader dies takes at most ``ttl_s`` plus the standby's poll
interval (``tuner daemon --lease-ttl``, default 5 s, polled every 1 s).

SQLite holds one daemon: :class:`SingleDaemonLock` refuses a second daemon on the same file (an
exclusive ``flock`` on a file beside it, which the kernel releases when the holder dies).
"""

from __future__ import annotations

import fcntl
import os
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Connection, text

from tuner.log.database import LogUnavailable, TuningLogError
from tuner.log.storage import TuningLog

LOCK_TIMEOUT_S = 2.0  # a takeover waits this long for a lock, then tries again at its next poll
DEFAULT_TTL_S = 5.0


class Deposed(LogUnavailable):
    """Another daemon leads now (a newer epoch): this one's write was refused, nothing recorded.

    A :class:`LogUnavailable`, so a job holds its results as in any outage; its daemon stops
    serving once it notices, and the new leader measures what was not recorded."""


@dataclass(frozen=True)
class Leader:
    """The lease as the database holds it."""

    holder: str
    address: str
    epoch: int
    expires_in_s: float  # negative: expired

    @property
    def live(self) -> bool:
        return bool(self.holder) and self.expires_in_s > 0


def new_holder_id() -> str:
    """A daemon's identity in the lease: host and pid for people, a random part so that a restarted
    daemon is never taken for its predecessor."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


_NOW = "EXTRACT(EPOCH FROM clock_timestamp())::double precision"


class LeaderLease:
    """This daemon's side of the lease in ``log``'s database (PostgreSQL).

    :meth:`try_acquire` takes a free or expired lease (a new epoch) or renews this daemon's own;
    :attr:`epoch` is set while this daemon believes it leads. Thread-safe in the sense that each
    method is one short transaction of its own.
    """

    def __init__(self, log: TuningLog, address: str, ttl_s: float = DEFAULT_TTL_S, holder: str | None = None) -> None:
        if log.engine.dialect.name != "postgresql":
            raise TuningLogError("leadership (standby daemons) needs a PostgreSQL tuning log, "
                                 f"not {log.engine.dialect.name}")
        if not 1.0 <= ttl_s <= 600.0:
            raise ValueError("the leadership lease's time to live must be between 1 and 600 s")
        self.log = log
        self.address = address
        self.ttl_s = ttl_s
        self.holder = holder or new_holder_id()
        self.epoch: int | None = None
        self._guard = log._guard  # one-line errors, LogUnavailable for outages
        with self._guard("create the leadership lease"), log.engine.begin() as conn:
            conn.execute(text("INSERT INTO daemon_leadership (id, epoch, holder, address, expires_at) "
                              "VALUES (1, 0, '', '', 0) ON CONFLICT (id) DO NOTHING"))

    def try_acquire(self) -> bool:
        """Lead: renew this daemon's lease, or take the lease if it is free or expired (a new
        epoch). ``False`` when another daemon holds a live lease (or this one lost it)."""
        with self._guard("take the leadership lease"), self.log.engine.begin() as conn:
            conn.exec_driver_sql(f"SET LOCAL lock_timeout = '{int(LOCK_TIMEOUT_S * 1000)}ms'")
            epoch = conn.execute(text(
                "UPDATE daemon_leadership SET "
                "  epoch = CASE WHEN holder = :holder AND epoch = :epoch THEN epoch ELSE epoch + 1 END, "
                f" holder = :holder, address = :address, expires_at = {_NOW} + :ttl "
                f"WHERE id = 1 AND ((holder = :holder AND epoch = :epoch) OR expires_at < {_NOW}) "
                "RETURNING epoch"),
                {"holder": self.holder, "epoch": -1 if self.epoch is None else self.epoch, "address": self.address,
                 "ttl": self.ttl_s}).scalar()
        self.epoch = epoch
        return epoch is not None

    def current(self) -> Leader | None:
        """The lease as it stands (``None`` before any daemon took it)."""
        with self._guard("read the leadership lease"), self.log.engine.connect() as conn:
            row = conn.execute(text(f"SELECT holder, address, epoch, expires_at - {_NOW} FROM daemon_leadership "
                                    "WHERE id = 1")).first()
        if row is None or not row[0]:
            return None
        return Leader(holder=row[0], address=row[1], epoch=int(row[2]), expires_in_s=float(row[3]))

    def release(self) -> None:
        """Stepping down (a graceful stop): expire the lease now, so a standby takes over at once."""
        if self.epoch is None:
            return
        epoch, self.epoch = self.epoch, None
        with self._guard("release the leadership lease"), self.log.engine.begin() as conn:
            conn.execute(text("UPDATE daemon_leadership SET expires_at = 0 "
                              "WHERE id = 1 AND holder = :holder AND epoch = :epoch"),
                         {"holder": self.holder, "epoch": epoch})

    def fence(self, conn: Connection) -> None:
        """First statement of every write transaction of the leader (see the module docstring)."""
        epoch = self.epoch
        conn.exec_driver_sql(f"SET LOCAL idle_in_transaction_session_timeout = '{int(self.ttl_s * 1000)}ms'")
        current = conn.execute(text("SELECT epoch FROM daemon_leadership WHERE id = 1 FOR SHARE")).scalar()
        if epoch is None or current != epoch:
            raise Deposed(f"this daemon no longer leads (its epoch {epoch}, the log's {current}): nothing recorded")


class SingleDaemonLock:
    """The one daemon of a SQLite tuning log: an exclusive lock on ``<file>.daemon-lock``.

    The kernel drops the lock when its holder dies, so a killed daemon can be restarted at once.
    """

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + ".daemon-lock")
        self._fd: int | None = None

    def acquire(self) -> None:
        """Raises :class:`TuningLogError` (one line) when another daemon holds the file."""
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise TuningLogError(f"cannot create {self.path}: {exc.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise TuningLogError(
                f"another daemon ({holder}) serves the SQLite tuning log {self.path.with_suffix('')}: SQLite holds "
                "one daemon; for a standby daemon use a PostgreSQL log (--db postgresql+psycopg://...)") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}".encode(), 0)
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the lock
            self._fd = None

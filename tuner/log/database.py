"""Connecting to the tuning log's database: engines, SQLite settings, one-line errors.

Shared by :mod:`tuner.log.storage` (the log itself) and :mod:`tuner.log.migrate` (its schema).

SQLite files run in WAL mode with a 30 s busy timeout and foreign keys enforced; a transaction on a
connection whose ``info`` carries :data:`IMMEDIATE` starts with ``BEGIN IMMEDIATE``, so that
concurrent writers queue on the busy timeout instead of failing when a read lock cannot be upgraded.
"""

from __future__ import annotations

import re
import sqlite3
import time
from contextlib import contextmanager
from typing import Any, Iterator

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import InterfaceError, OperationalError, SQLAlchemyError

SQLITE_BUSY_TIMEOUT_S = 30
PG_CONNECT_TIMEOUT_S = 10
# Key of conn.info asking for BEGIN IMMEDIATE (SQLite) on the next transaction of that connection.
IMMEDIATE = "tunefleet_begin_immediate"


class TuningLogError(Exception):
    """The tuning log cannot do what was asked. The message is one line, fit for a user."""


class LogUnavailable(TuningLogError):
    """The database is away for now (connection lost or refused, locked past the busy timeout,
    disk full): the same call may succeed later, so writers that must not lose data retry it."""


def create_log_engine(url: str) -> Engine:
    """An engine for ``url``; raises :class:`TuningLogError` for a URL it cannot use.

    Connecting is lazy: an unreachable server or a corrupt file shows on first use (wrap that
    in :func:`guard`).
    """
    display = redact(url)
    try:
        parsed = make_url(url)
        kwargs: dict[str, Any] = {}
        if parsed.get_backend_name() == "sqlite":
            # a file has no connection to lose: no ping (a query) before each transaction
            kwargs["connect_args"] = {"timeout": SQLITE_BUSY_TIMEOUT_S}
        else:
            kwargs["pool_pre_ping"] = True  # a server restarted since: reconnect instead of failing
            if parsed.get_backend_name() == "postgresql" and "connect_timeout" not in parsed.query:
                kwargs["connect_args"] = {"connect_timeout": PG_CONNECT_TIMEOUT_S}
        engine = create_engine(parsed, **kwargs)
    except ImportError as exc:
        if (getattr(exc, "name", None) or "").split(".")[0] == "psycopg":  # not installed on an agent-only host
            raise TuningLogError(f"{display}: PostgreSQL needs the postgres extra: "
                                 "pip install 'tunefleet[postgres]'") from None
        raise TuningLogError(f"invalid database URL {display}: {one_line(exc)}") from None
    except (SQLAlchemyError, ValueError, TypeError) as exc:
        raise TuningLogError(f"invalid database URL {display}: {one_line(exc)}") from None
    if engine.dialect.is_async:
        engine.dispose()
        raise TuningLogError(f"invalid database URL {display}: async drivers are not supported")
    if engine.dialect.name == "sqlite":
        _configure_sqlite(engine)
    return engine


@contextmanager
def guard(action: str, display_url: str) -> Iterator[None]:
    """Turn database and driver exceptions into a one-line :class:`TuningLogError`."""
    try:
        yield
    except TuningLogError:
        raise
    except (OperationalError, InterfaceError, sqlite3.OperationalError, sqlite3.InterfaceError) as exc:
        raise LogUnavailable(f"cannot {action} at {display_url}: {one_line(exc)}") from None
    except (SQLAlchemyError, sqlite3.Error) as exc:
        raise TuningLogError(f"cannot {action} at {display_url}: {one_line(exc)}") from None


def one_line(exc: BaseException) -> str:
    """The first line of the driver's message, without SQLAlchemy's statement and links."""
    source = getattr(exc, "orig", None) or exc
    for line in str(source).splitlines():
        if line.strip():
            return line.strip()
    return type(source).__name__


def redact(url: Any) -> str:
    """The URL with any password masked."""
    return re.sub(r"(//[^:/@]*:)[^@/]*@", r"\1***@", str(url))


def _configure_sqlite(engine: Engine) -> None:
    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, connection_record) -> None:
        # Take transaction control from the sqlite3 module so that BEGIN is ours to issue.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_S * 1000}")
            cursor.execute("PRAGMA foreign_keys = ON")
            _switch_to_wal(cursor)
            # In WAL mode, NORMAL skips the fsync per commit: a committed result survives any crash
            # of the daemon or agents; only an OS crash or power cut may lose the last commits, and
            # the candidates they held are then measured again when the job resumes.
            cursor.execute("PRAGMA synchronous = NORMAL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.info.pop(IMMEDIATE, False) else "BEGIN")


def _switch_to_wal(cursor) -> None:
    """``PRAGMA journal_mode = WAL``, retried within the busy timeout: while another connection
    switches a new database to WAL, SQLite answers "database is locked" at once, without its busy
    handler (seen when several processes open a fresh log together). WAL persists in the file, so
    later connections find it set and pass on the first try."""
    deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_S
    pause = 0.005
    while True:
        try:
            cursor.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause > deadline:
                raise
        time.sleep(pause)
        pause = min(0.2, pause * 2)


__all__ = [
    "IMMEDIATE",
    "SQLITE_BUSY_TIMEOUT_S",
    "TuningLogError",
    "create_log_engine",
    "guard",
    "one_line",
    "redact",
]

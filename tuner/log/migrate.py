"""The tuning log's schema versions: Alembic, run programmatically from the package.

The migrations live in :mod:`tuner.log.migrations` (installed with the package); no ``alembic.ini``
is needed. The schema revision of a database is kept in the table :data:`VERSION_TABLE`.

Policy (what :class:`~tuner.log.TuningLog` does when it opens a database):

* at the head revision: used;
* **empty** (no tables at all: a new SQLite file, or a new PostgreSQL database): migrated to head
  automatically when the log is opened with ``create=True`` (the CLI's default, so a first
  ``tuner tune`` just works), else refused;
* anything else is refused with a one-line message saying what to do: an older revision or a tuning
  log made before schema versioning ("legacy") -> ``tuner db upgrade``; a revision this tunefleet
  does not know -> upgrade tunefleet; a non-empty database without a tuning log -> ``tuner db
  upgrade`` creates one in it; tables named like the log's but of another shape -> refused outright.

:func:`upgrade` (``tuner db upgrade``) migrates to head: it creates the log in an empty or
unrelated database, upgrades an older revision, and adopts a legacy log (checks that its tables have
the initial revision's columns, stamps it at the initial revision, then upgrades).

Schema changes happen in one transaction, under a lock (``BEGIN IMMEDIATE`` on SQLite, an advisory
transaction lock on PostgreSQL), so processes opening a fresh database at once create it once.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Iterator

from sqlalchemy import Connection, Engine, inspect, text
from sqlalchemy.engine import make_url

from tuner.log.database import IMMEDIATE, TuningLogError, create_log_engine, guard, redact

VERSION_TABLE = "tunefleet_schema_version"
INITIAL_REVISION = "0001_initial"
MIGRATIONS_DIR = Path(__file__).resolve().with_name("migrations")
# Serialises schema changes between processes on one PostgreSQL database.
_PG_SCHEMA_LOCK = 0x74756E65666C6565

# Tables and columns of the initial revision: a database holding all of them but no version table is
# a tuning log created by tunefleet before migrations existed (it used metadata.create_all).
LEGACY_TABLES: dict[str, tuple[str, ...]] = {
    "workloads": ("id", "key", "op", "params", "dtype"),
    "devices": ("id", "key", "info", "first_seen", "last_seen"),
    "jobs": ("id", "workload_id", "device_id", "target", "strategy", "trials", "options", "status",
             "created_at", "finished_at"),
    "trials": ("id", "job_id", "workload_id", "device_id", "target", "config_json", "config_digest", "status",
               "costs", "mean_s", "compile_time_s", "message", "agent", "template_version", "created_at"),
}

# SchemaState.kind values
CURRENT, EMPTY, MISSING, OUTDATED, NEWER, LEGACY, UNVERSIONED, FOREIGN = (
    "current", "empty", "missing", "outdated", "newer", "legacy", "unversioned", "foreign",
)


@dataclass(frozen=True)
class SchemaState:
    """Where a database stands: ``kind`` is one of ``current``, ``empty``, ``missing`` (no SQLite
    file), ``outdated``, ``newer``, ``legacy``, ``unversioned`` (tables, none of them the log's) or
    ``foreign`` (tables named like the log's, of another shape; ``detail`` says how)."""

    url: str  # display form, password masked
    kind: str
    revision: str | None
    head: str
    detail: str = ""

    @property
    def up_to_date(self) -> bool:
        return self.kind == CURRENT

    @property
    def upgradable(self) -> bool:
        return self.kind in (EMPTY, MISSING, OUTDATED, LEGACY, UNVERSIONED)

    def describe(self) -> str:
        """One line for ``tuner db current``."""
        return {
            CURRENT: f"at revision {self.revision} (head): up to date",
            EMPTY: "empty: no tuning log yet",
            MISSING: "no database file yet",
            OUTDATED: f"at revision {self.revision}, older than head {self.head}",
            NEWER: f"at revision {self.revision}, unknown to this tunefleet (head {self.head}): newer",
            LEGACY: "a tuning log from before schema versioning (no revision)",
            UNVERSIONED: "not empty, and holds no tuning log",
            FOREIGN: f"not a tunefleet tuning log ({self.detail})",
        }[self.kind]

    def refusal(self) -> str:
        """Why the tuning log will not open this database, and what to do (one line)."""
        upgrade = f"run 'tuner db upgrade --db {self.url}'"
        return {
            EMPTY: f"the database at {self.url} has no tuning log yet: {upgrade} to create it",
            MISSING: f"no tuning log at {self.url}: {upgrade} to create it",
            OUTDATED: f"the tuning log at {self.url} is at schema revision {self.revision}, "
            f"this tunefleet needs {self.head}: {upgrade}",
            NEWER: f"the tuning log at {self.url} is at schema revision {self.revision}, which this "
            f"tunefleet does not know (its newest is {self.head}): upgrade tunefleet",
            LEGACY: f"the tuning log at {self.url} predates schema versioning: {upgrade}",
            UNVERSIONED: f"the database at {self.url} is not empty and holds no tuning log: "
            f"{upgrade} to create one in it",
            FOREIGN: f"the database at {self.url} is not a tunefleet tuning log ({self.detail}); refusing to use it",
            CURRENT: "",
        }[self.kind]


# -- alembic --------------------------------------------------------------------------------------
def alembic_config(connection: Connection | None = None):
    """An Alembic config for the packaged migrations; ``connection`` is used by ``env.py``."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("path_separator", "os")
    if connection is not None:
        config.attributes["connection"] = connection
    return config


@lru_cache(maxsize=1)
def _script():
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str:
    """The newest schema revision this tunefleet knows."""
    heads = _script().get_heads()
    if len(heads) != 1:  # pragma: no cover - a packaging mistake
        raise RuntimeError(f"the tuning log's migrations have {len(heads)} heads: {heads}")
    return heads[0]


def revisions() -> list[str]:
    """Every known revision, oldest first."""
    return [s.revision for s in reversed(list(_script().walk_revisions()))]


# -- state ------------------------------------------------------------------------------------------
def read_state(conn: Connection, display_url: str) -> SchemaState:
    """The state of the database behind ``conn`` (reads only)."""
    head = head_revision()
    inspector = inspect(conn)
    tables = set(inspector.get_table_names())
    if VERSION_TABLE in tables:
        versions = list(conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars())
        if len(versions) == 1 and versions[0] == head:
            return SchemaState(display_url, CURRENT, head, head)
        if len(versions) == 1 and versions[0] in revisions():
            return SchemaState(display_url, OUTDATED, versions[0], head)
        if versions:
            return SchemaState(display_url, NEWER, ",".join(sorted(versions)), head)
        tables.discard(VERSION_TABLE)  # an empty version table: judge by the tables
    if not tables:
        return SchemaState(display_url, EMPTY, None, head)
    ours = [name for name in LEGACY_TABLES if name in tables]
    if not ours:
        return SchemaState(display_url, UNVERSIONED, None, head)
    for name, columns in LEGACY_TABLES.items():
        if name not in tables:
            return SchemaState(display_url, FOREIGN, None, head, f"it has table {ours[0]} but no table {name}")
        present = {c["name"] for c in inspector.get_columns(name)}
        missing = [c for c in columns if c not in present]
        if missing:
            return SchemaState(display_url, FOREIGN, None, head, f"table {name} lacks column {missing[0]}")
    return SchemaState(display_url, LEGACY, None, head)


def schema_state(url: str) -> SchemaState:
    """Where the database at ``url`` stands; creates nothing (a missing SQLite file is ``missing``)."""
    display = redact(url)
    path = sqlite_path(url)
    if path is not None and not path.exists():
        return SchemaState(display, MISSING, None, head_revision())
    if path is not None and path.is_file() and path.stat().st_size == 0:  # connecting would write a header
        return SchemaState(display, EMPTY, None, head_revision())
    engine = create_log_engine(url)
    try:
        with guard("read the schema version", display), engine.connect() as conn:
            return read_state(conn, display)
    finally:
        engine.dispose()


def ensure_current(engine: Engine, display_url: str, create: bool) -> None:
    """Make sure the database is at head: create the log in an empty database if ``create``, else
    raise :class:`TuningLogError` with :meth:`SchemaState.refusal`."""
    with guard("open the tuning log", display_url):
        with engine.connect() as conn:
            state = read_state(conn, display_url)
        if state.kind == CURRENT:
            return
        if state.kind != EMPTY or not create:
            raise TuningLogError(state.refusal())
        with _schema_lock(engine) as conn:
            state = read_state(conn, display_url)  # another process may have created it meanwhile
            if state.kind == CURRENT:
                return
            if state.kind != EMPTY:
                raise TuningLogError(state.refusal())
            _run_upgrade(conn, "head")


def upgrade(url: str, revision: str = "head") -> tuple[SchemaState, str]:
    """Migrate the database at ``url`` to ``revision`` (default: head); see the module docstring.

    Returns the state before and the revision after. Downgrades are not offered. Raises
    :class:`TuningLogError` (one line) when the database cannot or must not be migrated.
    """
    display = redact(url)
    known = revisions()
    target = head_revision() if revision == "head" else revision
    if target not in known:
        raise TuningLogError(f"unknown schema revision {revision!r}; known: {', '.join(known)}")
    engine = create_log_engine(url)
    try:
        with guard("upgrade the tuning log", display), _schema_lock(engine) as conn:
            state = read_state(conn, display)
            if state.kind in (NEWER, FOREIGN):
                raise TuningLogError(state.refusal())
            if state.revision is not None and known.index(state.revision) > known.index(target):
                raise TuningLogError(
                    f"the tuning log at {display} is at revision {state.revision}, newer than {target}; "
                    "downgrades are not supported"
                )
            if state.kind == LEGACY:
                from alembic import command

                command.stamp(alembic_config(conn), INITIAL_REVISION)
            if state.revision != target:
                _run_upgrade(conn, target)
            return state, target
    finally:
        engine.dispose()


# -- internals ----------------------------------------------------------------------------------------
@contextmanager
def _schema_lock(engine: Engine) -> Iterator[Connection]:
    """A connection in a transaction that holds the schema lock; committed on success."""
    with engine.connect() as conn:
        conn.info[IMMEDIATE] = True
        with conn.begin():
            if conn.dialect.name == "postgresql":
                conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": _PG_SCHEMA_LOCK})
            yield conn


def _run_upgrade(conn: Connection, revision: str) -> None:
    from alembic import command
    from alembic.util import CommandError

    try:
        command.upgrade(alembic_config(conn), revision)
    except CommandError as exc:
        raise TuningLogError(f"cannot upgrade the tuning log: {str(exc).splitlines()[0]}") from None


def sqlite_path(url: str) -> Path | None:
    """The file of a file-backed SQLite URL, else ``None``."""
    try:
        parsed = make_url(url)
    except Exception:  # noqa: BLE001 - create_log_engine reports bad URLs
        return None
    if parsed.get_backend_name() != "sqlite":
        return None
    database = parsed.database or ""
    if not database or database == ":memory:" or database.startswith("file:") or parsed.query.get("uri"):
        return None
    return Path(database).expanduser()


__all__ = [
    "INITIAL_REVISION",
    "LEGACY_TABLES",
    "MIGRATIONS_DIR",
    "SchemaState",
    "VERSION_TABLE",
    "alembic_config",
    "ensure_current",
    "head_revision",
    "read_state",
    "revisions",
    "schema_state",
    "sqlite_path",
    "upgrade",
]

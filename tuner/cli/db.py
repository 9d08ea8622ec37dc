"""``tuner db upgrade|current``: the tuning log's schema version (Alembic migrations)."""

from __future__ import annotations

import argparse

from tuner.cli.common import EXIT_FAILURE, CliError

POLICY = (
    "Opening a log (tuner tune, best, ...) migrates an empty database (a new SQLite file, a new PostgreSQL "
    "database) automatically; any other database not at this tunefleet's schema revision is refused until "
    "'tuner db upgrade' is run."
)


def register(subparsers) -> None:
    p = subparsers.add_parser("db", help="create or upgrade the tuning log's database schema",
                              description="The tuning log's database schema. " + POLICY)
    actions = p.add_subparsers(dest="db_command", required=True, metavar="ACTION")
    up = actions.add_parser(
        "upgrade", help="migrate the database to this tunefleet's schema (creates the log if needed)",
        description="Migrate the database to this tunefleet's newest schema revision: creates the tuning log in "
        "an empty or unrelated database, upgrades an older revision, and adopts a tuning log made before schema "
        "versioning. One transaction; safe to run again. " + POLICY)
    up.add_argument("--revision", default="head", help="target revision (default: head)")
    _db_argument(up)
    up.set_defaults(func=run_upgrade)
    cur = actions.add_parser("current", help="show the database's schema revision",
                             description="Show the database's schema revision and whether it is up to date. "
                             "Creates nothing.")
    cur.add_argument("--check", action="store_true", help="exit with status 1 unless the database is up to date")
    _db_argument(cur)
    cur.set_defaults(func=run_current)


def _db_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", help="database URL or SQLite file (default: $TUNEFLEET_DB or the per-user SQLite log)")


def _url(db: str | None, create_directory: bool) -> str:
    from tuner.settings import SettingsError, resolve_db_url

    try:
        return resolve_db_url(db, create_directory=create_directory)
    except SettingsError as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None


def run_upgrade(args: argparse.Namespace) -> int:
    from tuner.log import TuningLogError
    from tuner.log.migrate import LEGACY, upgrade

    try:
        before, after = upgrade(_url(args.db, True), args.revision)
    except TuningLogError as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None
    if before.revision == after:
        print(f"{before.url}: already at revision {after}")
    elif before.kind == LEGACY:
        print(f"{before.url}: adopted a tuning log from before schema versioning, upgraded to revision {after}")
    elif before.revision is None:
        print(f"{before.url}: created the tuning log at revision {after}")
    else:
        print(f"{before.url}: upgraded from revision {before.revision} to {after}")
    return 0


def run_current(args: argparse.Namespace) -> int:
    from tuner.log import TuningLogError
    from tuner.log.migrate import schema_state

    try:
        state = schema_state(_url(args.db, False))
    except TuningLogError as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None
    print(f"{state.url}: {state.describe()}")
    if not state.up_to_date and state.upgradable:
        print(f"run 'tuner db upgrade{'' if args.db is None else ' --db ' + state.url}' to migrate it to {state.head}")
    return EXIT_FAILURE if args.check and not state.up_to_date else 0

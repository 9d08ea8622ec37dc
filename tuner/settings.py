"""Settings read from the environment. This is the only module of the tuner that reads them.

Precedence for the tuning log's database: the command-line value, else ``$TUNEFLEET_DB``, else a
SQLite file under the XDG data directory.
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

DB_ENV_VAR = "TUNEFLEET_DB"
TOKEN_FILE_ENV_VAR = "TUNEFLEET_TOKEN_FILE"


class SettingsError(ValueError):
    """A setting that cannot be used as given (one-line message)."""


def default_db_path() -> Path:
    """``$XDG_DATA_HOME/tunefleet/tuning.db``, or ``~/.local/share/tunefleet/tuning.db``.

    A relative ``XDG_DATA_HOME`` is ignored, as the XDG base-directory specification requires.
    """
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "tunefleet" / "tuning.db"


def resolve_db_url(cli_value: str | None, *, create_directory: bool = True) -> str:
    """The SQLAlchemy URL of the tuning log.

    ``cli_value`` wins when non-empty, then ``$TUNEFLEET_DB`` when non-empty, then
    :func:`default_db_path`. A value without ``://`` is a filesystem path and becomes a
    ``sqlite:///`` URL of its absolute form (``~`` expanded). For a SQLite file URL the file's
    directory is created (unless ``create_directory`` is false: applications that only read the
    log must not leave directories behind), so a first run works out of the box; failing that
    raises :class:`SettingsError`. Other URLs are returned unchanged; whether they work is for the
    tuning log to find out.
    """
    value = (cli_value or "").strip() or os.environ.get(DB_ENV_VAR, "").strip()
    if not value:
        value = str(default_db_path())
    if "://" not in value:
        value = "sqlite:///" + str(Path(value).expanduser().absolute())
    if create_directory:
        _ensure_sqlite_directory(value)
    return value


def _ensure_sqlite_directory(url_text: str) -> None:
    try:
        url = make_url(url_text)
    except ArgumentError:
        return  # not a URL SQLAlchemy understands: the tuning log reports it when opened
    if url.get_backend_name() != "sqlite":
        return
    database = url.database or ""
    if not database or database == ":memory:" or database.startswith("file:") or url.query.get("uri"):
        return
    directory = Path(database).expanduser().absolute().parent
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingsError(
            f"cannot create directory {directory} for the tuning log: {exc.strerror or exc}"
        ) from None


def resolve_token_file(cli_value: str | None) -> str | None:
    """The client token file: ``--token-file``, else ``$TUNEFLEET_TOKEN_FILE``, else none."""
    return (cli_value or "").strip() or os.environ.get(TOKEN_FILE_ENV_VAR, "").strip() or None

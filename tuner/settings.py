"""Settings read from the environment and the config file. This is the only module of the tuner
that reads them; the layering (a flag, else the environment, else the config file, else the default)
and the file's schema are :mod:`measure_agent.settings`, shared with the agent.

Precedence for the tuning log's database: the command-line value, else ``$TUNEFLEET_DB``, else ``db``
of the config file's ``[tuner]`` table, else a SQLite file under the XDG data directory. A server's
password may come from a file (``$TUNEFLEET_DB_PASSWORD_FILE``, or ``db_password_file``).
"""

from __future__ import annotations

import os
from pathlib import Path

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from measure_agent.settings import Resolved, Settings, SettingsError  # noqa: F401 - SettingsError is re-exported

DB_ENV_VAR = "TUNEFLEET_DB"
TOKEN_FILE_ENV_VAR = "TUNEFLEET_TOKEN_FILE"
DB_PASSWORD_FILE_ENV_VAR = "TUNEFLEET_DB_PASSWORD_FILE"


def tuner_settings() -> Settings:
    """The tuner's settings over the current environment and its config file (read when first needed)."""
    return Settings("tuner")


def db_setting(cli_value: str | None, settings: Settings | None = None) -> Resolved:
    """The tuning log's database as given (flag, ``$TUNEFLEET_DB`` or the file; blank values are
    not given), with its source; the value is ``None`` for the default SQLite file."""
    return (settings or tuner_settings()).resolve("db", (cli_value or "").strip() or None)


def default_db_path() -> Path:
    """``$XDG_DATA_HOME/tunefleet/tuning.db``, or ``~/.local/share/tunefleet/tuning.db``.

    A relative ``XDG_DATA_HOME`` is ignored, as the XDG base-directory specification requires.
    """
    xdg = os.environ.get("XDG_DATA_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".local" / "share"
    return base / "tunefleet" / "tuning.db"


def resolve_db_url(cli_value: str | None, *, create_directory: bool = True, password_file: str | None = None) -> str:
    """The SQLAlchemy URL of the tuning log.

    ``cli_value`` wins when non-empty, then ``$TUNEFLEET_DB`` when non-empty, then
    :func:`default_db_path`. A value without ``://`` is a filesystem path and becomes a
    ``sqlite:///`` URL of its absolute form (``~`` expanded).

    With ``create_directory`` (commands that may create the log), the directory of the default
    SQLite file is created, so a first run works out of the box; an explicit SQLite file (argument
    or ``$TUNEFLEET_DB``) must be in an existing directory, so a mistyped path is refused instead of
    growing a directory tree. Applications that only read the log pass ``create_directory=False``:
    nothing is created or checked, and opening the log reports a missing file.

    A database server URL without a password takes it from ``password_file`` (the daemon's
    ``--db-password-file``) or else from the file ``$TUNEFLEET_DB_PASSWORD_FILE`` names, so the
    password is in no command line or environment. The environment's file is ignored for SQLite and
    for a URL that has a password; ``password_file`` is refused there. libpq's own ``PGPASSFILE`` and
    ``PGPASSWORD`` keep working for PostgreSQL URLs without a password.

    Raises :class:`SettingsError` (one line). Whether a server URL works is for the tuning log to
    find out.
    """
    settings = tuner_settings()
    explicit = db_setting(cli_value, settings).value
    value = explicit or str(default_db_path())
    if "://" not in value:
        value = "sqlite:///" + str(Path(value).expanduser().absolute())
    if create_directory:
        if explicit:
            _require_sqlite_directory(value)
        else:
            _create_sqlite_directory(value)
    return _with_password_from_file(value, password_file, settings)


def _sqlite_file(url_text: str) -> Path | None:
    """The file of a file-backed SQLite URL, else ``None`` (servers, memory, URI filenames, bad URLs)."""
    try:
        url = make_url(url_text)
    except ArgumentError:
        return None  # not a URL SQLAlchemy understands: the tuning log reports it when opened
    if url.get_backend_name() != "sqlite":
        return None
    database = url.database or ""
    if not database or database == ":memory:" or database.startswith("file:") or url.query.get("uri"):
        return None
    return Path(database).expanduser().absolute()


def _require_sqlite_directory(url_text: str) -> None:
    path = _sqlite_file(url_text)
    if path is not None and not path.parent.is_dir():
        raise SettingsError(f"no directory {path.parent} for the tuning log: create it first "
                            "(only the default location is created automatically)")


def _create_sqlite_directory(url_text: str) -> None:
    path = _sqlite_file(url_text)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SettingsError(
            f"cannot create directory {path.parent} for the tuning log: {exc.strerror or exc}"
        ) from None


def _with_password_from_file(url_text: str, password_file: str | None, settings: Settings) -> str:
    source = (password_file or "").strip() or settings.resolve("db_password_file").value
    if not source:
        return url_text
    try:
        url = make_url(url_text)
    except ArgumentError:
        url = None
    is_server = url is not None and url.get_backend_name() != "sqlite"
    if not is_server or url.password is not None:
        if password_file:
            why = "it has a password already" if is_server else "it is not a database server URL"
            raise SettingsError(f"--db-password-file does not apply to the tuning log's URL: {why}")
        return url_text  # a file from the environment or config file is for server URLs that lack a password
    try:
        # Like the postgres image's *_FILE variables: the whole file, without its line end.
        password = Path(source).read_text().rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        raise SettingsError(f"cannot read the database password file {source}: "
                            f"{getattr(exc, 'strerror', None) or exc}") from None
    if not password:
        raise SettingsError(f"the database password file {source} is empty")
    # set() escapes what a URL cannot hold as is (@, /, :, %)
    return url.set(password=password).render_as_string(hide_password=False)


def resolve_token_file(cli_value: str | None) -> str | None:
    """The client token file: ``--token-file``, else ``$TUNEFLEET_TOKEN_FILE``, else ``[tuner]
    token_file`` of the config file, else none."""
    return tuner_settings().resolve("token_file", (cli_value or "").strip() or None).value

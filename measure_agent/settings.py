"""Settings of both command lines (``tuner`` and ``measure-agent``): a flag, else its environment
variable, else the config file, else the default; each resolved value says where it came from.

The config file is TOML, at ``$TUNEFLEET_CONFIG``, else ``$XDG_CONFIG_HOME/tunefleet/config.toml``,
else ``~/.config/tunefleet/config.toml``; a missing file at the default place is no file. Its schema::

    tracker = "tuner.example.internal:9190"   # the connection, for both programs
    tls_ca = "~/tunefleet-certs/ca.crt"        # also tls_cert, tls_key (mutual TLS)

    [tuner]                                    # the tuner only (it may also set the connection keys)
    token_file = "~/tunefleet-certs/client-token"
    db = "postgresql+psycopg://tuner@dbhost:5432/tunefleet"
    db_password_file = "~/tunefleet-certs/postgres-password"

    [agent]                                    # measure-agent only (it may also set the connection keys)
    token_file = "/etc/tunefleet/tls/agent-token"
    key = "jetson-orin"
    name = "orin-1"
    parallel = 2

Paths in the file may start with ``~`` and are relative to the file's directory. The agent and the
tuner have separate token settings: an agent token is not a client token. Unknown keys, wrong types
and invalid TOML are refused with one line naming the file and the key.

This module is the one place settings are read from the environment for the agent; the tuner's
``tuner/settings.py`` builds on it. It imports no more than the standard library and the agent's
argument types, so the agent stays light.
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from measure_agent.arguments import INT32_MAX, device_key_type, int_range, tracker_type

CONFIG_ENV_VAR = "TUNEFLEET_CONFIG"
PROGRAMS = ("tuner", "agent")  # the file's tables
DEFAULT_SOURCE = "default"


class SettingsError(ValueError):
    """A setting that cannot be used as given (one-line message naming where it came from)."""


def _text(value: str) -> str:
    return value


@dataclass(frozen=True)
class Setting:
    """One setting: its key in the config file, its environment variable and flag, and the argparse
    type that checks it (flag, environment and file values are checked alike)."""

    name: str
    env: str
    flag: str
    help: str
    parse: Callable[[str], Any] = _text
    path: bool = False  # a file path (or, for db, a path unless it is a URL)
    integer: bool = False  # an integer in the file; text otherwise
    default: Any = None


@dataclass(frozen=True)
class Resolved:
    """A setting's effective value and its source: ``flag --x``, ``env NAME``, ``file PATH`` or ``default``."""

    setting: Setting
    value: Any
    source: str

    @property
    def name(self) -> str:
        return self.setting.name


CONNECTION = (
    Setting("tracker", "TUNEFLEET_TRACKER", "--tracker", "the daemon, HOST:PORT (a leader and its standbys: "
            "HOST:PORT,HOST:PORT)", parse=tracker_type),
    Setting("tls_ca", "TUNEFLEET_TLS_CA", "--tls-ca", "CA certificate that signed the daemon's", path=True),
    Setting("tls_cert", "TUNEFLEET_TLS_CERT", "--tls-cert", "client certificate (mutual TLS)", path=True),
    Setting("tls_key", "TUNEFLEET_TLS_KEY", "--tls-key", "key of the client certificate", path=True),
)
AGENT = CONNECTION + (
    Setting("token_file", "TUNEFLEET_AGENT_TOKEN_FILE", "--token-file", "file holding the agent token", path=True),
    Setting("key", "TUNEFLEET_AGENT_KEY", "--key", "device key to join under", parse=device_key_type),
    Setting("name", "TUNEFLEET_AGENT_NAME", "--name", "this agent's name (default: the host name)"),
    Setting("parallel", "TUNEFLEET_AGENT_PARALLEL", "--parallel", "candidates built at once",
            parse=int_range(1, INT32_MAX), integer=True, default=1),
)
TUNER = CONNECTION + (
    Setting("token_file", "TUNEFLEET_TOKEN_FILE", "--token-file", "file holding the client token", path=True),
    Setting("db", "TUNEFLEET_DB", "--db", "the tuning log: database URL or SQLite file", path=True),
    Setting("db_password_file", "TUNEFLEET_DB_PASSWORD_FILE", "--db-password-file",
            "password of a database server URL that has none", path=True),
)
SCHEMA: dict[str, tuple[Setting, ...]] = {"tuner": TUNER, "agent": AGENT}


def default_config_path(environ: Mapping[str, str] | None = None) -> Path:
    """``$TUNEFLEET_CONFIG``, else ``$XDG_CONFIG_HOME/tunefleet/config.toml``, else
    ``~/.config/tunefleet/config.toml`` (a relative ``XDG_CONFIG_HOME`` is ignored, as XDG requires)."""
    environ = os.environ if environ is None else environ
    explicit = environ.get(CONFIG_ENV_VAR, "").strip()
    if explicit:
        return Path(explicit).expanduser()
    xdg = environ.get("XDG_CONFIG_HOME", "")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".config"
    return base / "tunefleet" / "config.toml"


@dataclass(frozen=True)
class ConfigFile:
    """A checked config file: top-level connection keys and the ``[tuner]``/``[agent]`` tables."""

    path: Path
    data: Mapping[str, Any]

    def value(self, program: str, setting: Setting) -> Any:
        """The file's value of ``setting`` for ``program`` (its table first), or ``None``."""
        value = self.data.get(program, {}).get(setting.name)
        if value is None and setting in CONNECTION:
            value = self.data.get(setting.name)
        if value is None:
            return None
        if setting.path and not (setting.name == "db" and "://" in value):
            value = str(self.path.parent / Path(value).expanduser())  # an absolute path stays as it is
        return value


def load_config(path: Path, *, must_exist: bool = False) -> ConfigFile:
    """Read and check the config file at ``path``; a missing file is an empty one unless ``must_exist``.

    Raises :class:`SettingsError`: invalid TOML, an unknown key, a value of the wrong type.
    """
    try:
        text = path.read_bytes()
    except FileNotFoundError:
        if must_exist:
            raise SettingsError(f"no config file {path} (named by ${CONFIG_ENV_VAR})") from None
        return ConfigFile(path, {})
    except OSError as exc:
        raise SettingsError(f"cannot read the config file {path}: {exc.strerror or exc}") from None
    tomllib = _toml_reader(path)
    try:
        data = tomllib.loads(text.decode("utf-8"))
    except UnicodeDecodeError:
        raise SettingsError(f"{path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path}: not valid TOML: {exc}") from None
    _check_table(path, data, "", {s.name: s for s in CONNECTION}, tables=PROGRAMS)
    for program in PROGRAMS:
        if program in data:
            if not isinstance(data[program], dict):
                raise SettingsError(f"{path}: {program} must be a table ([{program}])")
            _check_table(path, data[program], f"{program}.", {s.name: s for s in SCHEMA[program]}, tables=())
    return ConfigFile(path, data)


def _toml_reader(path: Path):
    """tomllib (Python 3.11+), else tomli: imported only when there is a file, since an agent on
    Python 3.10 installed with ``--no-deps`` may lack tomli and need no file."""
    if sys.version_info >= (3, 11):
        import tomllib

        return tomllib
    try:  # pragma: no cover - Python 3.10
        import tomli

        return tomli
    except ImportError:  # pragma: no cover
        raise SettingsError(f"{path}: reading a config file on Python 3.10 needs tomli (pip install tomli)") from None


def _check_table(path: Path, table: dict, prefix: str, known: dict[str, Setting], tables: tuple[str, ...]) -> None:
    for name, value in table.items():
        if name in tables:
            continue
        setting = known.get(name)
        if setting is None:
            names = ", ".join([*known, *(f"[{t}]" for t in tables)])
            raise SettingsError(f"{path}: unknown key {prefix}{name} (known here: {names})")
        if setting.integer:
            if not isinstance(value, int) or isinstance(value, bool):
                raise SettingsError(f"{path}: {prefix}{name} must be an integer, not {type(value).__name__}")
        elif not isinstance(value, str):
            raise SettingsError(f"{path}: {prefix}{name} must be a string, not {type(value).__name__}")


class Settings:
    """The settings of one program (``"tuner"`` or ``"agent"``) over an environment and a config file.

    The file is read on first use, so commands that need no setting never read it.
    """

    def __init__(self, program: str, environ: Mapping[str, str] | None = None,
                 config_path: Path | None = None) -> None:
        if program not in SCHEMA:
            raise ValueError(f"unknown program {program!r}")
        self.program = program
        self.environ = os.environ if environ is None else environ
        self._explicit_path = config_path is not None or bool(self.environ.get(CONFIG_ENV_VAR, "").strip())
        self.config_path = config_path or default_config_path(self.environ)
        self._config: ConfigFile | None = None
        self.by_name = {s.name: s for s in SCHEMA[program]}

    @property
    def config(self) -> ConfigFile:
        if self._config is None:
            self._config = load_config(self.config_path, must_exist=self._explicit_path)
        return self._config

    def resolve(self, name: str, flag_value: Any = None) -> Resolved:
        """``flag_value`` when given (not ``None`` or empty), else the environment, else the file,
        else the default. Environment and file values are checked with the setting's type."""
        setting = self.by_name[name]
        if flag_value is not None and flag_value != "":
            return Resolved(setting, flag_value, f"flag {setting.flag}")
        env_value = self.environ.get(setting.env, "").strip()
        if env_value:
            return Resolved(setting, self._parsed(setting, env_value, setting.env), f"env {setting.env}")
        file_value = self.config.value(self.program, setting)
        if file_value is not None:
            where = f"{self.config.path}: {'' if setting in CONNECTION else self.program + '.'}{name}"
            return Resolved(setting, self._parsed(setting, str(file_value), where), f"file {self.config.path}")
        return Resolved(setting, setting.default, DEFAULT_SOURCE)

    def resolve_all(self, flag_values: Mapping[str, Any] | None = None) -> list[Resolved]:
        return [self.resolve(name, (flag_values or {}).get(name)) for name in self.by_name]

    def missing(self, name: str) -> str:
        """How to give a setting that has no value (for a one-line error)."""
        setting = self.by_name[name]
        key = name if setting in CONNECTION else f"{self.program}.{name}"
        return f"give {setting.flag}, or set {setting.env} or {key} in {self.config_path}"

    @staticmethod
    def _parsed(setting: Setting, text: str, where: str) -> Any:
        try:
            return setting.parse(text)
        except (argparse.ArgumentTypeError, ValueError) as exc:
            raise SettingsError(f"{where}: {exc}") from None


# -- the argparse layer ------------------------------------------------------------------------------
_DECLARED = "settings_declared"
_REQUIRED = "settings_required"
SOURCES = "setting_sources"  # the Namespace attribute: {setting name: source}


def declare(parser: argparse.ArgumentParser, *names: str, required: tuple[str, ...] = ()) -> None:
    """Mark flags of ``parser`` (dest = setting name) as taking their default from the settings;
    ``required`` ones must then have a value from somewhere. Flags keep ``default=None``."""
    declared = tuple(parser.get_default(_DECLARED) or ())
    needed = tuple(parser.get_default(_REQUIRED) or ())
    parser.set_defaults(**{_DECLARED: declared + tuple(n for n in names if n not in declared),
                           _REQUIRED: needed + tuple(required)})


def apply(args: argparse.Namespace, settings: Settings) -> argparse.Namespace:
    """Fill the declared flags of the parsed command that were not given from the environment and the
    config file, record each one's source in ``args.setting_sources``, and check the required ones.

    Raises :class:`SettingsError` (one line).
    """
    sources = {}
    for name in getattr(args, _DECLARED, ()) or ():
        resolved = settings.resolve(name, getattr(args, name, None))
        setattr(args, name, resolved.value)
        sources[name] = resolved.source
    setattr(args, SOURCES, sources)
    for name in getattr(args, _REQUIRED, ()) or ():
        if getattr(args, name, None) is None:
            raise SettingsError(f"no {name}: {settings.missing(name)}")
    return args


def source_of(args: argparse.Namespace, name: str) -> str:
    """Where the value of a declared setting in ``args`` came from (``default`` when unknown)."""
    return getattr(args, SOURCES, {}).get(name, DEFAULT_SOURCE)

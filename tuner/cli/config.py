"""``tuner config``: the effective settings and where each came from (flag, environment, file, default)."""

from __future__ import annotations

import argparse
import json

from measure_agent.settings import DEFAULT_SOURCE, TUNER, Resolved, Settings
from tuner.cli.common import CliError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "config", help="show the effective settings (tracker, TLS, token file, database) and where each came from",
        description="Each setting comes from its flag, else its environment variable, else the config file "
                    "($TUNEFLEET_CONFIG, $XDG_CONFIG_HOME/tunefleet/config.toml or ~/.config/tunefleet/config.toml), "
                    "else its default. Token and password files are shown by path, never their contents.")
    # The flags of every setting, undeclared: this command resolves them itself, to show each source.
    for setting in TUNER:
        p.add_argument(setting.flag, type=setting.parse, metavar=setting.name.upper(), help=setting.help)
    p.add_argument("--agent", action="store_true",
                   help="show what measure-agent on this host would use instead (environment and file only)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from tuner.settings import SettingsError, default_db_path

    program = "agent" if args.agent else "tuner"
    settings = Settings(program)
    try:
        if args.agent:
            rows = settings.resolve_all()
        else:
            flags = {name: getattr(args, name) for name in settings.by_name}
            rows = [_shown(r, default_db_path) for r in settings.resolve_all(flags)]
        exists = settings.config_path.is_file()
    except SettingsError as exc:
        raise CliError(str(exc)) from None
    if args.json:
        print(json.dumps({
            "program": program, "config_file": str(settings.config_path), "config_file_exists": exists,
            "settings": {r.name: {"value": r.value, "source": r.source, "env": r.setting.env, "flag": r.setting.flag}
                         for r in rows},
        }, sort_keys=True))
        return 0
    print(f"{'measure-agent' if args.agent else 'tuner'} settings; config file {settings.config_path}"
          f"{'' if exists else ' (none there)'}")
    width = max(len(r.name) for r in rows)
    for r in rows:
        value = "(none)" if r.value is None else str(r.value)
        print(f"  {r.name:<{width}}  {value}  [{r.source}]")
    return 0


def _shown(resolved: Resolved, default_db_path) -> Resolved:
    """What the tuner shows of a setting: the default database's file, a URL without its password."""
    if resolved.name != "db":
        return resolved
    if resolved.value is None:
        return Resolved(resolved.setting, str(default_db_path()), DEFAULT_SOURCE)
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        url = make_url(resolved.value)
    except ArgumentError:
        return resolved  # a file path
    return Resolved(resolved.setting, url.render_as_string(hide_password=True), resolved.source)

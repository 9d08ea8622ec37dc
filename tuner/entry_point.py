"""The ``tuner`` console script (and ``python -m tuner``): the tuner side's dependencies are the
``server`` extra, absent from an agent's plain ``pip install tunefleet``, so a missing one is named
in one line with the command that installs it instead of an ImportError traceback mid-command."""

from __future__ import annotations

import importlib.util
import sys

# Top-level modules of the server extra (pyproject.toml), with the distribution that provides each.
SERVER_MODULES = {
    "xgboost": "xgboost",
    "sqlalchemy": "SQLAlchemy",
    "alembic": "alembic",
    "rich": "rich",
    "grpc_health": "grpcio-health-checking",
    "prometheus_client": "prometheus-client",
}
INSTALL_SERVER = "pip install 'tunefleet[server]'"


def missing_server_modules() -> list[str]:
    """The distributions of the server extra whose module cannot be found (none imported)."""
    missing = []
    for module, distribution in SERVER_MODULES.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except ImportError:  # a package that is broken or refused counts as absent
            found = False
        if not found:
            missing.append(distribution)
    return missing


def server_extra_message(missing: list[str]) -> str:
    return f"tuner: error: the tuner needs the server extra ({', '.join(missing)} not installed): {INSTALL_SERVER}"


def main(argv: list[str] | None = None) -> int:
    missing = missing_server_modules()
    if missing:
        print(server_extra_message(missing), file=sys.stderr)
        return 1
    from tuner.cli import main as tuner_main

    return tuner_main(argv)

"""``tuner dashboard``: the web dashboard over any tuning log, no daemon needed; and the
``--http-listen`` options the daemon shares with it (one app, see :mod:`tuner.dashboard`)."""

from __future__ import annotations

import argparse
import threading

from tuner.cli.common import EXIT_FAILURE, CliError, add_db_arguments, listen_address, open_log

DESCRIPTION = (
    "Serve the web dashboard of a tuning log (SQLite file or PostgreSQL): jobs, convergence plots, trials, "
    "workloads per device, kernel sources; pages refresh themselves. It only reads the log, so it runs beside "
    "a daemon or on a copy of its log. For live fleet state (agents, leases, cancel) serve it from the daemon "
    "instead: tuner daemon --http-listen HOST:PORT. JSON API: docs/dashboard.md."
)


def register(subparsers) -> None:
    p = subparsers.add_parser("dashboard", help="serve the web dashboard of a tuning log (no daemon needed)",
                              description=DESCRIPTION)
    p.add_argument("--listen", type=listen_address, default="127.0.0.1:8080", metavar="HOST:PORT",
                   help="address to serve on (default 127.0.0.1:8080); beyond loopback --client-token-file is "
                        "required")
    add_tls_arguments(p)
    add_model_argument(p, "--model")
    add_db_arguments(p, device=False)
    p.set_defaults(func=run)


def add_tls_arguments(p: argparse.ArgumentParser) -> None:
    """TLS and token options of ``tuner dashboard`` (the daemon's own --tls-cert, --tls-key and
    --client-token-file serve its --http-listen too)."""
    p.add_argument("--tls-cert", metavar="PEM", help="serve HTTPS with this certificate (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    p.add_argument("--client-token-file", metavar="FILE",
                   help="cancelling needs a token from this file (reading needs none); required beyond loopback")


def add_model_argument(p: argparse.ArgumentParser, flag: str) -> None:
    p.add_argument(flag, action="append", default=[], metavar="MODEL.onnx", dest="dashboard_models",
                   help="show this ONNX model's tune-model run on a model page (repeatable; needs the onnx package)")


def load_models(paths: list[str]) -> list:
    """The tasks of each model, read once at start (one line on a bad file or a missing onnx)."""
    from tuner.graph import ModelError, extract_tasks

    try:
        return [extract_tasks(path) for path in paths]
    except ModelError as exc:
        raise CliError(str(exc)) from None


def dashboard_access(listen: str, client_tokens: tuple[str, ...], tls: bool):
    """The access rules for serving on ``listen``, or :class:`CliError` why it may not; returns
    (access, warnings)."""
    from tuner.daemon.security import is_loopback
    from tuner.dashboard.app import DashboardAccess
    from tuner.dashboard.server import LOOPBACK_HOSTS

    if is_loopback(listen):
        return DashboardAccess(client_tokens, allowed_hosts=LOOPBACK_HOSTS), []
    if not client_tokens:
        raise CliError(f"refusing to serve the dashboard on {listen} beyond loopback without --client-token-file "
                       "(anyone who reaches the port could cancel jobs): give one, or listen on 127.0.0.1")
    warnings = [] if tls else [f"dashboard on {listen} without TLS: the client token crosses the network in clear "
                               "text; add --tls-cert and --tls-key"]
    return DashboardAccess(client_tokens), warnings


def start_server(app, listen: str, tls_cert: str | None, tls_key: str | None):
    from tuner.dashboard.server import DashboardServer

    try:
        return DashboardServer(app, listen, tls_cert=tls_cert, tls_key=tls_key).start()
    except (OSError, ValueError) as exc:
        raise CliError(f"cannot serve the dashboard on {listen}: {exc}", EXIT_FAILURE) from None


def check_installed() -> None:
    import importlib

    try:
        for name in ("starlette", "jinja2", "uvicorn"):
            importlib.import_module(name)
    except ImportError as exc:
        from tuner.dashboard import DASHBOARD_INSTALL_HINT

        raise CliError(f"the dashboard needs {exc.name}, which is not installed: {DASHBOARD_INSTALL_HINT}",
                       EXIT_FAILURE) from None


def run(args: argparse.Namespace) -> int:
    import sys

    from measure_agent.protocol.connection import CredentialsError, read_tokens
    from tuner.daemon.security import check_tls_files

    check_installed()
    try:
        check_tls_files(args.tls_cert, args.tls_key, None)
        tokens = read_tokens(args.client_token_file) if args.client_token_file else ()
    except (CredentialsError, ValueError) as exc:
        raise CliError(str(exc)) from None
    access, warnings = dashboard_access(args.listen, tokens, bool(args.tls_cert))
    models = load_models(args.dashboard_models)
    for warning in warnings:
        print(f"tuner: warning: {warning}", file=sys.stderr)
    from measure_agent.signals import call_on_signals, wait_for_stop
    from tuner.dashboard.app import create_app

    stop = threading.Event()
    call_on_signals(stop.set)
    with open_log(args.db, existing=True) as log:
        server = start_server(create_app(log, access=access, models=models), args.listen, args.tls_cert, args.tls_key)
        print(f"tunefleet dashboard of {log.url} at {server.url}/ (Ctrl-C stops it)", flush=True)
        wait_for_stop(stop)
        server.stop()
    return 0

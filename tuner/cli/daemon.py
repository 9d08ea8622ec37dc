"""``tuner daemon``: run the tune-cluster daemon.

On a PostgreSQL log several daemons may run: one leads, the others stand by and take over when it
dies (:mod:`tuner.daemon.leadership`). A SQLite log holds one daemon; a second is refused.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading

from tuner.cli.common import EXIT_FAILURE, CliError, add_db_arguments, listen_address, open_log, positive_float

# A leader that lost its lease to another daemon exits with this code (EX_TEMPFAIL): restarted, it
# comes back as a standby. systemd's Restart=on-failure and Kubernetes restart it.
EXIT_DEPOSED = 75


def register(subparsers) -> None:
    p = subparsers.add_parser("daemon", help="run the tune-cluster daemon (agents and clients connect to it)")
    p.add_argument("--listen", type=listen_address, default="0.0.0.0:9190", metavar="HOST:PORT",
                   help="address to listen on (default 0.0.0.0:9190); beyond loopback, --client-token-file and "
                        "--agent-token-file are required (or --insecure)")
    p.add_argument("--heartbeat-interval", type=positive_float, default=2.0, help="seconds between agent heartbeats")
    p.add_argument("--agent-timeout", type=positive_float, default=10.0,
                   help="an agent silent this long is presumed dead and its leases go to others (default 10 s)")
    p.add_argument("--tls-cert", metavar="PEM", help="serve TLS with this certificate (with --tls-key)")
    p.add_argument("--tls-key", metavar="PEM", help="private key of --tls-cert")
    p.add_argument("--tls-client-ca", metavar="PEM", help="require client certificates signed by this CA (of agents and clients)")
    p.add_argument("--agent-token-file", metavar="FILE", help="agents must present a token from this file")
    p.add_argument("--client-token-file", metavar="FILE", help="clients must present a token from this file")
    p.add_argument("--insecure", action="store_true",
                   help="allow listening beyond loopback without --client-token-file and --agent-token-file "
                        "(anyone who reaches the port can submit jobs or join as an agent)")
    p.add_argument("--metrics-listen", type=listen_address, metavar="HOST:PORT",
                   help="serve Prometheus metrics at http://HOST:PORT/metrics (plain HTTP without tokens: "
                        "keep it on loopback or a private network)")
    p.add_argument("--advertise", type=listen_address, metavar="HOST:PORT",
                   help="where clients and agents reach this daemon when it leads, told to them by standbys "
                        "(default: --listen, with this host's name for 0.0.0.0)")
    p.add_argument("--lease-ttl", type=positive_float, default=5.0, metavar="S",
                   help="PostgreSQL logs: the leader's lease lasts this long unrenewed; a standby takes over "
                        "within it plus 1 s of a leader's death (default 5)")
    p.add_argument("--http-listen", type=listen_address, metavar="HOST:PORT",
                   help="also serve the web dashboard with live fleet state at http(s)://HOST:PORT/ (the daemon's "
                        "--tls-cert/--tls-key and --client-token-file apply; beyond loopback the token file is "
                        "required). Needs pip install 'tunefleet[dashboard]'")
    from tuner.cli.dashboard import add_model_argument

    add_model_argument(p, "--dashboard-model")
    p.add_argument("--agents-on-this-host", action="store_true",
                   help="the agents run on this daemon's host: jobs of CPU kernels propose their next batch only "
                        "between batches, so that the tuner's work never shares the CPU with a kernel being timed")
    p.add_argument("--log-format", choices=("text", "json"), default="text", help="log lines as text or JSON objects")
    p.add_argument("--templates", default="default", choices=("default", "testing"), help=argparse.SUPPRESS)
    add_db_arguments(p, device=False)
    p.add_argument("--db-password-file", metavar="FILE",
                   help="password of a database server URL that has none (default: $TUNEFLEET_DB_PASSWORD_FILE; "
                        "libpq's PGPASSFILE also works)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from measure_agent.signals import call_on_signals, wait_for_stop
    from measure_agent.templates import load_catalog
    from tuner.daemon import Daemon

    from tuner.daemon.observability import JsonLogFormatter, MetricsServer

    handler = logging.StreamHandler()
    handler.setFormatter(JsonLogFormatter() if args.log_format == "json"
                         else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.getLogger("alembic").setLevel(logging.WARNING)
    stop = threading.Event()
    call_on_signals(stop.set)
    from measure_agent.protocol.connection import read_tokens
    from tuner.daemon.daemon import Security
    from tuner.daemon.security import check_tls_files, exposure_policy
    from tuner.settings import SettingsError, resolve_db_url

    try:
        check_tls_files(args.tls_cert, args.tls_key, args.tls_client_ca)
        security = Security(
            tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca,
            agent_tokens=read_tokens(args.agent_token_file) if args.agent_token_file else (),
            client_tokens=read_tokens(args.client_token_file) if args.client_token_file else (),
        )
    except ValueError as exc:
        raise CliError(str(exc)) from None
    # An address that cannot be bound says so first; then whether it may be listened on.
    _check_can_bind(args.listen)
    refusal, warnings = exposure_policy(args.listen, agent_tokens=bool(security.agent_tokens),
                                        client_tokens=bool(security.client_tokens), tls=bool(security.tls_cert),
                                        insecure=args.insecure)
    if refusal:
        raise CliError(refusal)
    for warning in warnings:
        logging.getLogger("tunefleet.daemon").warning("%s", warning)
    db = args.db
    if args.db_password_file:
        try:
            db = resolve_db_url(args.db, password_file=args.db_password_file)
        except SettingsError as exc:
            raise CliError(str(exc), EXIT_FAILURE) from None
    deposed = threading.Event()

    def on_deposed() -> None:
        deposed.set()
        stop.set()

    with open_log(db) as log:
        single = _single_daemon_lock(log)
        try:
            daemon = Daemon(log, args.listen, catalog=load_catalog(args.templates),
                            heartbeat_interval_s=args.heartbeat_interval, agent_timeout_s=args.agent_timeout,
                            security=security, leadership=single is None, advertise=args.advertise,
                            lease_ttl_s=args.lease_ttl, on_deposed=on_deposed,
                            agents_share_host=args.agents_on_this_host)
        except (OSError, RuntimeError, ValueError) as exc:
            raise CliError(f"cannot start the daemon on {args.listen}: {exc}", EXIT_FAILURE) from None
        daemon.start()
        metrics = None
        if args.metrics_listen:
            try:
                metrics = MetricsServer(args.metrics_listen, daemon).start()
            except (OSError, ValueError) as exc:
                daemon.stop()
                raise CliError(f"cannot serve metrics on {args.metrics_listen}: {exc}", EXIT_FAILURE) from None
        dashboard = None
        if args.http_listen:
            try:
                dashboard = _start_dashboard(args, daemon, log, security)
            except CliError:
                if metrics:
                    metrics.stop()
                daemon.stop()
                raise
        print(f"tunefleet daemon listening on {daemon.address}"
              + (f", metrics on port {metrics.port}" if metrics else "")
              + (f", dashboard at {dashboard.url}/" if dashboard else ""), flush=True)
        wait_for_stop(stop)
        if dashboard:
            dashboard.stop()
        if metrics:
            metrics.stop()
        daemon.stop()
        if single is not None:
            single.release()
    if deposed.is_set():
        print("tuner daemon: deposed: another daemon leads this tuning log now; restart to stand by",
              file=sys.stderr)
        return EXIT_DEPOSED
    return 0


def _single_daemon_lock(log):
    """A SQLite log's one-daemon lock, held (a second daemon is refused, one line); ``None`` for a
    server log, where several daemons share leadership instead."""
    from tuner.log import TuningLogError
    from tuner.log.leadership import SingleDaemonLock
    from tuner.log.migrate import sqlite_path

    if log.engine.dialect.name == "postgresql":
        return None
    path = sqlite_path(log.url)
    if path is None:
        raise CliError("the daemon needs a SQLite file or a PostgreSQL server for its tuning log", EXIT_FAILURE)
    lock = SingleDaemonLock(path.absolute())
    try:
        lock.acquire()
    except TuningLogError as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None
    return lock
def _start_dashboard(args: argparse.Namespace, daemon, log, security):
    """The dashboard app with the daemon's live state, served from a thread (see tuner/cli/dashboard.py)."""
    from tuner.cli.dashboard import check_installed, dashboard_access, load_models, start_server

    check_installed()
    access, warnings = dashboard_access(args.http_listen, security.client_tokens, bool(security.tls_cert))
    models = load_models(args.dashboard_models)
    for warning in warnings:
        logging.getLogger("tunefleet.daemon").warning("%s", warning)
    from tuner.dashboard.app import create_app

    app = create_app(log, live=daemon.fleet_state, catalog=daemon.catalog, access=access, models=models)
    return start_server(app, args.http_listen, security.tls_cert, security.tls_key)


def _check_can_bind(address: str) -> None:
    """gRPC says why it cannot bind only in a log line of its C core: try the address first for a one-line reason."""
    import socket

    host, _, port = address.rpartition(":")
    try:
        family, kind, proto, _, sockaddr = socket.getaddrinfo(host.strip("[]"), int(port), type=socket.SOCK_STREAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(sockaddr)
    except OSError as exc:
        raise CliError(f"cannot start the daemon on {address}: {exc.strerror or exc}", EXIT_FAILURE) from None

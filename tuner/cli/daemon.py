"""``tuner daemon``: run the tune-cluster daemon."""

from __future__ import annotations

import argparse
import logging
import signal
import threading

from tuner.cli.common import add_db_arguments, open_log, positive_float


def register(subparsers) -> None:
    p = subparsers.add_parser("daemon", help="run the tune-cluster daemon (agents and clients connect to it)")
    p.add_argument("--listen", default="0.0.0.0:9190", metavar="HOST:PORT", help="address to listen on (default 0.0.0.0:9190)")
    p.add_argument("--heartbeat-interval", type=positive_float, default=2.0, help="seconds between agent heartbeats")
    p.add_argument("--agent-timeout", type=positive_float, default=10.0,
                   help="an agent silent this long is presumed dead and its leases go to others (default 10 s)")
    p.add_argument("--templates", default="default", choices=("default", "testing"), help=argparse.SUPPRESS)
    add_db_arguments(p, device=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from measure_agent.templates import load_catalog
    from tuner.cli.common import CliError
    from tuner.daemon import Daemon

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with open_log(args.db) as log:
        try:
            daemon = Daemon(log, args.listen, catalog=load_catalog(args.templates),
                            heartbeat_interval_s=args.heartbeat_interval, agent_timeout_s=args.agent_timeout)
        except (OSError, RuntimeError, ValueError) as exc:
            raise CliError(f"cannot start the daemon on {args.listen}: {exc}", 1) from None
        daemon.start()
        print(f"tunefleet daemon listening on {daemon.address}", flush=True)
        stop.wait()
        daemon.stop()
    return 0

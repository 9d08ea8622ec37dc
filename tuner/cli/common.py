"""Pieces every ``tuner`` command shares: errors, argument types, the log, the workload."""

from __future__ import annotations

import argparse
import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from measure_agent.arguments import (  # noqa: F401 - the float types are for the commands
    INT32_MAX,
    INT32_MIN,
    INT64_MAX,
    host_port_type,
    int_range,
    non_negative_float,
    positive_float,
    share_fraction,
    tracker_type,
)
from measure_agent import settings
from measure_agent.workload import Workload, WorkloadError, parse_workload

if TYPE_CHECKING:
    from tuner.log import TuningLog

EXIT_USAGE = 2
EXIT_FAILURE = 1

WORKLOAD_HELP = ("workload as OP(NAME=SIZE,...[,dtype=float32|float64]), e.g. 'matmul(M=512,N=512,K=512)', "
                 "or compact, e.g. matmul_512x512x512 (see tuner --help)")


class CliError(Exception):
    """A user-facing error: printed as one line, exit code ``code``."""

    def __init__(self, message: str, code: int = EXIT_USAGE) -> None:
        super().__init__(message)
        self.code = code


def cannot_write(path: str, exc: OSError) -> CliError:
    """The one-line failure for an output file that could not be written."""
    return CliError(f"cannot write {path}: {exc.strerror or exc}", EXIT_FAILURE)


def workload_arg(text: str) -> Workload:
    try:
        return parse_workload(text)
    except WorkloadError as exc:
        raise CliError(str(exc)) from None


@contextmanager
def open_log(db: str | None, existing: bool = False) -> Iterator["TuningLog"]:
    """The tuning log, created (and migrated) when new; ``existing``: commands that only read
    (or prune) it refuse a log that does not exist instead of creating an empty one at a mistyped path."""
    from tuner.log import TuningLog, TuningLogError
    from tuner.log.migrate import sqlite_path
    from tuner.settings import SettingsError, resolve_db_url

    try:
        url = resolve_db_url(db, create_directory=not existing)
        path = sqlite_path(url)
        if existing and path is not None and not path.exists():
            raise CliError(f"no tuning log at {path}: nothing was tuned into it (give --db or set TUNEFLEET_DB "
                           "to the log you tuned with)", EXIT_FAILURE)
        log = TuningLog(url, create=not existing)
    except (TuningLogError, SettingsError) as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None
    try:
        yield log
    except TuningLogError as exc:  # a database that fails or holds a corrupt row mid-command
        raise CliError(str(exc), EXIT_FAILURE) from None
    finally:
        log.close()


def local_device_key() -> str:
    from measure_agent.device import detect_device

    return detect_device().default_key


def add_db_arguments(parser: argparse.ArgumentParser, device: bool = True) -> None:
    parser.add_argument("--db", help="database URL or SQLite file (default: $TUNEFLEET_DB, the config file, or the "
                                     "per-user SQLite log)")
    if device:
        parser.add_argument("--device-key", help="device key (default: this host's key)")


positive_int = int_range(1, INT64_MAX)  # ids, counts and limits (SQLite and protobuf int64)
non_negative_int = int_range(0, INT64_MAX)  # seeds, --keep-best
positive_int32 = int_range(1, INT32_MAX)  # what a JobSpec or Timing carries as int32: trials, number, ...
int32 = int_range(INT32_MIN, INT32_MAX)  # --priority
tracker_address = tracker_type  # a daemon, or a leader and its standbys
listen_address = host_port_type(lowest_port=0)  # port 0: any free port


LOCAL_UNLESS_RPC_KEY = "tracker_only_with_rpc_key"


def add_tracker_argument(parser: argparse.ArgumentParser, help: str, *, required: bool = False,
                         local_unless_rpc_key: bool = False) -> None:
    """``--tracker``, defaulting to ``$TUNEFLEET_TRACKER`` and then the config file (``tuner config``).

    ``local_unless_rpc_key``: commands that measure on this host without a daemon (``tune``,
    ``tune-model``, ``verify``) use a configured tracker only with ``--rpc-key``; a ``--tracker``
    flag is always used.
    """
    parser.add_argument("--tracker", type=tracker_address, metavar="HOST:PORT",
                        help=f"{help} (default: $TUNEFLEET_TRACKER, then the config file)")
    settings.declare(parser, "tracker", required=("tracker",) if required else ())
    if local_unless_rpc_key:
        parser.set_defaults(**{LOCAL_UNLESS_RPC_KEY: True})


def add_client_security_arguments(parser: argparse.ArgumentParser) -> None:
    """How a client reaches a secured daemon; each defaults to its environment variable, then the config file."""
    parser.add_argument("--token-file", metavar="FILE",
                        help="client token (default: $TUNEFLEET_TOKEN_FILE); needed when the daemon requires one")
    parser.add_argument("--tls-ca", metavar="PEM",
                        help="CA certificate to trust the daemon's TLS certificate (default: $TUNEFLEET_TLS_CA)")
    parser.add_argument("--tls-cert", metavar="PEM",
                        help="client certificate, when the daemon requires one (default: $TUNEFLEET_TLS_CERT)")
    parser.add_argument("--tls-key", metavar="PEM", help="key of the client certificate (default: $TUNEFLEET_TLS_KEY)")
    settings.declare(parser, "token_file", "tls_ca", "tls_cert", "tls_key")


def apply_settings(args: argparse.Namespace) -> None:
    """Fill the connection flags a command declared (:func:`add_tracker_argument`,
    :func:`add_client_security_arguments`) that were not given, from the environment and the config
    file: the one place the tuner's commands get these defaults. Bad settings are a usage error."""
    if not getattr(args, "settings_declared", ()):
        return  # commands without connection flags do not read the config file
    from tuner.settings import tuner_settings

    try:
        settings.apply(args, tuner_settings())
    except settings.SettingsError as exc:
        raise CliError(str(exc)) from None
    if getattr(args, LOCAL_UNLESS_RPC_KEY, False) and not args.rpc_key \
            and not settings.source_of(args, "tracker").startswith("flag"):
        args.tracker = None  # a configured daemon is for runs with --rpc-key; without it, this host measures


def _credentials(args: argparse.Namespace):
    """(token, TLS files) of a client from ``--token-file``/``$TUNEFLEET_TOKEN_FILE`` and ``--tls-*``."""
    from measure_agent.protocol.connection import CredentialsError, TlsFiles, read_tokens
    from tuner.settings import resolve_token_file

    try:
        token_file = resolve_token_file(getattr(args, "token_file", None))
        token = read_tokens(token_file)[0] if token_file else None
    except CredentialsError as exc:
        raise CliError(str(exc)) from None
    return token, TlsFiles(getattr(args, "tls_ca", None), getattr(args, "tls_cert", None), getattr(args, "tls_key", None))


def fleet_client(args: argparse.Namespace, address: str | None = None):
    """A :class:`FleetClient` for ``--tracker`` with the token and TLS options of ``args``."""
    from measure_agent.protocol.connection import CredentialsError
    from tuner.daemon import FleetClient

    token, tls = _credentials(args)
    try:
        return FleetClient(address or args.tracker, token=token, tls=tls, on_outage=_note)
    except CredentialsError as exc:
        raise CliError(str(exc)) from None


def check_fleet_arguments(args: argparse.Namespace, command: str) -> None:
    """``--tracker`` and ``--rpc-key`` go together (without both, ``command`` measures on this host)."""
    if args.rpc_key and not args.tracker:
        raise CliError(f"--rpc-key needs --tracker HOST:PORT: without a daemon, {command} measures on this host")
    if args.tracker and not args.rpc_key:
        raise CliError("--tracker needs --rpc-key KEY: the device key of the agents to use")


@contextmanager
def opened_fleet(args: argparse.Namespace, command: str, target: str, *, db: str | None = None) -> Iterator:
    """:func:`tuner.fleet.connect.open_fleet` for ``--tracker``/``--rpc-key`` (or the embedded
    daemon over ``--db``, or ``db``, with ``--parallel`` build workers), its failures as one line."""
    from measure_agent.protocol.connection import CredentialsError
    from tuner.fleet.connect import LocalFleetError, open_fleet
    from tuner.log import TuningLogError
    from tuner.settings import SettingsError
    from tuner.steering import SteeringError

    check_fleet_arguments(args, command)
    token, tls = _credentials(args) if args.tracker else (None, None)
    device_key = args.rpc_key if args.tracker else getattr(args, "device_key", None)
    try:
        with open_fleet(args.tracker, device_key, target=target, db=db or getattr(args, "db", None),
                        parallel=getattr(args, "parallel", 1), token=token, tls=tls, on_outage=_note) as session:
            yield session
    except SteeringError as exc:
        raise CliError(str(exc)) from None
    except (LocalFleetError, TuningLogError, SettingsError) as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None
    except CredentialsError as exc:
        raise CliError(str(exc)) from None


def _note(text: str) -> None:
    print(f"tuner: note: {text}", file=sys.stderr, flush=True)

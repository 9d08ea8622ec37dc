"""The ``measure-agent`` command line.

``measure-agent --tracker HOST:PORT [--key KEY]`` joins a daemon's fleet under a device key (default:
the host's detected key, which ``tuner best`` and ``tuner.best_kernel`` on the host look up) and
measures what it is given until SIGTERM (it finishes the batch in flight first). ``info`` describes
this device as the tuner will record it; ``measure`` builds, checks and times one config here,
through the same engine. The agent's flags may come from the environment or the config file
(:mod:`measure_agent.settings`).

Exit codes: 0 stopped, 1 failed, 2 bad usage or settings, 78 (``EXIT_REFUSED``, sysexits' EX_CONFIG)
refused by the daemon (other templates or protocol version, a wrong token or key): restarting the
same install cannot help, so service managers are told not to restart on it.
"""

from __future__ import annotations

import argparse
import json
import sys

from measure_agent import __version__, settings
from measure_agent.arguments import (
    INT32_MAX,
    device_key_type,
    int_range,
    non_negative_float,
    positive_float,
    tracker_type,
)
from measure_agent.device import detect_device
from measure_agent.engine import MeasureEngine, MeasureInput, TimingConfig
from measure_agent.engine.kernel_cache import DEFAULT_CACHE_MAX_MB
from measure_agent.space import ConfigError
from measure_agent.templates import TemplateNotFound, default_catalog
from measure_agent.workload import WorkloadError, parse_workload


positive_int32 = int_range(1, INT32_MAX)  # the protocol carries these counts as int32
cache_megabytes = int_range(0, 2**40)  # 0: no cap
EXIT_REFUSED = 78  # deploy/systemd's RestartPreventExitStatus= names it: keep them equal


def cmd_info(args: argparse.Namespace) -> int:
    info = detect_device()
    catalog = default_catalog()
    data = {
        "device_key": info.default_key,
        "device": info.to_json(),
        "agent_version": __version__,
        "template_catalog_version": catalog.version,
        "templates": sorted(f"{t.op}/{t.target}" for t in catalog),
    }
    print(json.dumps(data, indent=2, sort_keys=True))
    return 0


def cmd_measure(args: argparse.Namespace) -> int:
    workload = parse_workload(args.workload)
    template = default_catalog().get(workload.op, args.target)
    space = template.space(workload)
    config = template.default_config(workload, space) if args.config == "default" else space.from_json(args.config)
    timing = TimingConfig(number=args.number, repeat=args.repeat, min_repeat_ms=args.min_repeat_ms,
                          run_timeout_s=args.timeout)
    with MeasureEngine(timing) as engine:
        [result] = engine.measure([MeasureInput(workload, config, args.target)])
    output = {
        "workload": workload.key,
        "config": config.to_json(),
        "status": result.status.value,
        "costs": list(result.costs),
        "mean_s": result.mean_s,
        "gflops": workload.flops / result.mean_s / 1e9 if result.mean_s else None,
        "compile_time_s": result.compile_time_s,
        "message": result.message,
    }
    print(json.dumps(output, sort_keys=True))
    return 0 if result.status.is_ok else 1


def run_agent(args: argparse.Namespace) -> int:
    import logging
    from measure_agent.signals import call_on_signals

    from measure_agent.agent import Agent, AgentRefused

    if not args.key:
        # The detected key is what tuner.best_kernel and `tuner best` on this host look up first.
        from measure_agent.device import detect_device

        args.key = detect_device().default_key
        print(f"measure-agent: joining under this host's detected key {args.key} (--key to choose another)",
              file=sys.stderr)
    from measure_agent.engine.runtime import RuntimeSettingsError
    from measure_agent.protocol.connection import CredentialsError, TlsFiles, read_tokens

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        token = read_tokens(args.token_file)[0] if args.token_file else None
        tls = TlsFiles(args.tls_ca, args.tls_cert, args.tls_key)
        agent = Agent(args.tracker, args.key, name=args.name, parallel=args.parallel, catalog=args.templates,
                      token=token, tls=tls, cache_max_mb=args.cache_max_mb)
    except (CredentialsError, RuntimeSettingsError) as exc:  # a bad token file, or NUMBA_NUM_THREADS=two
        print(f"measure-agent: error: {exc}", file=sys.stderr)
        return 2
    call_on_signals(agent.stop)
    try:
        agent.run()
    except AgentRefused as exc:
        print(f"measure-agent: error: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="measure-agent", description="tunefleet measurement agent",
        epilog="Join a fleet: measure-agent --tracker HOST:PORT [--key KEY] [--name NAME] [--parallel N]\n"
               "Flags default to TUNEFLEET_* variables, then ~/.config/tunefleet/config.toml (see README).\n"
               f"Exit codes: 0 stopped, 1 failed, 2 bad usage or settings, {EXIT_REFUSED} refused by the daemon "
               "(do not restart: install the daemon's version).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"measure-agent {__version__}")
    # Each of these defaults to its environment variable, then the config file (measure_agent/settings.py).
    parser.add_argument("--tracker", type=tracker_type, metavar="HOST:PORT[,HOST:PORT...]",
                        help="the daemon to join; several: a leader and its standbys, followed on failover "
                             "($TUNEFLEET_TRACKER)")
    parser.add_argument("--key", type=device_key_type,
                        help="device key to join under, e.g. jetson-orin or rpi4 (default: $TUNEFLEET_AGENT_KEY, then this "
                             "host's detected key, as `measure-agent info` prints)")
    parser.add_argument("--name", help="this agent's name (default: the host name; $TUNEFLEET_AGENT_NAME)")
    parser.add_argument("--parallel", type=positive_int32,
                        help="candidates built at once (default 1; $TUNEFLEET_AGENT_PARALLEL)")
    parser.add_argument("--cache-max-mb", type=cache_megabytes, default=DEFAULT_CACHE_MAX_MB, metavar="MB",
                        help="cap of the kernel cache: least recently used kernels are evicted beyond it "
                             f"(default {DEFAULT_CACHE_MAX_MB}; 0: no cap)")
    parser.add_argument("--token-file", metavar="FILE",
                        help="agent token, when the daemon requires one ($TUNEFLEET_AGENT_TOKEN_FILE)")
    parser.add_argument("--tls-ca", metavar="PEM",
                        help="CA certificate to trust the daemon's TLS certificate ($TUNEFLEET_TLS_CA)")
    parser.add_argument("--tls-cert", metavar="PEM",
                        help="this agent's client certificate, when required ($TUNEFLEET_TLS_CERT)")
    parser.add_argument("--tls-key", metavar="PEM", help="key of --tls-cert ($TUNEFLEET_TLS_KEY)")
    settings.declare(parser, "tracker", "key", "name", "parallel", "token_file", "tls_ca", "tls_cert", "tls_key")
    parser.add_argument("--templates", default="default", choices=("default", "testing"), help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", required=False, metavar="COMMAND")
    info = sub.add_parser("info", help="describe this device and the installed templates")
    info.set_defaults(func=cmd_info)
    measure = sub.add_parser("measure", help="build, check and time one config here")
    measure.add_argument("--workload", required=True, help="e.g. 'matmul(M=512,N=512,K=512)'")
    measure.add_argument("--target", default="cpu")
    measure.add_argument("--config", default="default", help="config JSON, or 'default'")
    measure.add_argument("--number", type=positive_int32, default=1, help="calls per timed repeat (default 1)")
    measure.add_argument("--repeat", type=positive_int32, default=3, help="timed repeats (default 3)")
    measure.add_argument("--min-repeat-ms", type=non_negative_float, default=50.0,
                         help="grow --number until one repeat lasts this long (default 50)")
    measure.add_argument("--timeout", type=positive_float, default=20.0, help="run timeout, seconds (default 20)")
    measure.set_defaults(func=cmd_measure)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        try:
            settings.apply(args, settings.Settings("agent"))
        except settings.SettingsError as exc:
            print(f"measure-agent: error: {exc}", file=sys.stderr)
            return 2
        if not args.tracker:
            parser.print_usage(sys.stderr)
            print("measure-agent: error: give --tracker HOST:PORT [--key KEY], or a command", file=sys.stderr)
            return 2
        return run_agent(args)
    try:
        return args.func(args)
    except (WorkloadError, ConfigError, TemplateNotFound, ValueError) as exc:
        print(f"measure-agent: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

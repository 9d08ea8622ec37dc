"""Fleet commands: ``submit``, ``jobs``, ``status``, ``wait``, ``cancel``, ``agents`` (all with --tracker)."""

from __future__ import annotations

import argparse
import json

from measure_agent.arguments import device_key_type
from measure_agent.protocol.errors import FleetError
from tuner.cli.common import (
    EXIT_FAILURE,
    CliError,
    add_client_security_arguments,
    add_tracker_argument,
    fleet_client,
    positive_int,
    workload_arg,
)
from tuner.cli.jobs_view import print_summary, status_line, watch_with_progress

# `tuner agents` lists each agent of a fleet up to this size; beyond, it shows the keys (--key, --all)
AGENTS_LISTED = 64


def _tracker(p: argparse.ArgumentParser) -> None:
    add_tracker_argument(p, "the daemon", required=True)
    add_client_security_arguments(p)


def register(subparsers) -> None:
    from tuner.cli.tune import add_job_arguments

    submit = subparsers.add_parser("submit", help="submit a tuning job to the fleet and print its id")
    add_job_arguments(submit)
    _tracker(submit)
    submit.add_argument("--rpc-key", required=True, metavar="KEY", type=device_key_type,
                        help="device key of the agents to use")
    submit.set_defaults(func=run_submit)

    jobs = subparsers.add_parser("jobs", help="list the daemon's jobs")
    _tracker(jobs)
    jobs.add_argument("--json", action="store_true")
    jobs.set_defaults(func=run_jobs)

    for name, func, text in (("status", run_status, "show one job"), ("wait", run_wait, "follow a job to its end"),
                             ("cancel", run_cancel, "cancel a job (results so far stay in the log)")):
        p = subparsers.add_parser(name, help=text)
        p.add_argument("job", type=positive_int, metavar="JOB")
        _tracker(p)
        if name == "status":
            p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)

    agents = subparsers.add_parser(
        "agents", help="the fleet: agents per device key, busy ones, queued candidates",
        description=f"The fleet by device key. Each agent is listed when the fleet has at most {AGENTS_LISTED} "
                    "(--all: always); a larger fleet shows its keys, and --key KEY lists one key's agents.")
    _tracker(agents)
    agents.add_argument("--key", type=device_key_type, help="list this device key's agents only")
    agents.add_argument("--all", action="store_true", help="list every agent, however large the fleet")
    agents.add_argument("--json", action="store_true")
    agents.set_defaults(func=run_agents)


def _fleet_call(fn):
    try:
        return fn()
    except FleetError as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None


def run_submit(args: argparse.Namespace) -> int:
    from tuner.cli.tune import job_spec_from_args, submit_job

    spec = job_spec_from_args(args, workload_arg(args.workload).key, args.rpc_key)
    with fleet_client(args) as client:
        status = submit_job(client, spec)
    print(f"submitted {status.workload} on key {status.device_key} as job {status.job_id}")
    return 0


def run_jobs(args: argparse.Namespace) -> int:
    with fleet_client(args) as client:
        jobs = _fleet_call(client.jobs)
    if args.json:
        print(json.dumps([j.to_json() for j in jobs], sort_keys=True))
        return 0
    if not jobs:
        print("no jobs")
    for job in jobs:
        print(status_line(job))
    return 0


def run_status(args: argparse.Namespace) -> int:
    with fleet_client(args) as client:
        status = _fleet_call(lambda: client.job(args.job))
    print(json.dumps(status.to_json(), sort_keys=True) if args.json else status_line(status))
    return 0


def run_wait(args: argparse.Namespace) -> int:
    with fleet_client(args) as client:
        status = _fleet_call(lambda: client.job_when_reachable(args.job))
        final = watch_with_progress(client, status)
    return print_summary(final)


def run_cancel(args: argparse.Namespace) -> int:
    with fleet_client(args) as client:
        status = _fleet_call(lambda: client.cancel(args.job))
    print(status_line(status))
    return 0


def run_agents(args: argparse.Namespace) -> int:
    with fleet_client(args) as client:
        fleet = _fleet_call(lambda: client.agents(keys_only=True))
        listed = args.key or args.all or sum(k.agents for k in fleet.keys) <= AGENTS_LISTED
        if listed:
            fleet = _fleet_call(lambda: client.agents(key=args.key))
    if args.json:
        data = {"keys": [k.to_json() for k in fleet.keys], "agents": [a.to_json() for a in fleet.agents],
                "refused": [r.to_json() for r in fleet.refused],
                "leader": fleet.leader, "leader_epoch": fleet.leader_epoch}
        print(json.dumps(data, sort_keys=True))
        return 0
    if fleet.leader:
        print(f"leader: {fleet.leader} (epoch {fleet.leader_epoch})")
    if not fleet.keys:
        print(f"no agents of key {args.key}" if args.key else "no agents")
    for key in fleet.keys:
        print(f"{key.key}: {key.agents} agents, {key.busy_agents} busy, {key.queued_candidates} queued, "
              f"{key.leased_candidates} leased, {key.jobs} jobs")
        for a in fleet.agents_of(key.key):
            device = a.device
            print(f"    {a.name:<20} {device.arch} {device.cpu_model} {device.cores} cores "
                  f"[{' '.join(device.isa_features)}] numba {device.numba_version} "
                  f"{_agent_state(a)}  heartbeat {a.seconds_since_heartbeat:.1f}s ago")
    if not listed:
        print(f"{sum(k.agents for k in fleet.keys)} agents: --key KEY lists a key's, --all every one")
    if fleet.refused:
        print("refused registrations (a refused agent exits and is not restarted: install the daemon's version, "
              "then start it again):")
    for r in fleet.refused:
        print(f"    {r.name or '(no name)':<20} key {r.key or '(none)'} from {r.peer}: {_refused_versions(r)}; "
              f"{r.attempts} attempt{'s' if r.attempts != 1 else ''}, last {r.seconds_ago:.0f}s ago"
              + ("" if r.version_mismatch else f": {r.reason}"))
    return 0


def _refused_versions(r) -> str:
    """The agent's versions against the daemon's, the ones that differ marked."""
    templates = f"templates {r.template_version or '(none)'}"
    if r.template_version != r.expected_template_version:
        templates += f" (daemon: {r.expected_template_version})"
    protocol = f"protocol {r.protocol_version}"
    if r.protocol_version != r.expected_protocol_version:
        protocol += f" (daemon: {r.expected_protocol_version})"
    return f"agent {r.agent_version or '(unknown)'}, {templates}, {protocol}"


def _agent_state(agent) -> str:
    if agent.quarantined:
        return f"QUARANTINED ({agent.overdue_leases} leases not reported in time; restart it to rejoin)"
    return f"leased {agent.leased}" if agent.leased else "idle"

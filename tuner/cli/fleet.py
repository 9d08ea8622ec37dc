"""Fleet commands: ``submit``, ``jobs``, ``status``, ``wait``, ``cancel``, ``agents`` (all with --tracker)."""

from __future__ import annotations

import argparse
import json

from measure_agent.protocol.errors import FleetError, InvalidRequest
from tuner.cli.common import (
    EXIT_FAILURE,
    CliError,
    add_client_security_arguments,
    fleet_client,
    positive_int,
    tracker_address,
    workload_arg,
)
from tuner.cli.jobs_view import (
    print_summary,
    status_json,
    status_line,
    submit_arguments,
    watch_with_progress,
)


def _tracker(p: argparse.ArgumentParser) -> None:
    p.add_argument("--tracker", type=tracker_address, required=True, metavar="HOST:PORT", help="the daemon")
    add_client_security_arguments(p)


def register(subparsers) -> None:
    from tuner.cli.tune import add_job_arguments

    submit = subparsers.add_parser("submit", help="submit a tuning job to the fleet and print its id")
    add_job_arguments(submit)
    _tracker(submit)
    submit.add_argument("--rpc-key", required=True, metavar="KEY", help="device key of the agents to use")
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

    agents = subparsers.add_parser("agents", help="the fleet: agents per device key, busy ones, queued candidates")
    _tracker(agents)
    agents.add_argument("--json", action="store_true")
    agents.set_defaults(func=run_agents)


def _fleet_call(fn):
    try:
        return fn()
    except FleetError as exc:
        raise CliError(str(exc), EXIT_FAILURE) from None


def run_submit(args: argparse.Namespace) -> int:
    from tuner.cli.tune import timing_from_args

    workload = workload_arg(args.workload)
    timing = timing_from_args(args)
    with fleet_client(args) as client:
        try:
            status = client.submit(**submit_arguments(workload, args.rpc_key, args, timing))
        except InvalidRequest as exc:
            raise CliError(str(exc)) from None  # bad input: exit 2
        except FleetError as exc:
            raise CliError(str(exc), EXIT_FAILURE) from None
    print(f"submitted {status.workload} on key {status.device_key} as job {status.job_id}")
    return 0


def run_jobs(args: argparse.Namespace) -> int:
    with fleet_client(args) as client:
        jobs = _fleet_call(client.jobs)
    if args.json:
        print(json.dumps([status_json(j) for j in jobs], sort_keys=True))
        return 0
    if not jobs:
        print("no jobs")
    for job in jobs:
        print(status_line(job))
    return 0


def run_status(args: argparse.Namespace) -> int:
    with fleet_client(args) as client:
        status = _fleet_call(lambda: client.job(args.job))
    print(json.dumps(status_json(status), sort_keys=True) if args.json else status_line(status))
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
        fleet = _fleet_call(client.agents)
    if args.json:
        data = {
            "keys": [{"key": k.key, "agents": k.agents, "busy_agents": k.busy_agents,
                      "queued_candidates": k.queued_candidates, "leased_candidates": k.leased_candidates,
                      "jobs": k.jobs} for k in fleet.keys],
            "agents": [{"agent_id": a.agent_id, "key": a.key, "name": a.name, "parallel": a.parallel,
                        "leased": a.leased, "peer": a.peer, "seconds_since_heartbeat": round(a.last_heartbeat, 3),
                        "capabilities": _caps_json(a.capabilities)} for a in fleet.agents],
        }
        print(json.dumps(data, sort_keys=True))
        return 0
    if not fleet.keys:
        print("no agents")
    for key in fleet.keys:
        print(f"{key.key}: {key.agents} agents, {key.busy_agents} busy, {key.queued_candidates} queued, "
              f"{key.leased_candidates} leased, {key.jobs} jobs")
        for a in (a for a in fleet.agents if a.key == key.key):
            caps = a.capabilities
            print(f"    {a.name:<20} {caps.arch} {caps.cpu_model} {caps.cores} cores "
                  f"[{' '.join(caps.isa_features)}] numba {caps.numba_version} "
                  f"{'leased ' + str(a.leased) if a.leased else 'idle'}  heartbeat {a.last_heartbeat:.1f}s ago")
    return 0


def _caps_json(caps) -> dict:
    from measure_agent.protocol.convert import capabilities_to_json

    return capabilities_to_json(caps)



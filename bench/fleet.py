"""Fleet throughput: N agents on loopback measuring candidates of known duration.

Each candidate is the testing ``sleep`` template: a warm-up call and one timed call of a kernel
that sleeps ``--sleep-ms`` / 2, so a candidate costs ``--sleep-ms`` of kernel time on its agent.
For N agents the ideal wall time of C candidates is C * sleep / N; efficiency is ideal / measured,
and the per-candidate overhead is what each candidate cost an agent beyond its kernel time.

    python bench/fleet.py                       # 1, 2, 4, 8, 16, 32 agents, 50 ms candidates
    python bench/fleet.py --agents 1 4 --per-agent 10
    python bench/fleet.py --protocol-agents     # agents that speak the protocol but measure nothing

Each measure-agent is three processes (agent, build worker, run worker) costing several ms of CPU
per candidate, so on a machine with few cores the real agents saturate it long before 32.
``--protocol-agents`` runs the same table with agents in one light process that register, lease
ahead, "run" by sleeping and report in the background over the real gRPC protocol: it measures what
the daemon and the protocol sustain at fleet sizes whose real agents do not fit on this machine.

Targets (issue 3): >= 90% efficiency at 32 agents with 50 ms candidates, <= 5 ms overhead. On one
small machine the agents' own processes compete with the daemon for the cores, so the table also
prints the daemon's CPU time per candidate, which is what bounds a real, distributed fleet.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure_agent.engine import TimingConfig  # noqa: E402
from measure_agent.templates import testing_catalog  # noqa: E402
from tuner.daemon import Daemon, FleetClient  # noqa: E402
from tuner.fleet import JobSpec  # noqa: E402
from tuner.log import TuningLog  # noqa: E402


def start_agents(address: str, key: str, count: int, cache_dir: str) -> list[subprocess.Popen]:
    env = dict(os.environ, XDG_CACHE_HOME=cache_dir)
    return [
        subprocess.Popen([sys.executable, "-m", "measure_agent", "--tracker", address, "--key", key,
                          "--name", f"{key}-{i}", "--parallel", "1", "--templates", "testing"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        for i in range(count)
    ]


def start_protocol_agents(address: str, key: str, count: int, sleep_ms: int) -> list[subprocess.Popen]:
    """``count`` protocol-level agents in one process (``--serve-protocol-agents``)."""
    return [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve-protocol-agents", address, key,
                              str(count), str(sleep_ms)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]


def serve_protocol_agents(address: str, key: str, count: int, sleep_ms: int) -> None:
    """Agents that speak the real protocol (register, lease, report over gRPC) but measure nothing:
    each candidate sleeps ``sleep_ms`` and reports success. They cost a fraction of a real agent's
    CPU (no engine, no worker processes), so on a small machine they show what the daemon and the
    protocol sustain at a fleet size whose real agents would not fit on its cores."""
    import threading

    import grpc

    from measure_agent import __version__
    from measure_agent.device import detect_device
    from measure_agent.engine import MeasureResult, MeasureStatus
    from measure_agent.protocol import V1_PROTOCOL_VERSION
    from measure_agent.protocol.convert import capabilities_to_proto, result_to_proto
    from measure_agent.protocol.v1 import fleet_pb2 as pb
    from measure_agent.protocol.v1 import fleet_pb2_grpc as pb_grpc

    channel = grpc.insecure_channel(address)
    stub = pb_grpc.AgentServiceStub(channel)
    caps = capabilities_to_proto(detect_device(), __version__, testing_catalog().version, ["matmul/sleep"])

    def agent(i: int) -> None:
        from concurrent.futures import ThreadPoolExecutor

        reply = stub.Register(pb.RegisterRequest(key=key, name=f"{key}-p{i}", capabilities=caps,
                                                 protocol_version=V1_PROTOCOL_VERSION, parallel=1))
        agent_id = reply.agent_id

        def lease():
            return stub.Lease(pb.LeaseRequest(agent_id=agent_id, max_candidates=1, wait_s=2.0))

        def report(lease_id: str) -> None:
            result = MeasureResult(MeasureStatus.OK, costs=(sleep_ms / 2000.0,))
            stub.Report(pb.ReportRequest(agent_id=agent_id, measurements=[result_to_proto(lease_id, result)]))

        # as measure-agent does: the next lease is fetched while a candidate "runs", reports go
        # out in the background
        with ThreadPoolExecutor(1) as ahead, ThreadPoolExecutor(1) as reporter:
            upcoming = ahead.submit(lease)
            while True:
                leased = upcoming.result()
                upcoming = ahead.submit(lease)
                for candidate in leased.candidates:
                    time.sleep(sleep_ms / 1000.0)
                    reporter.submit(report, candidate.lease_id)

    threads = [threading.Thread(target=agent, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def tree_cpu_seconds(roots: list[int]) -> float:
    """CPU seconds (user + system) used so far by the processes under ``roots`` (the agents and
    their build and run workers), from /proc; 0 where /proc is missing."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    parent, cpu = {}, {}
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry.name)] = int(fields[1])
        cpu[int(entry.name)] = (int(fields[11]) + int(fields[12])) / ticks
    wanted, total = set(roots), 0.0
    for pid in cpu:
        p = pid
        while p > 1 and p not in wanted:
            p = parent.get(p, 0)
        if p in wanted:
            total += cpu[pid]
    return total


def run_one(agents: int, per_agent: int, sleep_ms: int, workdir: str, protocol_agents: bool = False) -> dict:
    log = TuningLog(f"sqlite:///{workdir}/fleet-{agents}.db")
    daemon = Daemon(log, "127.0.0.1:0", catalog=testing_catalog(), heartbeat_interval_s=2.0,
                    agent_timeout_s=30.0).start()
    key = f"bench{agents}"
    processes = (start_protocol_agents(daemon.address, key, agents, sleep_ms) if protocol_agents
                 else start_agents(daemon.address, key, agents, workdir))
    try:
        deadline = time.monotonic() + 300
        while sum(1 for a in daemon.scheduler.agents() if a.key == key) < agents:
            if time.monotonic() > deadline:
                raise RuntimeError("agents did not join in time")
            time.sleep(0.2)
        candidates = agents * per_agent
        # Warm every agent's workers first (process start, first import) so the timed job is steady state.
        with FleetClient(daemon.address) as client:
            # The same workload as the timed job, so its space is built and its problem made on every
            # process before timing starts; the timed job resumes from these trials.
            workload = f"matmul(M=2,N=2,K={sleep_ms // 2})"
            warm = client.submit(JobSpec(workload, key, target="sleep", strategy="random",
                                 trials=agents * 2, seed=1, timing=TimingConfig(repeat=1, warmup=1)))
            for _ in client.watch(warm.job_id):
                pass
            start = time.perf_counter()
            cpu_start = time.process_time()  # this process is the daemon (plus the watching client)
            agents_cpu_start = tree_cpu_seconds([p.pid for p in processes])
            job = client.submit(JobSpec(workload, key, target="sleep", strategy="random",
                                trials=agents * 2 + candidates, seed=2, timing=TimingConfig(repeat=1, warmup=1)))
            final = None
            for final in client.watch(job.job_id):
                pass
            wall = time.perf_counter() - start
            daemon_cpu = time.process_time() - cpu_start
            agents_cpu = tree_cpu_seconds([p.pid for p in processes]) - agents_cpu_start
        assert final is not None and final.state == "done" and final.measured_now == candidates, final
        ideal = candidates * (sleep_ms / 1000.0) / agents
        return {
            "agents": agents,
            "candidates": candidates,
            "wall_s": wall,
            "ideal_s": ideal,
            "throughput": candidates / wall,
            "efficiency": ideal / wall,
            "overhead_ms": (wall * agents / candidates - sleep_ms / 1000.0) * 1000.0,
            "daemon_cpu_ms": daemon_cpu / candidates * 1000.0,
            "agents_cpu_ms": agents_cpu / candidates * 1000.0,
        }
    finally:
        for p in processes:
            p.terminate()
        for p in processes:
            p.wait()
        daemon.stop()
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--per-agent", type=int, default=50,
                        help="candidates per agent (default 50: steady state, not start-up, dominates)")
    parser.add_argument("--sleep-ms", type=int, default=50, help="kernel time per candidate (default 50)")
    parser.add_argument("--protocol-agents", action="store_true",
                        help="agents that speak the protocol but measure nothing (one light process): what the "
                        "daemon sustains at fleet sizes whose real agents exceed this machine's cores")
    parser.add_argument("--serve-protocol-agents", nargs=4, metavar=("ADDRESS", "KEY", "COUNT", "SLEEP_MS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_protocol_agents:
        address, key, count, sleep_ms = args.serve_protocol_agents
        serve_protocol_agents(address, key, int(count), int(sleep_ms))
        return 0
    logging.basicConfig(level=logging.WARNING)
    rows = []
    with tempfile.TemporaryDirectory(prefix="tunefleet-fleet-bench-") as workdir:
        for n in args.agents:
            rows.append(run_one(n, args.per_agent, args.sleep_ms, workdir, args.protocol_agents))
            r = rows[-1]
            print(f"  {n} agents done in {r['wall_s']:.2f} s", file=sys.stderr, flush=True)
    kind = "protocol-level agents (no engine)" if args.protocol_agents else "measure-agent processes"
    print(f"\nFleet throughput, {args.sleep_ms} ms candidates, {args.per_agent} per agent, {kind}, loopback, "
          f"{os.cpu_count()} CPU cores")
    print(f"{'agents':>6} {'candidates':>10} {'wall s':>8} {'ideal s':>8} {'cand/s':>8} {'efficiency':>10} "
          f"{'overhead ms/cand':>16} {'daemon CPU ms/cand':>18} {'agent CPU ms/cand':>17} {'CPU-bound cand/s':>16}")
    cores = os.cpu_count() or 1
    for r in rows:
        # what this machine's cores can sustain at the measured CPU cost of a candidate, all processes
        bound = cores * 1000.0 / max(r["daemon_cpu_ms"] + r["agents_cpu_ms"], 1e-9)
        print(f"{r['agents']:>6} {r['candidates']:>10} {r['wall_s']:>8.2f} {r['ideal_s']:>8.2f} "
              f"{r['throughput']:>8.1f} {r['efficiency']:>9.1%} {r['overhead_ms']:>16.2f} {r['daemon_cpu_ms']:>18.2f} "
              f"{r['agents_cpu_ms']:>17.2f} {bound:>16.0f}")
    print(f"Agents, their workers and the daemon share this machine's {cores} cores. The ideal for N agents is\n"
          f"N * {1000 // args.sleep_ms} candidates/s; where that exceeds 'CPU-bound cand/s' (cores / CPU per candidate of\n"
          "all processes), the run is bound by this machine, not by waiting. On a real fleet each agent has\n"
          "its own host and the daemon's CPU per candidate bounds throughput at 1000 / that value.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

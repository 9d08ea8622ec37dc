"""Fleet throughput: N agents on loopback measuring candidates of known duration, protocol v2
(one stream per agent) against v1 (unary calls) in one run.

Each candidate is the testing ``sleep`` template (``--sleep-ms`` of kernel time per candidate). For
N agents the ideal wall time of C candidates is C * sleep / N; efficiency is ideal / measured, and
the per-candidate overhead is what each candidate cost an agent beyond its kernel time.

    python bench/fleet.py --protocol-agents                    # light agents: 1 32 256 1000, v2 and v1
    python bench/fleet.py --protocol-agents --agents 1000 --sleep-ms 1000 --json
    python bench/fleet.py --agents 1 2 4 8                     # real measure-agent processes (v2)

``--protocol-agents`` runs agents that speak the protocol but measure nothing ("running" a candidate
is an asyncio sleep): a few processes of asyncio agents, so a thousand fit on a small machine. The
daemon runs in this process: ``daemon_cpu_ms`` is its CPU (gRPC server, scheduler, the job's search
and log) per candidate, less the watching client's thread (``client_cpu_ms``), ``daemon_rss_mb`` its
resident memory with every agent connected, and ``p99_ms`` the 99th percentile from a lease to its accepted result. v1 points are served by the same
daemon with its unary agent service switched on for this comparison (``Daemon(serve_v1_agents=True)``).

Real agents (v2 only: the agent speaks nothing else) report ``agent_cpu_ms``: the agent process's
own CPU per candidate, outside its build and run workers, which is the protocol's cost on a device.

Targets (issue 21): daemon CPU <= 0.3 ms per candidate; >= 95% efficiency at 1000 agents with 1 s
candidates and >= 90% at 256 agents with 50 ms; daemon RSS <= 300 MB with 1000 agents; real agents
<= 2 ms of agent-side CPU per candidate. On one small machine the agents share the cores with the
daemon: ``agents_cpu_ms`` and ``cpu_busy`` (all CPU used / cores x wall) show where cores bound a point.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from measure_agent.engine import TimingConfig  # noqa: E402
from measure_agent.templates import testing_catalog  # noqa: E402
from measure_agent.templates.testing import SLEEP_VARIANTS  # noqa: E402
from tuner.daemon import Daemon, FleetClient  # noqa: E402
from tuner.fleet import JobSpec  # noqa: E402
from tuner.log import TuningLog  # noqa: E402

# Light agents are spread over processes (each an asyncio loop): at least 4, and enough that none
# serves more than 125 agents (a loop of 250 woke each agent ~35 ms late per candidate at 1 s,
# which the bench would have charged to the daemon), at most 8.
LIGHT_PROCESSES = (4, 8)
LIGHT_AGENTS_PER_PROCESS = 125


# -- agents ---------------------------------------------------------------------------------------
def start_agents(address: str, key: str, count: int, cache_dir: str) -> list[subprocess.Popen]:
    env = dict(os.environ, XDG_CACHE_HOME=cache_dir)
    return [
        subprocess.Popen([sys.executable, "-m", "measure_agent", "--tracker", address, "--key", key,
                          "--name", f"{key}-{i}", "--parallel", "1", "--templates", "testing"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
        for i in range(count)
    ]


def start_light_agents(address: str, key: str, count: int, sleep_ms: int, protocol: str) -> list[subprocess.Popen]:
    """``count`` light agents of ``protocol`` over :data:`LIGHT_PROCESSES` processes."""
    fewest, most = LIGHT_PROCESSES
    processes = min(count, max(fewest, min(most, -(-count // LIGHT_AGENTS_PER_PROCESS))))
    shares = [count // processes + (1 if i < count % processes else 0) for i in range(processes)]
    first = [sum(shares[:i]) for i in range(processes)]
    return [subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--serve-light-agents", address, key,
                              str(n), str(sleep_ms), protocol, str(f)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            for n, f in zip(shares, first)]


def serve_light_agents(address: str, key: str, count: int, sleep_ms: int, protocol: str, first: int) -> None:
    """Agents that speak the real protocol but measure nothing: each candidate is an asyncio sleep
    of ``sleep_ms``, reported as a success. Each agent has its own connection, as on a fleet."""
    import grpc

    from measure_agent import __version__
    from measure_agent.device import detect_device
    from measure_agent.engine import MeasureResult, MeasureStatus
    from measure_agent.protocol import PROTOCOL_VERSION, V1_PROTOCOL_VERSION
    from measure_agent.protocol.connection import CHANNEL_OPTIONS
    from measure_agent.protocol.convert import capabilities_to_proto, result_to_proto
    from measure_agent.protocol.v1 import fleet_pb2 as pb1
    from measure_agent.protocol.v1 import fleet_pb2_grpc as pb1_grpc
    from measure_agent.protocol.v2 import agent_pb2 as pb2
    from measure_agent.protocol.v2 import agent_pb2_grpc as pb2_grpc

    caps = capabilities_to_proto(detect_device(), __version__, testing_catalog().version, ["matmul/sleep"])
    result = MeasureResult(MeasureStatus.OK, costs=(sleep_ms / 2000.0,))
    # a measure-agent's channel options, and a connection per agent
    options = CHANNEL_OPTIONS + [("grpc.use_local_subchannel_pool", 1)]

    async def v2_agent(i: int) -> None:
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            call = pb2_grpc.AgentServiceStub(channel).Connect()
            await call.write(pb2.AgentMessage(hello=pb2.Hello(key=key, name=f"{key}-{i}", capabilities=caps,
                                                              protocol_version=PROTOCOL_VERSION, parallel=1)))
            welcome = (await call.read()).welcome
            await call.write(pb2.AgentMessage(credit=pb2.Credit(candidates=2)))  # one to run, one ahead
            leased: asyncio.Queue = asyncio.Queue()

            async def read() -> None:
                while (message := await call.read()) is not grpc.aio.EOF:
                    for candidate in message.leases.candidates:
                        leased.put_nowait(candidate.lease_id)

            reader = asyncio.ensure_future(read())
            while True:  # the only writer of the stream
                try:
                    # a lease held ahead starts at once, as a measure-agent's runner takes it (a
                    # wait_for is a task and a loop turn or two: milliseconds on a busy loop)
                    lease_id = leased.get_nowait()
                except asyncio.QueueEmpty:
                    try:
                        lease_id = await asyncio.wait_for(leased.get(), welcome.heartbeat_interval_s)
                    except asyncio.TimeoutError:
                        await call.write(pb2.AgentMessage(heartbeat=pb2.Heartbeat()))
                        continue
                await asyncio.sleep(sleep_ms / 1000.0)
                # new credit rides on the results, as a measure-agent sends it to a daemon that says so
                await call.write(pb2.AgentMessage(results=pb2.Results(
                    measurements=[result_to_proto(lease_id, result)], credit=1)))
            await reader

    async def v1_agent(i: int) -> None:
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            stub = pb1_grpc.AgentServiceStub(channel)
            reply = await stub.Register(pb1.RegisterRequest(key=key, name=f"{key}-{i}", capabilities=caps,
                                                            protocol_version=V1_PROTOCOL_VERSION, parallel=1))
            agent_id = reply.agent_id

            async def heartbeat() -> None:
                while True:
                    await asyncio.sleep(reply.heartbeat_interval_s)
                    await stub.Heartbeat(pb1.HeartbeatRequest(agent_id=agent_id))

            def lease():
                return asyncio.ensure_future(stub.Lease(pb1.LeaseRequest(agent_id=agent_id, max_candidates=1,
                                                                         wait_s=2.0)))

            beating = asyncio.ensure_future(heartbeat())
            reports = set()
            # as measure-agent of v1 did: the next lease is fetched while a candidate "runs",
            # reports go out in the background
            upcoming = lease()
            while True:
                leased = await upcoming
                upcoming = lease()
                for candidate in leased.candidates:
                    await asyncio.sleep(sleep_ms / 1000.0)
                    report = asyncio.ensure_future(stub.Report(pb1.ReportRequest(
                        agent_id=agent_id, measurements=[result_to_proto(candidate.lease_id, result)])))
                    reports.add(report)
                    report.add_done_callback(reports.discard)
            await beating

    agent = v2_agent if protocol == "v2" else v1_agent

    async def main() -> None:
        await asyncio.gather(*(agent(first + i) for i in range(count)))

    asyncio.run(main())


# -- measuring ------------------------------------------------------------------------------------
def tree_cpu_seconds(roots: list[int], children: bool = True) -> float:
    """CPU seconds (user + system) used so far by the processes ``roots`` and, with ``children``,
    every process under them (build and run workers), from /proc; 0 where /proc is missing."""
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
        while children and p > 1 and p not in wanted:
            p = parent.get(p, 0)
        if p in wanted:
            total += cpu[pid]
    return total


def thread_cpu_seconds() -> dict[str, float]:
    """CPU seconds of this process's threads so far, by kind (the name without its number): the
    event loop that serves agent streams, the RPC pool, the job drivers, gRPC's own threads..."""
    ticks = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    python_names = {t.native_id: t.name for t in threading.enumerate()}  # /proc names them all "python"
    by_kind: dict[str, float] = {}
    for task in Path("/proc/self/task").glob("[0-9]*"):
        try:
            name = python_names.get(int(task.name)) or (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        kind = name.rstrip("0123456789_-") or name
        by_kind[kind] = by_kind.get(kind, 0.0) + (int(fields[11]) + int(fields[12])) / ticks
    return by_kind


def rss_mb() -> float:
    """This process's resident memory now (the daemon's: it runs here)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024.0
    return float("nan")


class Latencies:
    """Lease-to-result seconds of accepted results, as the daemon's scheduler reports them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.values: list[float] = []
        self.recording = False

    def observe(self, key: str, result, lease_to_result_s: float) -> None:
        if self.recording:
            with self._lock:
                self.values.append(lease_to_result_s)

    def p99_ms(self) -> float:
        ordered = sorted(self.values)
        return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] * 1000.0 if ordered else float("nan")


def run_one(agents: int, per_agent: int, sleep_ms: int, workdir: str, protocol: str, light: bool) -> dict:
    log = TuningLog(f"sqlite:///{workdir}/fleet-{protocol}-{agents}-{'light' if light else 'real'}.db")
    daemon = Daemon(log, "127.0.0.1:0", catalog=testing_catalog(), heartbeat_interval_s=2.0, agent_timeout_s=30.0,
                    serve_v1_agents=protocol == "v1").start()
    latencies = Latencies()
    daemon.scheduler.add_result_observer(latencies.observe)
    key = f"bench{agents}"
    processes = (start_light_agents(daemon.address, key, agents, sleep_ms, protocol) if light
                 else start_agents(daemon.address, key, agents, workdir))
    try:
        deadline = time.monotonic() + 300
        while daemon.scheduler.agent_count(key) < agents:
            if time.monotonic() > deadline or any(p.poll() is not None for p in processes):
                raise RuntimeError(f"{agents} {protocol} agents did not join")
            time.sleep(0.2)
        candidates = agents * per_agent
        timing = TimingConfig(repeat=1, warmup=1)
        workload = f"matmul(M=2,N=2,K={max(1, sleep_ms // 2)})"  # warm-up call + timed call: sleep_ms
        with FleetClient(daemon.address, timeout_s=600) as client:
            # Warm every agent first (process start, first import, the workload's space) so that the
            # timed job is steady state; the timed job resumes from these trials.
            warm = client.submit(JobSpec(workload, key, target="sleep", strategy="random", trials=agents * 2, seed=1,
                                         timing=timing))
            for _ in client.watch(warm.job_id):
                pass
            latencies.recording = True
            start = time.perf_counter()
            # this process is the daemon plus the watching client, which runs in this thread
            cpu_start, client_cpu_start = time.process_time(), time.thread_time()
            threads_start = thread_cpu_seconds()
            agents_cpu_start = tree_cpu_seconds([p.pid for p in processes])
            agent_main_cpu_start = tree_cpu_seconds([p.pid for p in processes], children=False)
            job = client.submit(JobSpec(workload, key, target="sleep", strategy="random",
                                        trials=agents * 2 + candidates, seed=2, timing=timing))
            # a point that stalls (v1's light agents at 1,000) is cancelled and reported, not waited on
            limit_s = 60.0 + 3.0 * candidates * (sleep_ms / 1000.0) / agents
            stall = threading.Timer(limit_s, cancel_job, (daemon.address, job.job_id))
            stall.daemon = True
            stall.start()
            final = None
            try:
                for final in client.watch(job.job_id):
                    pass
            finally:
                stall.cancel()
            wall = time.perf_counter() - start
            if final is not None and final.state == "cancelled":
                raise RuntimeError(f"did not finish within {limit_s:.0f} s: {final.measured_now} of {candidates} "
                                   "results")
            client_cpu = time.thread_time() - client_cpu_start
            daemon_cpu = time.process_time() - cpu_start - client_cpu
            threads = thread_cpu_seconds()
            agents_cpu = tree_cpu_seconds([p.pid for p in processes]) - agents_cpu_start
            agent_main_cpu = tree_cpu_seconds([p.pid for p in processes], children=False) - agent_main_cpu_start
            rss = rss_mb()
        assert final is not None and final.state == "done" and final.measured_now == candidates, final
        ideal = candidates * (sleep_ms / 1000.0) / agents
        cores = os.cpu_count() or 1
        return {
            "protocol": protocol, "agents": agents, "sleep_ms": sleep_ms, "light": light,
            "candidates": candidates, "wall_s": round(wall, 3), "throughput": round(candidates / wall, 1),
            "efficiency": round(ideal / wall, 4),
            "overhead_ms": round((wall * agents / candidates - sleep_ms / 1000.0) * 1000.0, 2),
            "daemon_cpu_ms": round(daemon_cpu / candidates * 1000.0, 3),
            "client_cpu_ms": round(client_cpu / candidates * 1000.0, 3),  # the watcher, not counted above
            "agents_cpu_ms": round(agents_cpu / candidates * 1000.0, 3),
            "agent_cpu_ms": round(agent_main_cpu / candidates * 1000.0, 3),
            "daemon_rss_mb": round(rss, 1), "p99_ms": round(latencies.p99_ms(), 1),
            "cpu_busy": round((daemon_cpu + client_cpu + agents_cpu) / (cores * wall), 3),
            # where the daemon's CPU per candidate goes, by thread kind (ms; threads that ended uncounted)
            "daemon_cpu_ms_by_thread": {kind: round((cpu - threads_start.get(kind, 0.0)) / candidates * 1000.0, 3)
                                        for kind, cpu in sorted(threads.items())
                                        if cpu - threads_start.get(kind, 0.0) > 0},
        }
    finally:
        for p in processes:
            p.terminate()
        for p in processes:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        daemon.stop(grace_s=1.0)
        log.close()


def cancel_job(address: str, job_id: int) -> None:
    with FleetClient(address) as client:
        client.cancel(job_id)


def default_per_agent(agents: int, sleep_ms: int, light: bool) -> int:
    """Candidates per agent: light agents run ~10 s of kernel time each and at least 50 candidates
    (the last round's drain costs about one candidate per agent), so a point measures the steady
    state rather than start-up and drain, within what the sleep template's space can hand out."""
    if not light:
        return 30
    return min(max(50, round(10_000 / max(sleep_ms, 1))), (SLEEP_VARIANTS * 9 // 10) // agents)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, nargs="+",
                        help="fleet sizes (default: 1 32 256 1000 light agents, 1 2 4 8 real ones)")
    parser.add_argument("--per-agent", type=int, default=0,
                        help="candidates per agent (default: light agents run 10 s of kernel time each, at least "
                        "50 candidates and at most the sleep template's space over the fleet; real agents 30)")
    parser.add_argument("--sleep-ms", type=int, default=50, help="kernel time per candidate (default 50)")
    parser.add_argument("--protocol-agents", action="store_true",
                        help="light asyncio agents that speak the protocol but measure nothing: what the daemon "
                        "sustains at fleet sizes whose real agents exceed this machine's cores")
    parser.add_argument("--protocols", nargs="+", choices=("v2", "v1"), default=["v2", "v1"],
                        help="protocols of the light agents, side by side (default: v2 v1)")
    parser.add_argument("--json", action="store_true", help="one JSON object per point on stdout")
    parser.add_argument("--serve-light-agents", nargs=6, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_light_agents:
        address, key, count, sleep_ms, protocol, first = args.serve_light_agents
        serve_light_agents(address, key, int(count), int(sleep_ms), protocol, int(first))
        return 0
    logging.basicConfig(level=logging.ERROR)
    sizes = args.agents or ([1, 32, 256, 1000] if args.protocol_agents else [1, 2, 4, 8])
    protocols = args.protocols if args.protocol_agents else ["v2"]
    rows = []
    with tempfile.TemporaryDirectory(prefix="tunefleet-fleet-bench-") as workdir:
        for n in sizes:
            per_agent = args.per_agent or default_per_agent(n, args.sleep_ms, args.protocol_agents)
            for protocol in protocols:
                try:
                    row = run_one(n, per_agent, args.sleep_ms, workdir, protocol, args.protocol_agents)
                except (RuntimeError, AssertionError) as exc:
                    row = {"protocol": protocol, "agents": n, "sleep_ms": args.sleep_ms, "error": str(exc)[:300]}
                rows.append(row)
                if args.json:
                    print(json.dumps(row), flush=True)
                print(f"  {protocol} {n} agents: {row.get('wall_s', row.get('error'))}", file=sys.stderr, flush=True)
    if args.json:
        return 0
    kind = "light protocol agents" if args.protocol_agents else "measure-agent processes"
    print(f"\nFleet throughput, {args.sleep_ms} ms candidates, {kind}, loopback, {os.cpu_count()} CPU cores")
    print(f"{'proto':>5} {'agents':>6} {'cand.':>6} {'cand/s':>8} {'effic.':>7} {'overhead ms':>11} {'daemon CPU ms':>13} "
          f"{'RSS MB':>7} {'p99 ms':>8} {'agents CPU ms':>13} {'agent CPU ms':>12} {'CPU busy':>8}")
    for r in rows:
        if "error" in r:
            print(f"{r['protocol']:>5} {r['agents']:>6}  failed: {r['error']}")
            continue
        print(f"{r['protocol']:>5} {r['agents']:>6} {r['candidates']:>6} {r['throughput']:>8.1f} {r['efficiency']:>7.1%} "
              f"{r['overhead_ms']:>11.2f} {r['daemon_cpu_ms']:>13.3f} {r['daemon_rss_mb']:>7.0f} {r['p99_ms']:>8.1f} "
              f"{r['agents_cpu_ms']:>13.3f} {r['agent_cpu_ms']:>12.3f} {r['cpu_busy']:>8.0%}")
    print("CPU ms are per candidate. 'CPU busy' near 100%: this machine's cores bound the point (agents and\n"
          "daemon share them); a real fleet pays the daemon's CPU per candidate only.")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Chaos: one job on 4 local agents while agents die and freeze, the database goes away and
clients flood the daemon; then the same job without faults, side by side.

During the faulty run, once the job is under way:

- one agent is killed (SIGKILL) and one frozen (SIGSTOP; resumed with SIGCONT after the job);
- the SQLite log is held locked (``BEGIN EXCLUSIVE``) for ``--db-outage`` seconds, past the busy
  timeout, so the job must hold its results and retry;
- a flood of client calls runs throughout: slow ones (``Measure`` for a key no agent serves,
  ``WatchJob``) and malformed ones (oversized workloads, timing beyond its limits, bad device keys).

It prints trials lost and duplicated (both must be 0), the job's wall time against the fault-free
run, and the latency of agent heartbeats (p50/p99, from a probe agent) during the flood.

    python bench/chaos.py                   # 48 trials of 100 ms candidates
    python bench/chaos.py --trials 96 --sleep-ms 50 --flood 400
"""

from __future__ import annotations

import argparse
import signal
import sqlite3
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402

from measure_agent.device import detect_device  # noqa: E402
from measure_agent.engine import TimingConfig  # noqa: E402
from measure_agent.protocol import PROTOCOL_VERSION  # noqa: E402
from measure_agent.protocol.convert import capabilities_to_proto  # noqa: E402
from measure_agent.protocol.errors import FleetError  # noqa: E402
from measure_agent.protocol.v1 import fleet_pb2 as pb  # noqa: E402
from measure_agent.protocol.v1 import fleet_pb2_grpc as pb_grpc  # noqa: E402
from measure_agent.protocol.v2 import agent_pb2 as pb2  # noqa: E402
from measure_agent.protocol.v2 import agent_pb2_grpc as pb2_grpc  # noqa: E402
from measure_agent.templates import testing_catalog  # noqa: E402
from tuner.daemon import Daemon, FleetClient  # noqa: E402
from tuner.fleet import JobSpec  # noqa: E402
from tuner.log import TuningLog  # noqa: E402

from fleet import start_agents  # noqa: E402 - bench/fleet.py, beside this script

KEY = "chaos"


def wait_until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.1)


class Flood:
    """Slow and malformed client calls, ``calls`` at a time, until stopped."""

    def __init__(self, address: str, calls: int) -> None:
        self.address = address
        self.calls = calls
        self.stop = threading.Event()
        self.sent = self.refused = 0
        self.threads = [threading.Thread(target=self._run, args=(i,), daemon=True) for i in range(calls)]

    def start(self) -> "Flood":
        for thread in self.threads:
            thread.start()
        return self

    def _run(self, i: int) -> None:
        with FleetClient(self.address, timeout_s=5) as client:
            stub = pb_grpc.ClientServiceStub(grpc.insecure_channel(self.address))
            while not self.stop.is_set():
                self.sent += 1
                try:
                    if i % 3 == 0:  # slow: waits for an agent that never comes
                        client.measure("matmul(M=2,N=2,K=1)", "nobody", ['{"variant": 1}'], target="sleep")
                    elif i % 3 == 1:  # malformed: beyond the limits
                        stub.SubmitJob(pb.JobSpec(workload="matmul(" + "M=1," * 5000 + ")", device_key="x" * 4096,
                                                  timing=pb.Timing(number=2**31 - 1, run_timeout_s=float("inf"))),
                                       timeout=5)
                    else:
                        stub.SubmitJob(pb.JobSpec(workload="matmul(M=2,N=2,K=1)", device_key=KEY, target="sleep",
                                                  constraints=["(variant ** 256) ** 256 > 0"]), timeout=5)
                except (FleetError, grpc.RpcError):
                    self.refused += 1
                    time.sleep(0.05)

    def end(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=10)


class HeartbeatProbe:
    """A joined agent (protocol v2 stream) that only heartbeats, timing each until its ack."""

    def __init__(self, address: str, interval_s: float = 0.2) -> None:
        import queue

        self.channel = grpc.insecure_channel(address)
        self._requests: queue.SimpleQueue = queue.SimpleQueue()
        self._replies = pb2_grpc.AgentServiceStub(self.channel).Connect(iter(self._requests.get, None))
        caps = capabilities_to_proto(detect_device(), "probe", testing_catalog().version, [])
        self._requests.put(pb2.AgentMessage(hello=pb2.Hello(key="probe", name="probe", capabilities=caps,
                                                            protocol_version=PROTOCOL_VERSION, parallel=1)))
        self.agent_id = next(self._replies).welcome.agent_id
        self.interval_s = interval_s
        self.latencies: list[float] = []
        self.failures = 0
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        acks: list[threading.Event] = []
        threading.Thread(target=self._read, args=(acks,), daemon=True).start()
        while not self.stop.wait(self.interval_s):
            ack = threading.Event()
            acks.append(ack)
            start = time.perf_counter()
            self._requests.put(pb2.AgentMessage(heartbeat=pb2.Heartbeat()))
            if ack.wait(5):
                self.latencies.append(time.perf_counter() - start)
            else:
                self.failures += 1

    def _read(self, acks: list[threading.Event]) -> None:
        try:
            for message in self._replies:
                if message.WhichOneof("kind") == "heartbeat_ack" and acks:
                    acks.pop(0).set()
        except grpc.RpcError:
            pass

    def end(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)
        self._requests.put(None)
        self._replies.cancel()
        self.channel.close()


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


def run(workdir: str, name: str, spec: JobSpec, faults: bool, db_outage_s: float, flood_calls: int) -> dict:
    db = Path(workdir) / f"{name}.db"
    log = TuningLog(f"sqlite:///{db}")
    daemon = Daemon(log, "127.0.0.1:0", catalog=testing_catalog(), heartbeat_interval_s=0.5,
                    agent_timeout_s=3.0).start()
    agents = start_agents(daemon.address, KEY, 4, workdir)
    frozen = None
    flood = probe = None
    try:
        wait_until(lambda: daemon.scheduler.agent_count(KEY) == 4, 300, "4 agents joined")
        with FleetClient(daemon.address) as client:
            start = time.perf_counter()
            job = client.submit(spec)
            if faults:
                probe = HeartbeatProbe(daemon.address)
                flood = Flood(daemon.address, flood_calls).start()
                wait_until(lambda: len(log.trials(job_id=job.job_id)) >= spec.trials // 6, 300, "the job under way")
                agents[0].send_signal(signal.SIGKILL)
                frozen = agents[1]
                frozen.send_signal(signal.SIGSTOP)
                wait_until(lambda: len(log.trials(job_id=job.job_id)) >= spec.trials // 3, 300, "more trials")
                locker = sqlite3.connect(db, isolation_level=None)
                locker.execute("BEGIN EXCLUSIVE")
                time.sleep(db_outage_s)
                locker.execute("ROLLBACK")
                locker.close()
            wait_until(lambda: daemon.jobs.get(job.job_id).finished, 900, "the job to end")
            wall = time.perf_counter() - start
            final = daemon.jobs.get(job.job_id)
        trials = log.trials(job_id=final.job_id)
        digests = [t.config_digest for t in trials]
        return {
            "name": name, "state": final.state, "wall_s": wall,
            "lost": spec.trials - len(set(digests)), "duplicated": len(digests) - len(set(digests)),
            "heartbeat_p50_ms": percentile(probe.latencies, 0.5) * 1e3 if probe else None,
            "heartbeat_p99_ms": percentile(probe.latencies, 0.99) * 1e3 if probe else None,
            "heartbeat_failures": probe.failures if probe else None,
            "flood_calls": flood.sent if flood else 0, "flood_refused": flood.refused if flood else 0,
            "expired_leases": daemon.scheduler.expired_leases,
        }
    finally:
        if flood:
            flood.end()
        if probe:
            probe.end()
        if frozen is not None:
            frozen.send_signal(signal.SIGCONT)
        for agent in agents:
            agent.terminate()
        for agent in agents:
            agent.wait()
        daemon.stop()
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=48)
    parser.add_argument("--sleep-ms", type=int, default=100, help="kernel time per candidate (default 100)")
    parser.add_argument("--db-outage", type=float, default=40.0,
                        help="seconds the database stays locked (default 40: past SQLite's 30 s busy timeout)")
    parser.add_argument("--flood", type=int, default=300, help="concurrent flooding client calls (default 300)")
    args = parser.parse_args()
    spec = JobSpec(f"matmul(M=2,N=2,K={args.sleep_ms // 2})", KEY, target="sleep", strategy="random",
                   trials=args.trials, timing=TimingConfig(repeat=1, warmup=1, run_timeout_s=10, build_timeout_s=30))
    with tempfile.TemporaryDirectory(prefix="tunefleet-chaos-") as workdir:
        calm = run(workdir, "calm", spec, False, args.db_outage, args.flood)
        chaos = run(workdir, "chaos", spec, True, args.db_outage, args.flood)
    print(f"one job of {args.trials} trials ({args.sleep_ms} ms candidates) on 4 agents")
    print(f"{'run':<7} {'state':<6} {'wall s':>8} {'lost':>5} {'dup':>4} {'hb p50 ms':>10} {'hb p99 ms':>10} "
          f"{'hb fail':>8} {'flood calls':>12} {'refused':>8} {'expired leases':>15}")
    for row in (calm, chaos):
        p50 = f"{row['heartbeat_p50_ms']:.2f}" if row["heartbeat_p50_ms"] is not None else "-"
        p99 = f"{row['heartbeat_p99_ms']:.2f}" if row["heartbeat_p99_ms"] is not None else "-"
        print(f"{row['name']:<7} {row['state']:<6} {row['wall_s']:>8.1f} {row['lost']:>5} {row['duplicated']:>4} "
              f"{p50:>10} {p99:>10} {row['heartbeat_failures'] if row['heartbeat_failures'] is not None else '-':>8} "
              f"{row['flood_calls']:>12} {row['flood_refused']:>8} {row['expired_leases']:>15}")
    print(f"chaos / calm wall time: {chaos['wall_s'] / calm['wall_s']:.2f}x "
          f"(the database outage alone is {args.db_outage:g} s)")
    ok = chaos["state"] == calm["state"] == "done" and chaos["lost"] == chaos["duplicated"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

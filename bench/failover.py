"""Failover: one job on 4 agents through two daemons on one PostgreSQL log, the leader killed again
and again; then the same job with no kills, side by side.

During the faulty run, every ``--every`` seconds the leading daemon is SIGKILLed (``--kills`` times);
the time until the standby answers health SERVING is the takeover time, and the killed daemon is
started again at once, as the new standby. Agents and the waiting client are given both addresses
and follow the leader by themselves.

It prints the takeover time (p50, max), trials lost and duplicated (both must be 0) and the job's
wall time against the run without kills.

    python bench/failover.py                         # 10 kills, 4 agents, 100 ms candidates
    python bench/failover.py --kills 5 --lease-ttl 3 --db postgresql+psycopg://postgres@127.0.0.1/postgres
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import grpc  # noqa: E402
from grpc_health.v1 import health_pb2, health_pb2_grpc  # noqa: E402
from sqlalchemy import create_engine  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from measure_agent.engine import TimingConfig  # noqa: E402
from tuner.daemon import FleetClient  # noqa: E402
from tuner.fleet import JobSpec  # noqa: E402
from tuner.log import TuningLog  # noqa: E402

from chaos import percentile, wait_until  # noqa: E402 - bench/chaos.py, beside this script
from fleet import start_agents  # noqa: E402 - bench/fleet.py, beside this script

KEY = "failover"


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_daemon(db_url: str, port: int, lease_ttl_s: float) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "tuner", "daemon", "--listen", f"127.0.0.1:{port}", "--db", db_url,
         "--templates", "testing", "--lease-ttl", str(lease_ttl_s)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def serving(port: int) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=1)
        except grpc.RpcError:
            return False
    return reply.status == health_pb2.HealthCheckResponse.SERVING


def run(db_url: str, name: str, trials: int, sleep_ms: int, kills: int, every_s: float, lease_ttl_s: float,
        cache_dir: str) -> dict:
    ports = [free_port(), free_port()]
    tracker = ",".join(f"127.0.0.1:{p}" for p in ports)
    daemons = {ports[0]: start_daemon(db_url, ports[0], lease_ttl_s)}
    wait_until(lambda: serving(ports[0]), 60, "the first daemon leading")
    daemons[ports[1]] = start_daemon(db_url, ports[1], lease_ttl_s)
    agents = start_agents(tracker, KEY, 4, cache_dir)
    workload = f"matmul(M=2,N=2,K={sleep_ms})"
    takeovers: list[float] = []
    try:
        with FleetClient(tracker) as client:
            wait_until(lambda: len(client.agents().agents_of(KEY)) == 4, 60, "four agents")
            spec = JobSpec(workload, KEY, target="sleep", strategy="random", trials=trials,
                           timing=TimingConfig(repeat=1, warmup=0, run_timeout_s=30))
            started = time.monotonic()
            job = client.submit(spec)
        waiter = subprocess.Popen([sys.executable, "-m", "tuner", "wait", str(job.job_id), "--tracker", tracker],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for _ in range(kills):
            if _sleep_unless_done(waiter, every_s):
                break
            leader = next((p for p in ports if serving(p)), None)
            if leader is None:
                continue
            daemons[leader].send_signal(signal.SIGKILL)
            daemons[leader].wait()
            killed = time.monotonic()
            other = ports[1 - ports.index(leader)]
            wait_until(lambda: serving(other), 120, "the standby taking over")
            takeovers.append(time.monotonic() - killed)
            daemons[leader] = start_daemon(db_url, leader, lease_ttl_s)  # the new standby
        waiter.wait(timeout=1800)
        wall_s = time.monotonic() - started
    finally:
        for process in agents + list(daemons.values()):
            if process.poll() is None:
                process.terminate()
        for process in agents + list(daemons.values()):
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
    with TuningLog(db_url) as log:
        recorded = log.trials(workload_key=workload, device_key=KEY, target="sleep")
        final = log.get_job(job.job_id).status
    distinct = {json.dumps(t.config, sort_keys=True) for t in recorded}
    return {"run": name, "state": final, "wall_s": round(wall_s, 1), "kills": len(takeovers),
            "takeover_p50_s": round(percentile(takeovers, 0.5), 2) if takeovers else None,
            "takeover_max_s": round(max(takeovers), 2) if takeovers else None,
            "lost": trials - len(distinct), "duplicated": len(recorded) - len(distinct)}


def _sleep_unless_done(process: subprocess.Popen, seconds: float) -> bool:
    """Wait ``seconds``; ``True`` when ``process`` ended meanwhile."""
    try:
        process.wait(timeout=seconds)
        return True
    except subprocess.TimeoutExpired:
        return False


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--db", default="postgresql+psycopg://postgres@127.0.0.1:5432/postgres",
                        help="a PostgreSQL server URL; the bench makes (and drops) a database of its own there")
    parser.add_argument("--trials", type=int, default=1500, help="enough for --kills kills before the job ends")
    parser.add_argument("--sleep-ms", type=int, default=100, help="kernel time per call of each candidate")
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--every", type=float, default=6.0, help="seconds between a takeover and the next kill")
    parser.add_argument("--lease-ttl", type=float, default=5.0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    admin = create_engine(make_url(args.db), isolation_level="AUTOCOMMIT")
    rows = []
    with tempfile.TemporaryDirectory() as cache_dir:
        for name, kills in (("calm", 0), ("failover", args.kills)):
            database = f"tf_bench_failover_{uuid.uuid4().hex[:8]}"
            with admin.connect() as conn:
                conn.exec_driver_sql(f'CREATE DATABASE "{database}"')
            url = make_url(args.db).set(database=database).render_as_string(hide_password=False)
            try:
                rows.append(run(url, name, args.trials, args.sleep_ms, kills, args.every, args.lease_ttl, cache_dir))
            finally:
                with admin.connect() as conn:
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    admin.dispose()
    if args.json:
        for row in rows:
            print(json.dumps(row, sort_keys=True))
    else:
        print(f"{'run':<9} {'state':<6} {'wall s':>7} {'kills':>5} {'takeover p50':>12} {'max':>6} {'lost':>5} {'dup':>4}")
        for r in rows:
            p50 = "-" if r["takeover_p50_s"] is None else f"{r['takeover_p50_s']:.2f}"
            top = "-" if r["takeover_max_s"] is None else f"{r['takeover_max_s']:.2f}"
            print(f"{r['run']:<9} {r['state']:<6} {r['wall_s']:>7.1f} {r['kills']:>5} {p50:>12} {top:>6} "
                  f"{r['lost']:>5} {r['duplicated']:>4}")
        calm, faulty = rows
        print(f"extra wall time: {faulty['wall_s'] - calm['wall_s']:.1f} s ({faulty['wall_s'] / calm['wall_s']:.2f}x)")
    return 0 if all(r["lost"] == 0 and r["duplicated"] == 0 and r["state"] == "done" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())

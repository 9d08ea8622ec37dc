"""Fair and fast at scale (issue 21, point 5): 100 concurrent jobs over 10 device keys share the
agents of their key by priority, and jobs of equal priority take turns: none starves."""

from __future__ import annotations

import json
import threading
import time

import pytest

from measure_agent.engine import TimingConfig
from tuner.daemon import FleetClient
from tuner.fleet import JobSpec
from tuner.log import TuningLog

from fleet_helpers import FakeAgent, start_daemon, wait_for

pytestmark = pytest.mark.timeout(300)
KEYS = [f"share{k}" for k in range(10)]
JOBS_PER_KEY = 10
URGENT_PER_KEY = 2  # of each key's jobs, these have a higher priority
TRIALS = 12


def test_a_hundred_jobs_over_ten_keys_share_by_priority_and_turns(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'share.db'}") as log:
        daemon = start_daemon(log, heartbeat_interval_s=1.0, agent_timeout_s=30.0)
        agents: list[FakeAgent] = []
        progress: list[tuple[float, dict[int, int]]] = []  # (time, measured_now per job) snapshots
        watching = threading.Event()

        def watch() -> None:
            while not watching.is_set():
                progress.append((time.monotonic(), {s.job_id: s.measured_now for s in daemon.jobs.list()}))
                time.sleep(0.05)

        try:
            with FleetClient(daemon.address) as client:
                jobs: dict[int, tuple[str, int]] = {}  # job id -> (key, priority)
                # All submitted first (they wait for agents as queued), so that they compete from the start.
                for j in range(JOBS_PER_KEY):  # interleaved, as users submit: not key by key
                    for key in KEYS:
                        # the urgent ones last: a queue served in submission order would finish them last
                        priority = 5 if j >= JOBS_PER_KEY - URGENT_PER_KEY else 0
                        status = client.submit(JobSpec(f"matmul(M=2,N=2,K={10 + j})", key, target="sleep",
                                                       strategy="random", trials=TRIALS, priority=priority,
                                                       timing=TimingConfig(repeat=1, warmup=0)))
                        jobs[status.job_id] = (key, priority)
                # 2 agents per key, each "measuring" for 10 ms: the order of leases decides who finishes
                # first. They take work once every job has candidates queued, so that all compete from
                # the start (a daemon starts 100 jobs one after the other).
                go = threading.Event()
                agents += [FakeAgent(daemon.address, key, f"{key}-{i}", cost_of=lambda n: time.sleep(0.01) or 1e-3,
                                     leases_when=go)
                           for key in KEYS for i in range(2)]
                wait_for(lambda: all(daemon.scheduler.job_counts(j)[0] > 0 for j in jobs), what="every job queued")
                watcher = threading.Thread(target=watch, daemon=True)
                watcher.start()
                go.set()
                finished = wait_for(lambda: _finished(daemon, jobs), timeout_s=240, what="every job done")
            watching.set()
            watcher.join()
        finally:
            watching.set()
            for agent in agents:
                agent.stop()
            daemon.stop()

        # no job starved: every one ended with its whole budget, each config once
        assert {s.state for s in finished.values()} == {"done"}
        for job_id, (key, _) in jobs.items():
            trials = log.trials(job_id=job_id)
            assert len(trials) == len({t.config_digest for t in trials}) == TRIALS

        done_at = {job_id: next(t for t, counts in progress if counts.get(job_id, 0) >= TRIALS) for job_id in jobs}
        for key in KEYS:
            urgent = [j for j, (k, p) in jobs.items() if k == key and p == 5]
            normal = [j for j, (k, p) in jobs.items() if k == key and p == 0]
            # priority: the urgent jobs of a key finish before any of its normal jobs does
            assert max(done_at[j] for j in urgent) <= min(done_at[j] for j in normal), key
            # turns: when the first normal job of a key is done, every other one is well under way
            first = min(done_at[j] for j in normal)
            at_first = next(counts for t, counts in progress if t >= first)
            assert min(at_first.get(j, 0) for j in normal) >= TRIALS // 3, (key, {j: at_first.get(j) for j in normal})


def _finished(daemon, jobs) -> dict | None:
    statuses = {s.job_id: s for s in daemon.jobs.list() if s.job_id in jobs}
    if len(statuses) == len(jobs) and all(s.finished for s in statuses.values()):
        return statuses
    return None


def test_tuner_agents_shows_a_thousand_agents_by_key(tmp_path, capsys):
    """Issue 21, point 6: a large fleet is listed by key (one line each), one key's agents on asking."""
    from tuner.cli import main as tuner_main

    with TuningLog(f"sqlite:///{tmp_path / 'many.db'}") as log:
        daemon = start_daemon(log, agent_timeout_s=300.0)
        try:
            for i in range(1000):
                daemon.scheduler.register(f"board{i % 10}", f"board-{i}", {"arch": "aarch64", "cpu_model": "Cortex-A72",
                                                                         "cores": 4})
            assert tuner_main(["agents", "--tracker", daemon.address]) == 0
            lines = capsys.readouterr().out.splitlines()
            assert len(lines) == 11 and lines[-1] == "1000 agents: --key KEY lists a key's, --all every one"
            assert lines[0] == "board0: 100 agents, 0 busy, 0 queued, 0 leased, 0 jobs"
            assert tuner_main(["agents", "--tracker", daemon.address, "--key", "board3", "--json"]) == 0
            view = json.loads(capsys.readouterr().out)
            assert [k["key"] for k in view["keys"]] == ["board3"] and len(view["agents"]) == 100
            assert {a["name"] for a in view["agents"]} == {f"board-{i}" for i in range(3, 1000, 10)}
            assert tuner_main(["agents", "--tracker", daemon.address, "--all"]) == 0
            assert len(capsys.readouterr().out.splitlines()) == 1010
            assert tuner_main(["agents", "--tracker", daemon.address, "--key", "nobody"]) == 0
            assert capsys.readouterr().out.strip() == "no agents of key nobody"
        finally:
            daemon.stop()

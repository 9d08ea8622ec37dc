"""The daemon and agents on loopback: sharing, fairness, faults, rejoining, versions."""

from __future__ import annotations

import json
import signal
import subprocess
import sys

import pytest

from measure_agent.engine import TimingConfig
from tuner.daemon import FleetClient
from tuner.fleet import JobSpec
from tuner.log import TuningLog

from fleet_helpers import agent_names, start_agent, start_daemon, stop_all, wait_for

pytestmark = pytest.mark.timeout(300)
FAST = TimingConfig(repeat=1, warmup=0, run_timeout_s=10)


@pytest.fixture()
def log(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'fleet.db'}") as log:
        yield log


def distinct_configs(log, workload_key, device_key):
    trials = log.trials(workload_key=workload_key, device_key=device_key, target="sleep")
    return trials, {json.dumps(t.config, sort_keys=True) for t in trials}


def test_three_agents_two_keys_two_jobs_and_a_sigkill(log, kernel_cache_dir):
    daemon = start_daemon(log)
    agents = [
        start_agent(daemon.address, "alpha", "alpha-1", kernel_cache_dir),
        start_agent(daemon.address, "alpha", "alpha-2", kernel_cache_dir),
        start_agent(daemon.address, "beta", "beta-1", kernel_cache_dir),
    ]
    try:
        wait_for(lambda: len(agent_names(daemon)) == 3, what="three agents")
        with FleetClient(daemon.address) as client:
            job_a = client.submit(JobSpec("matmul(M=2,N=2,K=40)", "alpha", target="sleep", strategy="random", trials=40,
                                  timing=FAST))
            job_b = client.submit(JobSpec("matmul(M=2,N=2,K=10)", "beta", target="sleep", strategy="random", trials=12,
                                  timing=FAST))
            # Kill one alpha agent once it has leases in flight: they must go to alpha-2.
            wait_for(lambda: any(a.name == "alpha-1" and a.leases for a in daemon.scheduler.agents()),
                     what="alpha-1 holding leases")
            agents[0].send_signal(signal.SIGKILL)
            final = {}
            for job in (job_a, job_b):
                for status in client.watch(job.job_id):
                    final[job.job_id] = status
        assert final[job_a.job_id].state == "done" and final[job_b.job_id].state == "done"
        trials_a, configs_a = distinct_configs(log, "matmul(M=2,N=2,K=40)", "alpha")
        trials_b, configs_b = distinct_configs(log, "matmul(M=2,N=2,K=10)", "beta")
        assert len(trials_a) == len(configs_a) == 40
        assert len(trials_b) == len(configs_b) == 12
        assert all(t.status == "ok" for t in trials_a + trials_b)
        assert {t.agent for t in trials_b} == {"beta-1"}
        assert "alpha-2" in {t.agent for t in trials_a}
        assert daemon.scheduler.expired_leases > 0  # alpha-1's leases were taken back
        assert agent_names(daemon, "alpha") == {"alpha-2"}
    finally:
        stop_all(agents)
        daemon.stop()


def test_agent_restart_rejoins_and_daemon_restart_gets_agents_back(log, kernel_cache_dir):
    daemon = start_daemon(log)
    port = daemon.port
    agent = start_agent(daemon.address, "gamma", "gamma-1", kernel_cache_dir)
    try:
        wait_for(lambda: agent_names(daemon) == {"gamma-1"}, what="agent joined")
        agent.send_signal(signal.SIGKILL)
        agent.wait()
        wait_for(lambda: not agent_names(daemon), what="dead agent expired")
        agent = start_agent(daemon.address, "gamma", "gamma-1", kernel_cache_dir)
        wait_for(lambda: agent_names(daemon) == {"gamma-1"}, what="restarted agent rejoined")

        daemon.stop()
        daemon = start_daemon(log, listen=f"127.0.0.1:{port}")
        wait_for(lambda: agent_names(daemon) == {"gamma-1"}, timeout_s=90, what="agent back after daemon restart")
        with FleetClient(daemon.address) as client:
            job = client.submit(JobSpec("matmul(M=2,N=2,K=1)", "gamma", target="sleep", trials=5, timing=FAST))
            final = list(client.watch(job.job_id))[-1]
        assert final.state == "done" and final.done == 5
    finally:
        stop_all([agent])
        daemon.stop()


def test_sigterm_finishes_in_flight_work_and_leaves(log, kernel_cache_dir):
    daemon = start_daemon(log)
    agent = start_agent(daemon.address, "delta", "delta-1", kernel_cache_dir, parallel=1)
    try:
        wait_for(lambda: agent_names(daemon) == {"delta-1"}, what="agent joined")
        with FleetClient(daemon.address) as client:
            job = client.submit(JobSpec("matmul(M=2,N=2,K=300)", "delta", target="sleep", trials=4, timing=FAST))
            wait_for(lambda: any(a.leases for a in daemon.scheduler.agents()), what="a lease in flight")
            agent.send_signal(signal.SIGTERM)
            assert agent.wait(timeout=60) == 0
            # What it held was measured, reported and logged before it left; nothing had to expire.
            trials = wait_for(lambda: log.trials(workload_key="matmul(M=2,N=2,K=300)"), what="result logged")
            held = 2  # an agent leases twice its --parallel, so its next candidate is at hand
            assert 1 <= len(trials) <= held
            assert all(t.status == "ok" and t.agent == "delta-1" for t in trials)
            assert daemon.scheduler.expired_leases == 0
            assert not agent_names(daemon)
            assert client.job(job.job_id).state == "running"  # the rest waits for another agent
            assert client.cancel(job.job_id).state == "cancelled"
    finally:
        stop_all([agent])
        daemon.stop()


def test_template_version_mismatch_is_refused_on_both_sides(log, kernel_cache_dir, caplog, capsys):
    """An agent of other templates exits with EXIT_REFUSED (which the systemd unit does not restart),
    and ``tuner agents`` shows its versions against the daemon's until it comes back on the daemon's."""
    from measure_agent.cli import EXIT_REFUSED
    from measure_agent.templates import default_catalog, testing_catalog
    from tuner.cli import main as tuner_main

    daemon = start_daemon(log)
    agent = None
    try:
        for attempt in (1, 2):
            agent = start_agent(daemon.address, "eps", "wrong-version", kernel_cache_dir, templates="default")
            _, err = agent.communicate(timeout=120)
            assert agent.returncode == EXIT_REFUSED
            assert "refused" in err and "templates version" in err
        assert not agent_names(daemon)
        assert any("refused agent" in r.getMessage() for r in caplog.records)
        theirs, ours = default_catalog().version, testing_catalog().version
        assert theirs != ours
        with FleetClient(daemon.address) as client:
            [refused] = client.agents().refused
        assert (refused.name, refused.key, refused.peer) == ("wrong-version", "eps", "ipv4:127.0.0.1")
        assert (refused.template_version, refused.expected_template_version) == (theirs, ours)
        assert refused.attempts == 2 and refused.version_mismatch and "templates version" in refused.reason

        capsys.readouterr()
        assert tuner_main(["agents", "--tracker", daemon.address]) == 0
        out = capsys.readouterr().out
        assert "refused registrations" in out
        assert f"wrong-version        key eps from ipv4:127.0.0.1: agent " in out
        assert f"templates {theirs} (daemon: {ours})" in out and "2 attempts" in out
        assert tuner_main(["agents", "--tracker", daemon.address, "--json"]) == 0
        [shown] = json.loads(capsys.readouterr().out)["refused"]
        assert (shown["template_version"], shown["expected_template_version"]) == (theirs, ours)

        # Upgraded (here: the daemon's templates), it joins and is no longer listed as refused.
        agent = start_agent(daemon.address, "eps", "wrong-version", kernel_cache_dir)
        wait_for(lambda: agent_names(daemon) == {"wrong-version"}, what="the agent back on the daemon's templates")
        with FleetClient(daemon.address) as client:
            assert client.agents().refused == ()
    finally:
        if agent is not None:
            stop_all([agent])
        daemon.stop()


def test_job_without_agents_is_queued_and_wait_timeout_fails_it(log):
    daemon = start_daemon(log)
    try:
        with FleetClient(daemon.address) as client:
            waiting = client.submit(JobSpec("matmul(M=2,N=2,K=1)", "nobody", target="sleep", trials=2, timing=FAST))
            # nothing is proposed before an agent says what device it is: the job waits, queued
            wait_for(lambda: client.job(waiting.job_id).state == "queued", what="the job queued")
            assert client.job(waiting.job_id).queued_candidates == 0
            fails = client.submit(JobSpec("matmul(M=2,N=2,K=1)", "nobody-else", target="sleep", trials=2, timing=FAST,
                                  wait_timeout_s=1.0))
            final = list(client.watch(fails.job_id))[-1]
            assert final.state == "failed" and "no agent of key" in final.message
            cancelled = client.cancel(waiting.job_id)
            assert cancelled.state == "cancelled"
    finally:
        daemon.stop()


def test_transfer_and_time_budget_reach_the_job_and_are_kept_for_resuming(log):
    from tuner.daemon.jobs import _spec_of

    daemon = start_daemon(log)
    try:
        with FleetClient(daemon.address) as client:
            plain = client.submit(JobSpec("matmul(M=2,N=2,K=1)", "nobody", target="sleep", trials=2, timing=FAST))
            steered = client.submit(JobSpec("matmul(M=2,N=2,K=1)", "nobody", target="sleep", trials=2, timing=FAST,
                                    transfer=False, time_budget_s=30.0))
            requests = {job_id: daemon.jobs.get(job_id).spec for job_id in (plain.job_id, steered.job_id)}
            assert (requests[plain.job_id].transfer, requests[plain.job_id].time_budget_s) == (True, None)
            assert (requests[steered.job_id].transfer, requests[steered.job_id].time_budget_s) == (False, 30.0)
            stored = {record.id: _spec_of(record) for record in log.jobs()}
            assert stored[steered.job_id] == requests[steered.job_id]  # what a restarted daemon resumes
            assert stored[plain.job_id] == requests[plain.job_id]
            from measure_agent.protocol.errors import InvalidRequest

            with pytest.raises(InvalidRequest, match="time budget must not be negative"):
                client.submit(JobSpec("matmul(M=2,N=2,K=1)", "nobody", target="sleep", time_budget_s=-1.0))
            for job_id in requests:
                client.cancel(job_id)
    finally:
        daemon.stop()


def test_invalid_requests_get_clear_errors(log):
    from measure_agent.protocol.errors import InvalidRequest, NotFound

    daemon = start_daemon(log)
    daemon.scheduler.register("k", "k-1", {}, parallel=1)  # pin values are judged in the space of the key's device
    try:
        with FleetClient(daemon.address) as client:
            with pytest.raises(InvalidRequest, match="unknown operator"):
                client.submit(JobSpec("conv9(M=1)", "k"))
            with pytest.raises(InvalidRequest, match="invalid device key"):
                client.submit(JobSpec("matmul(M=2,N=2,K=2)", "bad key!"))
            with pytest.raises(InvalidRequest, match="unknown target 'fpga'"):
                client.submit(JobSpec("matmul(M=2,N=2,K=2)", "k", target="fpga"))
            with pytest.raises(InvalidRequest, match="no template for conv2d_nchw on target cpu"):
                client.submit(JobSpec("conv2d_nchw(N=1,C=1,H=4,W=4,K=1,R=1,S=1)", "k"))  # not in the testing catalog
            with pytest.raises(InvalidRequest, match="more than the limit"):
                client.submit(JobSpec("matmul(M=65536,N=65536,K=2)", "k"))
            with pytest.raises(InvalidRequest, match="cannot pin unknown knob"):
                client.submit(JobSpec("matmul(M=2,N=2,K=2)", "k", pins=("no_such_knob=1",)))
            with pytest.raises(InvalidRequest, match="not one of"):
                client.submit(JobSpec("matmul(M=2,N=2,K=2)", "k", pins=("behaviour=explode",)))
            with pytest.raises(NotFound):
                client.job(999)
            assert client.jobs() == []  # nothing bad got in, and the daemon still answers
    finally:
        daemon.stop()


def test_priority_and_fair_share_between_jobs_of_one_key():
    from measure_agent.engine import MeasureInput
    from measure_agent.space import Config
    from measure_agent.workload import parse_workload
    from tuner.daemon.scheduler import Scheduler

    scheduler = Scheduler(heartbeat_interval_s=1, agent_timeout_s=5)
    agent = scheduler.register("k", "a", {}, parallel=1)
    item = MeasureInput(parse_workload("matmul(M=1,N=1,K=1)"), Config((("variant", 0),)), "sleep")
    scheduler.submit("k", 1, 0, [item] * 4, FAST)
    scheduler.submit("k", 2, 0, [item] * 4, FAST)
    scheduler.submit("k", 3, 5, [item] * 2, FAST)
    order = [c.batch.job_id for c in scheduler.lease(agent.agent_id, 10, 0)]
    assert order[:2] == [3, 3]  # higher priority first
    assert order[2:] == [1, 2, 1, 2, 1, 2, 1, 2]  # equal priority: turns


def test_late_result_of_an_expired_lease_is_rejected():
    from measure_agent.engine import MeasureInput, MeasureResult, MeasureStatus
    from measure_agent.space import Config
    from measure_agent.workload import parse_workload
    from tuner.daemon.scheduler import Scheduler

    now = [0.0]
    scheduler = Scheduler(heartbeat_interval_s=1, agent_timeout_s=5, clock=lambda: now[0])
    slow = scheduler.register("k", "slow", {}, parallel=1)
    item = MeasureInput(parse_workload("matmul(M=1,N=1,K=1)"), Config((("variant", 0),)), "sleep")
    batch = scheduler.submit("k", 1, 0, [item], FAST)
    [lease] = scheduler.lease(slow.agent_id, 1, 0)
    old_lease_id = lease.lease_id
    now[0] = 10.0  # slow stays silent past the timeout
    fast = scheduler.register("k", "fast", {}, parallel=1)
    [again] = scheduler.lease(fast.agent_id, 1, 0)
    assert again.index == 0 and again.lease_id != old_lease_id
    ok = MeasureResult(MeasureStatus.OK, costs=(1.0,))
    assert not scheduler.report(slow.agent_id, old_lease_id, ok)  # presumed dead: rejected
    assert scheduler.report(fast.agent_id, again.lease_id, ok)
    assert not scheduler.report(fast.agent_id, again.lease_id, ok)  # never twice
    assert batch.remaining == 0 and batch.results == [ok]


def test_fleet_cli_commands(log, kernel_cache_dir, cli_env, tmp_path):
    daemon = start_daemon(log)
    agent = start_agent(daemon.address, "cli", "cli-agent-1", kernel_cache_dir)

    def tuner(*args, check=True):
        proc = subprocess.run([sys.executable, "-m", "tuner", *args, "--tracker", daemon.address],
                              capture_output=True, text=True, env=cli_env, timeout=120)
        if check:
            assert proc.returncode == 0, proc.stderr
        return proc

    try:
        wait_for(lambda: agent_names(daemon) == {"cli-agent-1"}, what="agent joined")
        agents = json.loads(tuner("agents", "--json").stdout)
        assert [a["name"] for a in agents["agents"]] == ["cli-agent-1"]
        assert agents["keys"][0]["key"] == "cli"
        out = tuner("submit", "--workload", "matmul(M=2,N=2,K=5)", "--target", "sleep", "--rpc-key", "cli",
                    "--trials", "6", "--repeat", "1").stdout
        job_id = out.strip().splitlines()[-1].split()[-1]
        assert job_id.isdigit()
        waited = tuner("wait", job_id).stdout
        assert "GFLOPS" in waited and "6 in the log" in waited
        status = json.loads(tuner("status", job_id, "--json").stdout)
        assert status["state"] == "done" and status["done"] == 6
        assert job_id in tuner("jobs").stdout
        tuned = tuner("tune", "--workload", "matmul(M=2,N=2,K=5)", "--target", "sleep", "--rpc-key", "cli",
                      "--trials", "8", "--repeat", "1").stdout
        assert "2 measured now, 8 in the log" in tuned
        missing = tuner("status", "4242", check=False)
        assert missing.returncode == 1 and "no job 4242" in missing.stderr and "Traceback" not in missing.stderr
    finally:
        stop_all([agent])
        daemon.stop()


def test_an_agent_answers_a_config_outside_its_space_as_invalid_and_goes_on(log, kernel_cache_dir):
    """Agents check every config against their own installed templates before building it."""
    import threading

    from measure_agent.agent import Agent
    from measure_agent.engine import MeasureInput, MeasureStatus
    from measure_agent.space import Config
    from measure_agent.workload import parse_workload

    daemon = start_daemon(log)
    agent = Agent(daemon.address, "inproc", name="inproc", catalog="testing", cache_dir=kernel_cache_dir,
                  lease_wait_s=0.2)
    thread = threading.Thread(target=agent.run, daemon=True)
    thread.start()
    try:
        wait_for(lambda: any(a.key == "inproc" for a in daemon.scheduler.agents()), what="the agent joined")
        workload = parse_workload("matmul(M=2,N=2,K=1)")
        items = [MeasureInput(workload, Config((("variant", 10**9),)), "sleep"),  # not a variant it knows
                 MeasureInput(workload, Config((("variant", 3),)), "sleep")]
        batch = daemon.scheduler.submit("inproc", -1, 0, items, FAST)
        wait_for(lambda: batch.remaining == 0, what="both answered")
        assert batch.results[0].status is MeasureStatus.INVALID_CONFIG and "variant" in batch.results[0].message
        assert batch.results[1].status is MeasureStatus.OK
    finally:
        agent.stop()
        thread.join(30)
        daemon.stop()
    assert not thread.is_alive()


def test_queued_work_wakes_waiting_leases_one_per_candidate_or_all_under_a_requirement():
    """A waiting lease gets queued work at once (not at the end of its wait): a batch wakes one
    waiter per candidate, and every waiter when only some agents may take it."""
    import threading

    from measure_agent.engine import MeasureInput
    from measure_agent.space import Config
    from measure_agent.workload import parse_workload
    from tuner.daemon.scheduler import Scheduler

    scheduler = Scheduler(heartbeat_interval_s=600, agent_timeout_s=1200)  # no re-check while waiting
    item = MeasureInput(parse_workload("matmul(M=1,N=1,K=1)"), Config((("variant", 0),)), "sleep")

    def wait_in_lease(agents, wait_s):
        got = {}
        threads = [threading.Thread(target=lambda a=a: got.__setitem__(a.name, scheduler.lease(a.agent_id, 1, wait_s)))
                   for a in agents]
        for t in threads:
            t.start()
        wait_for(lambda: sum(len(c._waiters) for c in scheduler._work.values()) == len(agents), 10, "leases waiting")
        return got, threads

    plain = [scheduler.register("k", f"a{i}", {}, parallel=1) for i in range(3)]
    got, threads = wait_in_lease(plain, 600.0)
    scheduler.submit("k", 1, 0, [item] * 2, FAST)
    # A lease that missed its wake-up sleeps out its 600 s wait: never answered here.
    wait_for(lambda: len(got) == 2, 30, "two leases answered")
    assert sorted(len(c) for c in got.values()) == [1, 1]
    scheduler.leave(next(a for a in plain if a.name not in got).agent_id)  # ends the third wait
    for t in threads:
        t.join(40)
    for agent in plain:
        scheduler.leave(agent.agent_id)

    cpu = scheduler.register("r", "cpu", {}, parallel=1)
    gpu = scheduler.register("r", "gpu", {"gpu": "h200"}, parallel=1)
    got, threads = wait_in_lease([cpu, gpu], 600.0)
    scheduler.submit("r", 2, 0, [item], FAST, requirement=lambda info: "gpu" in info)
    wait_for(lambda: "gpu" in got, 30, "the lease of the agent that meets the requirement answered")
    assert len(got["gpu"]) == 1
    scheduler.leave(cpu.agent_id)
    for t in threads:
        t.join(40)


def test_a_driver_gathering_results_wakes_when_enough_arrived_not_at_each():
    """``wait_for_results`` returns once the count is reached (True), at its timeout or at a nudge
    (False); results before the count do not wake it."""
    import threading
    import time

    from measure_agent.engine import MeasureInput, MeasureResult, MeasureStatus
    from measure_agent.space import Config
    from measure_agent.workload import parse_workload
    from tuner.daemon.scheduler import Scheduler

    scheduler = Scheduler(heartbeat_interval_s=600, agent_timeout_s=1200)
    agent = scheduler.register("k", "a", {}, parallel=1)
    item = MeasureInput(parse_workload("matmul(M=1,N=1,K=1)"), Config((("variant", 0),)), "sleep")
    scheduler.submit("k", 1, 0, [item] * 6, FAST)
    leases = scheduler.lease(agent.agent_id, 6, 0)
    ok = MeasureResult(MeasureStatus.OK, costs=(1.0,))
    start = scheduler.results_accepted
    assert not scheduler.wait_for_results(start + 1, 0.05)  # nothing came: the timeout

    outcome = {}
    waiter = threading.Thread(target=lambda: outcome.setdefault("reached", scheduler.wait_for_results(start + 3, 60)))
    waiter.start()
    wait_for(lambda: scheduler._enough_results._waiters, 10, "the driver waiting")
    scheduler.report_many(agent.agent_id, [(leases[0].lease_id, ok), (leases[1].lease_id, ok)])
    time.sleep(0.1)
    assert waiter.is_alive()  # two of three: still gathering
    scheduler.report(agent.agent_id, leases[2].lease_id, ok)
    waiter.join(10)
    assert outcome == {"reached": True} and scheduler.results_accepted == start + 3

    outcome.clear()
    waiter = threading.Thread(target=lambda: outcome.setdefault("reached", scheduler.wait_for_results(start + 10, 60)))
    waiter.start()
    wait_for(lambda: scheduler._enough_results._waiters, 10, "the driver waiting")
    scheduler.nudge()  # a job started, or the daemon stops: step now
    waiter.join(10)
    assert outcome == {"reached": False}


def test_a_cancelled_job_queues_nothing_more():
    """A driver that gathered results before a step always finds some, so the job would never reach
    the check its collect makes when none is ready: submitting is where a cancelled job stops."""
    import threading

    import pytest

    from measure_agent.engine import MeasureInput
    from measure_agent.space import Config
    from measure_agent.workload import parse_workload
    from tuner.daemon.fleet_measurer import FleetMeasurer
    from tuner.daemon.scheduler import Scheduler
    from tuner.measure import MeasurementAborted

    scheduler = Scheduler(heartbeat_interval_s=1, agent_timeout_s=5)
    scheduler.register("k", "a", {}, parallel=1)
    cancel = threading.Event()
    measurer = FleetMeasurer(scheduler, "k", 1, 0, FAST, "v", cancel)
    item = MeasureInput(parse_workload("matmul(M=1,N=1,K=1)"), Config((("variant", 0),)), "sleep")
    measurer.submit([item])
    assert scheduler.job_counts(1) == (1, 0)
    cancel.set()
    with pytest.raises(MeasurementAborted) as aborted:
        measurer.submit([item])
    assert aborted.value.job_status == "cancelled" and scheduler.job_counts(1) == (0, 0)

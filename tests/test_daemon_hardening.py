"""The daemon holds against hostile clients and faulty agents: bounded input, lease deadlines,
results checked on arrival, client calls that cannot starve agents, bounded memory."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from measure_agent.engine import MeasureResult, MeasureStatus, MeasureInput, TimingConfig
from measure_agent.protocol.errors import Busy, InvalidRequest
from measure_agent.protocol.v1 import fleet_pb2 as pb
from measure_agent.protocol.v1 import fleet_pb2_grpc as pb_grpc
from measure_agent.templates import testing_catalog
from measure_agent.workload import parse_workload
from tuner.daemon import FleetClient
from tuner.daemon import jobs as daemon_jobs
from tuner.daemon import service as daemon_service
from tuner.daemon.client import spec_to_proto
from tuner.daemon.fleet_measurer import FleetMeasurer
from tuner.daemon.limits import OVERDUE_LEASES_TO_QUARANTINE, ClientCallLimiter, ClientCallsFull
from tuner.daemon.scheduler import DEADLINE_HEAP_SLACK, Scheduler
from tuner.fleet import JobSpec
from tuner.log import TuningLog

from fleet_helpers import FakeAgent, RawStream, start_daemon, wait_for

pytestmark = pytest.mark.timeout(120)
FAST = TimingConfig(repeat=1, warmup=0, run_timeout_s=5, build_timeout_s=5)
SLEEP_JOB = JobSpec("matmul(M=2,N=2,K=1)", "fake", target="sleep", strategy="random", trials=6, timing=FAST)


@pytest.fixture()
def log(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'hard.db'}") as opened:
        yield opened


def _raw_submit(address: str, message: pb.JobSpec) -> grpc.RpcError:
    with grpc.insecure_channel(address) as channel:
        with pytest.raises(grpc.RpcError) as caught:
            pb_grpc.ClientServiceStub(channel).SubmitJob(message, timeout=30)
    return caught.value


# -- 1. every input from the network is bounded -------------------------------------------------------
@pytest.mark.parametrize("timing, message", [
    (dict(number=2**31 - 1), "timing number must be at most"),
    (dict(repeat=2**31 - 1), "timing repeat must be at most"),
    (dict(run_timeout_s=float("inf")), "timing run_timeout_s must be a finite number"),
    (dict(build_timeout_s=1e300), "timing build_timeout_s must be at most"),
    (dict(min_repeat_ms=float("nan")), "timing min_repeat_ms must be a finite number"),
])
def test_timing_beyond_its_limits_is_refused_at_submit(log, timing, message):
    daemon = start_daemon(log)
    try:
        request = spec_to_proto(SLEEP_JOB)
        for name, value in timing.items():
            setattr(request.timing, name, value)
        error = _raw_submit(daemon.address, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.details()
        assert "\n" not in error.details() and log.jobs() == []
    finally:
        daemon.stop()


def test_agents_clamp_the_timing_they_receive():
    from measure_agent.protocol.convert import timing_from_proto

    hostile = pb.Timing(number=2**31 - 1, repeat=2**31 - 1, run_timeout_s=float("inf"), build_timeout_s=1e300,
                        min_repeat_ms=float("nan"), warmup=2**31 - 1)
    clamped = timing_from_proto(hostile, clamp=True)
    assert clamped.number == 1_000_000 and clamped.repeat == 1000 and clamped.warmup == 1000
    assert clamped.run_timeout_s == 3600 and clamped.build_timeout_s == 3600 and clamped.min_repeat_ms == 0
    with pytest.raises(ValueError):
        timing_from_proto(hostile)


@pytest.mark.parametrize("change, message", [
    (dict(workload="matmul(M=2,N=2,K=1)" + "x" * 5000), "workload must be at most 1000 characters"),
    (dict(device_key="k" * 100_000), "invalid device key"),
    (dict(pins=["variant=1"] * 100), "at most 64 pins"),
    (dict(constraints=["variant < 5 " + " " * 5000]), "at most 2000 characters"),
    (dict(priority=2**31 - 1), "priority must be an integer from -1000 to 1000"),
    (dict(wait_timeout_s=float("inf")), "wait timeout must be a finite number"),
])
def test_oversized_job_fields_are_refused_with_the_limit_and_a_short_echo(log, change, message):
    daemon = start_daemon(log)
    try:
        request = spec_to_proto(SLEEP_JOB)
        for name, value in change.items():
            if isinstance(value, list):
                getattr(request, name).extend(value)
            else:
                setattr(request, name, value)
        error = _raw_submit(daemon.address, request)
        assert error.code() == grpc.StatusCode.INVALID_ARGUMENT and message in error.details()
        assert len(error.details()) < 400 and "\n" not in error.details()  # the input is not echoed whole
    finally:
        daemon.stop()


@pytest.mark.parametrize("name, message", [
    ("a" * 3_000_000, "agent name must be at most 128 characters"),
    ("evil\x00name", "must be printable text"),
])
def test_agent_names_are_checked_at_registration(log, name, message):
    daemon = start_daemon(log)
    try:
        stream = RawStream(daemon.address)
        with pytest.raises(grpc.RpcError) as caught:
            stream.hello(key="k", name=name)
        stream.close()
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT and message in caught.value.details()
        assert daemon.scheduler.agents() == []
        [refused] = daemon.scheduler.refused()  # remembered for `tuner agents`, within the limits
        assert len(refused.name) <= 150 and "\x00" not in refused.name and refused.key == "k"
        assert message in refused.reason and not refused.version_mismatch
    finally:
        daemon.stop()


def test_refused_registrations_are_remembered_latest_first_within_a_bound_until_they_register():
    from tuner.daemon.limits import MAX_REFUSED_AGENTS_KEPT
    from tuner.fleet import RefusedAgent

    now = [0.0]
    scheduler = Scheduler(clock=lambda: now[0])
    for i in range(MAX_REFUSED_AGENTS_KEPT + 10):
        now[0] += 1.0
        scheduler.refuse(RefusedAgent(name=f"agent-{i}", key="k", peer="ipv4:10.0.0.1", template_version="old",
                                      expected_template_version="new"))
    now[0] += 1.0
    scheduler.refuse(RefusedAgent(name="agent-20", key="k", peer="ipv4:10.0.0.1"))
    refused = scheduler.refused()
    assert len(refused) == MAX_REFUSED_AGENTS_KEPT
    assert (refused[0].name, refused[0].attempts, refused[0].seconds_ago) == ("agent-20", 2, 0.0)
    assert (refused[1].name, refused[1].seconds_ago) == (f"agent-{MAX_REFUSED_AGENTS_KEPT + 9}", 1.0)
    assert "agent-0" not in {r.name for r in refused}  # the oldest went first
    scheduler.register("k", "agent-20", {}, parallel=1)
    assert "agent-20" not in {r.name for r in scheduler.refused()}


# -- 2. every lease has a deadline; an agent that keeps missing them is quarantined ------------------------
def test_a_lease_past_its_deadline_goes_to_another_agent_and_repeat_offenders_are_quarantined():
    now = [0.0]
    scheduler = Scheduler(heartbeat_interval_s=1.0, agent_timeout_s=5.0, clock=lambda: now[0])
    stuck = scheduler.register("k", "stuck", {}, parallel=1)
    workload = parse_workload("matmul(M=2,N=2,K=1)")
    space = testing_catalog().get("matmul", "sleep").space(workload)
    timing = TimingConfig(build_timeout_s=2, run_timeout_s=1)
    batch = scheduler.submit("k", 1, 0, [MeasureInput(workload, space.make({"variant": i}), "sleep")
                                         for i in range(OVERDUE_LEASES_TO_QUARANTINE + 1)], timing)
    for round_ in range(OVERDUE_LEASES_TO_QUARANTINE):
        [lease] = scheduler.lease(stuck.agent_id, 1, 0)
        assert lease.deadline is not None and lease.deadline - now[0] < 120  # follows from the timing
        deadline = lease.deadline
        while now[0] <= deadline:  # it is alive (heartbeats), it just never reports
            now[0] += 1.0
            assert scheduler.heartbeat(stuck.agent_id)
        assert lease.deadline is None  # taken back
        assert not scheduler.report(stuck.agent_id, lease.lease_id, MeasureResult(MeasureStatus.OK, costs=(1.0,)))
    assert stuck.quarantined and stuck.overdue_leases == OVERDUE_LEASES_TO_QUARANTINE
    assert scheduler.lease(stuck.agent_id, 4, 0) == []  # no more work for it
    healthy = scheduler.register("k", "healthy", {}, parallel=1)
    taken = scheduler.lease(healthy.agent_id, 8, 0)
    assert len(taken) == OVERDUE_LEASES_TO_QUARANTINE + 1  # nothing was lost
    for candidate in taken:
        assert scheduler.report(healthy.agent_id, candidate.lease_id, MeasureResult(MeasureStatus.OK, costs=(1.0,)))
    assert batch.remaining == 0
    assert scheduler.parallelism("k") == 1  # the quarantined agent does not count as capacity


def test_a_jobs_view_of_the_fleet_follows_agents_and_collects_each_result_once():
    """The job's measurer keeps its parallelism between steps and its place in each batch's
    arrivals: both must still follow every join, departure, death and quarantine, and hand each
    result over exactly once, in whatever order and grouping the results arrive."""
    now = [0.0]
    scheduler = Scheduler(heartbeat_interval_s=1.0, agent_timeout_s=5.0, clock=lambda: now[0])
    measurer = FleetMeasurer(scheduler, "k", job_id=1, priority=0, timing=FAST, template_version="t",
                             cancel=threading.Event())
    assert measurer.parallelism == 0
    first = scheduler.register("k", "first", {}, parallel=2)
    assert measurer.parallelism == 2
    second = scheduler.register("k", "second", {}, parallel=3)
    scheduler.register("other", "elsewhere", {}, parallel=5)
    assert measurer.parallelism == 5
    scheduler.leave(second.agent_id)
    assert measurer.parallelism == 2

    workload = parse_workload("matmul(M=2,N=2,K=1)")
    space = testing_catalog().get("matmul", "sleep").space(workload)
    items = [MeasureInput(workload, space.make({"variant": i}), "sleep") for i in range(5)]
    measurer.submit(items[:3])
    measurer.submit(items[3:])
    leases = scheduler.lease(first.agent_id, 5, 0)
    assert len(leases) == 5
    ok = MeasureResult(MeasureStatus.OK, costs=(1.0,))
    scheduler.report_many(first.agent_id, [(leases[4].lease_id, ok), (leases[1].lease_id, ok)])
    collected = [item for item, _ in measurer.collect(0)]
    assert collected == [items[1], items[4]]
    assert measurer.collect(0) == []  # nothing new: nothing twice
    scheduler.report_many(first.agent_id, [(lease.lease_id, ok) for lease in (leases[0], leases[2], leases[3])])
    collected += [item for item, _ in measurer.collect(0)]
    assert sorted(collected, key=items.index) == items and len(collected) == 5
    assert measurer.batches_in_flight == 0  # both batches done: nothing left to look at

    now[0] += 6.0  # the agent falls silent past its timeout
    scheduler.expire_dead_agents()
    assert measurer.parallelism == 0
    late = scheduler.register("k", "late", {}, parallel=4)
    assert measurer.parallelism == 4
    measurer.submit([MeasureInput(workload, space.make({"variant": 9}), "sleep")])
    [lease] = scheduler.lease(late.agent_id, 1, 0)
    for _ in range(10_000):  # never reported: overdue, leased again, until it is quarantined
        if late.quarantined:
            break
        now[0] += 1.0
        assert scheduler.heartbeat(late.agent_id)
        if lease.deadline is None and not late.quarantined:
            [lease] = scheduler.lease(late.agent_id, 1, 0)
    assert late.quarantined
    assert measurer.parallelism == 0


def test_quarantined_agents_are_shown_by_tuner_agents(log, capsys):
    from tuner.cli import main

    daemon = start_daemon(log)
    try:
        agent = daemon.scheduler.register("k", "stuck", {}, parallel=1)
        agent.quarantined, agent.overdue_leases = True, 3
        assert main(["agents", "--tracker", daemon.address]) == 0
        assert "QUARANTINED (3 leases not reported in time" in capsys.readouterr().out
        with FleetClient(daemon.address) as client:
            [shown] = client.agents().agents
        assert shown.quarantined and shown.overdue_leases == 3
    finally:
        daemon.stop()


# -- 5. a bad result never fails a job -------------------------------------------------------------------
def test_bad_results_become_failed_trials_and_the_job_finishes_its_budget(log):
    bad = {0: pb.Measurement(status="ok", costs=[float("inf")]),
           1: pb.Measurement(status="ok", costs=[1e-3], compile_time_s=-5.0),
           2: pb.Measurement(status="exploded"),
           3: pb.Measurement(status="ok", costs=[1e-3], details_json="[" * 100_000)}
    daemon = start_daemon(log)
    agent = FakeAgent(daemon.address, cost_of=lambda n: bad.get(n, 1e-3 * (n + 1)))
    try:
        with FleetClient(daemon.address) as client:
            job = client.submit(SLEEP_JOB)
            final = list(client.watch(job.job_id))[-1]
        assert final.state == "done" and final.done == SLEEP_JOB.trials
        trials = log.trials(job_id=job.job_id)
        assert len(trials) == SLEEP_JOB.trials
        failed = [t for t in trials if t.status != "ok"]
        assert len(failed) == len(bad) and all("invalid measurement" in t.message for t in failed)
        assert daemon.scheduler.job_counts(job.job_id) == (0, 0)  # nothing left queued or leased
    finally:
        agent.stop()
        daemon.stop()


# -- 4. agents are never starved by clients ---------------------------------------------------------------
def test_the_limiter_counts_calls_overall_and_per_host():
    limiter = ClientCallLimiter(total=3, per_peer=2)
    with limiter.call("ipv4:10.0.0.1:5000"), limiter.call("ipv4:10.0.0.1:5001"):
        with pytest.raises(ClientCallsFull, match="from one host"):
            with limiter.call("ipv4:10.0.0.1:6000"):
                pass
        with limiter.call("ipv4:10.0.0.2:5000"):
            with pytest.raises(ClientCallsFull, match="serving 3 client calls"):
                with limiter.call("ipv4:10.0.0.3:5000"):
                    pass
    assert limiter.busy == 0


def test_hundreds_of_open_client_calls_do_not_starve_the_agents(log):
    daemon = start_daemon(log, heartbeat_interval_s=0.3, agent_timeout_s=2.0)
    agent = FakeAgent(daemon.address, cost_of=lambda n: 1e-3 * (n + 1))
    clients = [FleetClient(daemon.address, timeout_s=60) for _ in range(8)]
    outcomes: list[str] = []

    def hang(client: FleetClient) -> None:  # a Measure for a key no agent serves: it would wait
        try:
            client.measure("matmul(M=2,N=2,K=1)", "nobody", ['{"variant": 1}'], target="sleep")
            outcomes.append("answered")
        except Busy:
            outcomes.append("busy")
        except Exception as exc:  # noqa: BLE001 - the channel closed under it at the end
            outcomes.append(type(exc).__name__)

    threads = [threading.Thread(target=hang, args=(clients[i % len(clients)],), daemon=True) for i in range(300)]
    try:
        with FleetClient(daemon.address) as client:
            job = client.submit(SLEEP_JOB)
        for thread in threads:
            thread.start()
        wait_for(lambda: outcomes.count("busy") >= 300 - 16, what="calls beyond the limit refused", timeout_s=60)
        # while the flood holds every client slot it may, the agent still heartbeats, leases and reports
        wait_for(lambda: daemon.jobs.get(job.job_id).state == "done", what="the job finished", timeout_s=60)
        assert daemon.jobs.get(job.job_id).done == SLEEP_JOB.trials
        assert [a.name for a in daemon.scheduler.agents()] == ["fake-1"]  # never presumed dead
        assert daemon.scheduler.expired_leases == 0
    finally:
        for client in clients:
            client.close()
        for thread in threads:
            thread.join(timeout=30)
        agent.stop()
    def answered() -> bool:
        try:
            return client.job(job.job_id).state == "done"
        except Busy:  # the server notices closed calls within a poll interval
            return False

    try:
        with FleetClient(daemon.address) as client:  # the flood is over: the slots are free again
            wait_for(answered, what="client slots freed", timeout_s=30)
    finally:
        daemon.stop()


# -- 7. bounded memory -----------------------------------------------------------------------------------
def test_finished_jobs_leave_memory_and_jobs_are_listed_in_pages(log, monkeypatch):
    monkeypatch.setattr(daemon_jobs, "FINISHED_JOBS_KEPT", 2)
    monkeypatch.setattr(daemon_service, "MAX_LISTED_JOBS", 1)
    daemon = start_daemon(log)
    agent = FakeAgent(daemon.address)
    try:
        with FleetClient(daemon.address) as client:
            ids = []
            for k in range(1, 5):
                job = client.submit(JobSpec(f"matmul(M=2,N=2,K={k})", "fake", target="sleep", strategy="random",
                                            trials=2, timing=FAST))
                assert list(client.watch(job.job_id))[-1].state == "done"
                ids.append(job.job_id)
            assert [j.job_id for j in client.jobs()] == ids[-2:]  # two pages of one
            old = client.job(ids[0])  # forgotten by memory, served from the log
            assert old.state == "done" and old.done == 2 and old.best_mean_s is not None
    finally:
        agent.stop()
        daemon.stop()


# -- 3. a costly constraint cannot stall the daemon ------------------------------------------------------
def test_a_costly_constraint_is_refused_within_its_budget_by_the_daemon(log, monkeypatch):
    import tuner.steering
    from measure_agent.templates import default_catalog
    from test_bounded_input import COSTLY, heavy_constraint, matmul_space

    monkeypatch.setattr(tuner.steering, "CONSTRAINT_CHECK_BUDGET_S", 0.5)
    daemon = start_daemon(log)
    daemon.jobs.catalog = default_catalog()  # the real matmul space, 8 knobs tied by one constraint
    try:
        with FleetClient(daemon.address) as client:
            spec = JobSpec("matmul_512x512x512", "k", constraints=(heavy_constraint(matmul_space().knob_names),))
            with pytest.raises(InvalidRequest, match="is too costly to check") as caught:
                client.submit(spec)
            # refused by its budget (the pytest timeout bounds the wait), in one line
            assert "took over 0.5 s" in str(caught.value) and "\n" not in str(caught.value)
            for text in COSTLY:  # CPU- or memory-bombs: refused at once, one line each
                with pytest.raises(InvalidRequest) as caught:
                    client.submit(JobSpec("matmul_512x512x512", "k", constraints=(text,)))
                assert "\n" not in str(caught.value)
            assert client.jobs() == [] and log.jobs() == []
    finally:
        daemon.stop()


def test_the_lease_deadline_heap_stays_bounded_however_many_leases_end():
    """Every lease pushes a deadline minutes away; reported leases must not leave their entries
    behind for those minutes (at a thousand results a second: hundreds of thousands), while a lease
    that is still held keeps its deadline through the compaction."""
    now = [0.0]
    scheduler = Scheduler(heartbeat_interval_s=1.0, agent_timeout_s=5.0, clock=lambda: now[0])
    agent = scheduler.register("k", "busy", {}, parallel=1)
    idle = scheduler.register("k", "idle", {}, parallel=1)
    workload = parse_workload("matmul(M=2,N=2,K=1)")
    space = testing_catalog().get("matmul", "sleep").space(workload)
    timing = TimingConfig(build_timeout_s=2, run_timeout_s=1)
    ok = MeasureResult(MeasureStatus.OK, costs=(1.0,))
    scheduler.submit("k", 1, 0, [MeasureInput(workload, space.make({"variant": 0}), "sleep")], timing)
    [kept] = scheduler.lease(idle.agent_id, 1, 0)  # held, never reported
    rounds = 3 * DEADLINE_HEAP_SLACK
    for i in range(rounds):
        scheduler.submit("k", 1, 0, [MeasureInput(workload, space.make({"variant": 1 + i % 1000}), "sleep")], timing)
        [candidate] = scheduler.lease(agent.agent_id, 1, 0)
        assert scheduler.report(agent.agent_id, candidate.lease_id, ok)
        assert scheduler.heartbeat(idle.agent_id)
        now[0] += 0.001  # a thousand results a second: no deadline passes
    assert scheduler.deadline_entries <= 2 * 1 + DEADLINE_HEAP_SLACK + 1
    assert kept.agent_id == idle.agent_id and kept.deadline is not None
    # the held lease's deadline survived the rebuilds: past it, the lease is taken back
    for _ in range(1000):
        if kept.deadline is None:
            break
        now[0] += 1.0
        assert scheduler.heartbeat(idle.agent_id) and scheduler.heartbeat(agent.agent_id)
    assert kept.deadline is None and scheduler.expired_leases == 1

"""Pinned knobs, constraints and target strings (issue: control over what is tuned)."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest

from measure_agent.engine import MeasureInput, MeasureResult, MeasureStatus, TimingConfig
from measure_agent.space import BoolKnob, ChoiceKnob, Config, ConfigSpace, SplitKnob
from measure_agent.templates import testing_catalog as fault_catalog
from measure_agent.workload import parse_workload
from tuner.daemon import FleetClient
from tuner.daemon.scheduler import Scheduler
from tuner.fleet import JobSpec
from tuner.job import TuneOptions, TuningJob
from tuner.log import TuningLog
from tuner.measure import SyncMeasurer
from tuner.steering import SteeringError, parse_pin, parse_target, steer_space

from fleet_helpers import start_daemon, wait_for


def space():
    return ConfigSpace([SplitKnob("tile_m", 64, ((1, 2, 4, 8), (1, 2, 4, 8))), SplitKnob("tile_n", 64, ((1, 4, 16),)),
                        ChoiceKnob("order", ("mn", "nm")), BoolKnob("parallel")])


def test_pins_and_constraints_narrow_the_space():
    steered = steer_space(space(), [parse_pin("parallel=true"), parse_pin("order=nm")], ["tile_m * tile_n <= 64"])
    configs = list(steered.iter_valid())
    assert configs and len(configs) == steered.size < space().size
    for c in configs:
        assert c["parallel"] is True and c["order"] == "nm"
        assert (c["tile_m"][1] * c["tile_m"][2]) * c["tile_n"][1] <= 64  # split knobs stand for tile sizes
    pinned_split = steer_space(space(), [parse_pin("tile_n=[4,16]")])
    assert {c["tile_n"] for c in pinned_split.iter_valid()} == {(4, 16)}


@pytest.mark.parametrize(
    "pins, constraints, fragment",
    [
        (["nope=1"], [], "cannot pin unknown knob 'nope'"),
        (["order=zz"], [], "cannot pin order=zz"),
        (["tile_n=[3,3]"], [], "cannot pin tile_n=[3,3]"),
        (["parallel"], [], "--pin takes KNOB=VALUE"),
        ([], ["tile_m > 10000"], "leave no valid config"),
        ([], ["__import__('os').system('true')"], "not allowed"),
        ([], ["unknown_knob < 3"], "unknown_knob"),
        ([], ['tile_m < "a"'], "cannot be evaluated for tile_m=1"),  # fails only when evaluated
        ([], ["tile_m ** 99999999 > 1"], "too large"),
    ],
)
def test_bad_pins_and_constraints_are_refused(pins, constraints, fragment):
    with pytest.raises(SteeringError) as info:
        steer_space(space(), [parse_pin(p) for p in pins], constraints)
    assert fragment in str(info.value)


def test_target_strings():
    cuda = parse_target("cuda -arch=sm_72")
    assert cuda.family == "cuda" and cuda.matches({"compute_capability": "7.2"})
    assert not cuda.matches({"compute_capability": "8.0"})
    arm = parse_target("llvm -mcpu=cortex-a72")
    assert arm.family == "cpu" and arm.matches({"cpu_model": "ARM Cortex-A72", "isa_features": ["neon"]})
    assert not arm.matches({"cpu_model": "AMD EPYC"})
    avx = parse_target("llvm -mattr=+avx2,+fma,-avx512f")
    assert avx.matches({"isa_features": ["avx2", "fma"]})
    assert not avx.matches({"isa_features": ["avx2", "fma", "avx512f"]})
    assert parse_target("").family == parse_target("llvm").family == "cpu"
    for bad, fragment in [("fpga", "unknown target"), ("cuda -arch=72", "sm_XY"), ("llvm -mattr=avx2", "+feature"),
                          ("cuda -mcpu=x", "not understood")]:
        with pytest.raises(SteeringError) as info:
            parse_target(bad)
        assert fragment in str(info.value)


class Recording(SyncMeasurer):
    device_key, device_info, agent_name, template_version = "pins", {}, "pins", "testing"

    def measure_now(self, items):
        return [MeasureResult(MeasureStatus.OK, costs=(1.0 + i.config["variant"],)) for i in items]


def test_a_job_measures_only_pinned_and_constrained_configs(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'p.db'}") as log:
        options = TuneOptions(trials=12, strategy="random", pins=(("sleep_ms", "5"), ("behaviour", "ok")),
                              constraints=("variant < 20",))
        summary = TuningJob(parse_workload("matmul(M=2,N=2,K=2)"), Recording(), log, fault_catalog(), options).run()
        trials = log.trials()
        assert len(trials) == 12 == summary.measured_now
        assert all(t.config["sleep_ms"] == 5 and t.config["behaviour"] == "ok" and t.config["variant"] < 20
                   for t in trials)
        assert summary.default is None  # the default (sleep_ms 0) is outside the pins: not measured
        assert log.get_job(summary.job_id).options["pins"] == ["sleep_ms=5", "behaviour=ok"]


def test_only_matching_agents_lease_a_targeted_job():
    scheduler = Scheduler(heartbeat_interval_s=1, agent_timeout_s=5)
    plain = scheduler.register("k", "avx2", {"isa_features": ["avx2"]}, parallel=1)
    wide = scheduler.register("k", "avx512", {"isa_features": ["avx2", "avx512f"]}, parallel=1)
    item = MeasureInput(parse_workload("matmul(M=1,N=1,K=1)"), Config((("variant", 0),)), "cpu")
    needs = parse_target("llvm -mattr=+avx512f")
    scheduler.submit("k", 1, 0, [item], TimingConfig(), requirement=needs.matches)
    assert scheduler.lease(plain.agent_id, 4, 0) == []
    assert len(scheduler.lease(wide.agent_id, 4, 0)) == 1


def test_wait_timeout_counts_only_agents_that_meet_the_target():
    now = [100.0]
    scheduler = Scheduler(heartbeat_interval_s=1, agent_timeout_s=50, clock=lambda: now[0])
    scheduler.register("k", "avx2", {"isa_features": ["avx2"]}, parallel=1)
    needs = parse_target("llvm -mattr=+avx512f").matches
    now[0] = 110.0
    assert scheduler.seconds_without_agents("k", 100.0) == 0.0  # the key has an agent...
    assert scheduler.seconds_without_agents("k", 100.0, needs) == 10.0  # ...but none that can serve the job
    scheduler.register("k", "avx512", {"isa_features": ["avx2", "avx512f"]}, parallel=1)
    assert scheduler.seconds_without_agents("k", 100.0, needs) == 0.0


def test_a_job_proposes_nothing_before_an_agent_that_can_serve_it_registers():
    """The job's space is built for its agents' device (register tiles, GPU limits): a job
    submitted before any agent must wait for one, not propose from a generic space."""
    import threading

    from tuner.daemon.fleet_measurer import FleetMeasurer
    from tuner.measure import MeasurementAborted

    scheduler = Scheduler(heartbeat_interval_s=1, agent_timeout_s=5)
    needs = parse_target("llvm -mattr=+avx512f").matches
    measurer = FleetMeasurer(scheduler, "k", 1, 0, TimingConfig(), "v", threading.Event(), requirement=needs)
    waited = threading.Thread(target=measurer.wait_for_device)
    waited.start()
    scheduler.register("k", "avx2", {"isa_features": ["avx2"]}, parallel=1)
    waited.join(0.5)
    assert waited.is_alive()  # an agent that cannot serve the target does not count
    scheduler.register("k", "avx512", {"isa_features": ["avx2", "avx512f"]}, parallel=1)
    waited.join(5)
    assert not waited.is_alive() and measurer.device_info["isa_features"] == ["avx2", "avx512f"]

    cancel = threading.Event()
    nobody = FleetMeasurer(scheduler, "nobody", 2, 0, TimingConfig(), "v", cancel)
    cancel.set()
    with pytest.raises(MeasurementAborted) as aborted:
        nobody.wait_for_device()
    assert aborted.value.job_status == "cancelled"


def test_a_job_no_registered_agent_can_serve_is_refused(tmp_path):
    """More in tests/test_targets.py: recorded devices, tags, agents that left, the command line."""
    from measure_agent.protocol.errors import InvalidRequest

    with TuningLog(f"sqlite:///{tmp_path / 't.db'}") as log:
        daemon = start_daemon(log)
        try:
            daemon.scheduler.register("x86", "plain", {"isa_features": ["avx2"]}, parallel=1)
            with FleetClient(daemon.address) as client:
                with pytest.raises(InvalidRequest, match="target 'llvm -mattr=[+]avx512f' matches no agent of key "
                                                         "'x86': they have avx2"):
                    client.submit(JobSpec("matmul(M=2,N=2,K=2)", "x86", target="llvm -mattr=+avx512f", trials=2))
                assert client.jobs() == []
        finally:
            daemon.stop()


def test_pins_are_checked_against_the_space_of_the_jobs_devices(tmp_path):
    """A register tile exists on some ISAs only (48 = 3 AVX-512 vectors): the daemon judges pins by
    the devices of the job's key, not by a device-less space, and defers when it knows none."""
    from measure_agent.protocol.errors import InvalidRequest
    from measure_agent.templates import default_catalog
    from tuner.daemon import Daemon

    wide = ("tile_n=[2, 1, 48]",)
    workload = "matmul(M=64,N=64,K=64)"
    with TuningLog(f"sqlite:///{tmp_path / 't.db'}") as log:
        daemon = Daemon(log, "127.0.0.1:0", catalog=default_catalog(), heartbeat_interval_s=0.3,
                        agent_timeout_s=60).start()
        try:
            daemon.scheduler.register("wide", "avx512", {"isa_features": ["avx2", "fma", "avx512f"]}, parallel=1)
            daemon.scheduler.register("narrow", "avx2", {"isa_features": ["avx2", "fma"]}, parallel=1)
            with FleetClient(daemon.address) as client:
                accepted = client.submit(JobSpec(workload, "wide", trials=1, pins=wide))
                with pytest.raises(InvalidRequest, match=r"cannot pin tile_n=\[2, 1, 48\]: .* \(on its device\)$"):
                    client.submit(JobSpec(workload, "narrow", trials=1, pins=wide))
                # no agent of the key yet: only names and syntax now, the values when its device is known
                deferred = client.submit(JobSpec(workload, "later", trials=1, pins=wide))
                with pytest.raises(InvalidRequest, match="cannot pin unknown knob 'nope'"):
                    client.submit(JobSpec(workload, "later", trials=1, pins=("nope=1",)))
                with pytest.raises(InvalidRequest, match="names no knob"):
                    client.submit(JobSpec(workload, "later", trials=1, constraints=("1 < 2",)))
                assert {j.job_id for j in client.jobs()} == {accepted.job_id, deferred.job_id}
                client.cancel(accepted.job_id)
                # the key's agent turns out to be AVX2: the job fails saying why
                daemon.scheduler.register("later", "avx2", {"isa_features": ["avx2", "fma"]}, parallel=1)
                failed = wait_for(lambda: (j := client.job(deferred.job_id)).state == "failed" and j, 30, "failure")
                assert re.match(r"cannot pin tile_n=\[2, 1, 48\]: .* \(on the device of key 'later'\)$", failed.message)
                assert deferred.job_id in {j.id for j in log.jobs(status="failed")}
        finally:
            daemon.stop()


def test_cli_space_and_pin_errors(cli_env):
    def tuner(*args):
        return subprocess.run([sys.executable, "-m", "tuner", *args], capture_output=True, text=True, env=cli_env,
                              timeout=120)

    shown = json.loads(tuner("space", "--workload", "matmul_32x32x32", "--json").stdout)
    names = [k["name"] for k in shown["knobs"]]
    assert "parallel" in names and shown["size"] > 0 and shown["constraints"]
    narrowed = json.loads(tuner("space", "--workload", "matmul_32x32x32", "--json", "--pin", "parallel=false").stdout)
    assert narrowed["size"] < shown["size"]
    for args, fragment in [
        (["--pin", "nope=1"], "cannot pin unknown knob 'nope'"),
        (["--pin", "parallel=maybe"], "cannot pin parallel=maybe"),
        (["--constraint", "parallel and not parallel"], "leave no valid config"),
    ]:
        proc = tuner("tune", "--workload", "matmul_32x32x32", "--trials", "2", *args)
        assert proc.returncode == 2, proc.stderr
        assert fragment in proc.stderr and len(proc.stderr.strip().splitlines()) == 1

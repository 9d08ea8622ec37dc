"""The job contract: every JobSpec field, set once by a client, reaches the job the daemon runs.

Each field of :class:`JobSpec` needs a sample value below: a field added without one fails
``test_every_field_has_a_sample``, and with one, the round trips below carry it through the
protobuf messages, the log (what a restarted daemon resumes) and the daemon to the loop's
:class:`TuneOptions` and the job's measurer.
"""

from __future__ import annotations

import dataclasses
import json
import threading

import pytest

from measure_agent.engine import TimingConfig
from measure_agent.protocol.errors import InvalidRequest
from tuner.daemon import FleetClient
from tuner.daemon.client import spec_from_proto, spec_to_proto, status_from_proto, status_to_proto
from tuner.daemon.jobs import _spec_of
from tuner.fleet import JobSpec, JobSpecError, JobStatus
from tuner.job import TuneOptions
from tuner.log import TuningLog

from fleet_helpers import start_daemon

BASE = JobSpec("matmul(M=2,N=2,K=2,dtype=float32)", "spec-key")
# One valid value per field, different from BASE's (the testing catalog's matmul/cpu template).
SAMPLES = {
    "workload": "matmul(M=4,N=2,K=2,dtype=float32)",
    "device_key": "other-key",
    "target": "llvm -mattr=+avx2",
    "strategy": "random",
    "trials": 7,
    "seed": 11,
    "early_stopping": 5,
    "priority": 3,
    "timing": TimingConfig(number=2, repeat=4, min_repeat_ms=1.5, warmup=0, build_timeout_s=30, run_timeout_s=9),
    "wait_timeout_s": 12.5,
    "pins": ("behaviour=ok",),
    "constraints": ("variant <= 40",),
    "family": "matmul(M=1..8,N=2,K=2)",
    "transfer": False,
    "time_budget_s": 600.0,
    "reuse_share": 0.25,
}
FIELDS = [f.name for f in dataclasses.fields(JobSpec)]


def sample(name: str) -> JobSpec:
    return dataclasses.replace(BASE, **{name: SAMPLES[name]})


def test_every_field_has_a_sample():
    assert sorted(SAMPLES) == sorted(FIELDS)
    for name in FIELDS:
        assert SAMPLES[name] != getattr(BASE, name), f"the sample of {name} must differ from the default"


@pytest.mark.parametrize("name", FIELDS)
def test_each_field_survives_the_messages_and_the_log(name):
    spec = sample(name).validate()
    assert getattr(spec, name) != getattr(BASE.validate(), name)
    assert spec_from_proto(spec_to_proto(spec)) == spec
    assert JobSpec.from_json(json.loads(json.dumps(spec.to_json()))) == spec
    status = JobStatus(job_id=4, state="running", spec=spec, best_mean_s=1e-3, best_config={"variant": 2}, flops=8.0)
    assert status_from_proto(status_to_proto(status)) == status


class _Captured(Exception):
    """Stands in for the tuning loop: stops the job once its inputs are seen."""


@pytest.fixture()
def capture_runs(monkeypatch):
    """Replace the daemon's tuning loop by a recorder of what it is given."""
    seen: list[dict] = []
    ran = threading.Event()

    class RecordingJob:
        def __init__(self, workload, measurer, log, catalog, options, on_progress=None, job_id=None, on_note=None):
            seen.append({"workload": workload, "measurer": measurer, "options": options, "job_id": job_id})

        def steps(self, wait_s: float = 0.0):
            ran.set()
            raise _Captured("captured")
            yield  # a generator, as the loop's steps are

    monkeypatch.setattr("tuner.daemon.jobs.TuningJob", RecordingJob)
    return seen, ran


@pytest.mark.parametrize("name", FIELDS)
def test_each_field_reaches_the_job_the_daemon_runs(name, tmp_path, capture_runs):
    seen, ran = capture_runs
    spec = sample(name)
    with TuningLog(f"sqlite:///{tmp_path / 'spec.db'}") as log:
        daemon = start_daemon(log)
        try:
            # an agent the job can use, so it goes past waiting for a device (it never leases)
            daemon.scheduler.register(spec.device_key, "fake", {"isa_features": ["avx2"]}, parallel=1)
            with FleetClient(daemon.address) as client:
                status = client.submit(spec)
                assert ran.wait(30), "the job never started"
        finally:
            daemon.stop()
        [run] = seen
        expected = spec.validate()
        assert status.spec == expected
        assert _spec_of(log.get_job(status.job_id)) == expected  # what a restarted daemon resumes
        if name == "family":
            assert log.families("matmul", "float32")  # the daemon recorded the range
    options: TuneOptions = run["options"]
    assert options == TuneOptions.from_spec(expected)
    loop_view = {"trials": options.trials, "strategy": options.strategy, "seed": options.seed,
                 "early_stopping": options.early_stopping, "pins": tuple(f"{k}={v}" for k, v in options.pins),
                 "constraints": options.constraints, "transfer": options.transfer,
                 "time_budget_s": options.time_budget_s, "reuse_share": options.reuse_share,
                 "target": expected.target_spec.family}
    measurer = run["measurer"]
    measurer_view = {"device_key": measurer.device_key, "priority": measurer.priority, "timing": measurer.timing,
                     "wait_timeout_s": measurer.wait_timeout_s}
    if name in loop_view:
        want = expected.target_spec.family if name == "target" else getattr(expected, name)
        assert loop_view[name] == want
    elif name in measurer_view:
        assert measurer_view[name] == getattr(expected, name)
    elif name == "workload":
        assert run["workload"].key == expected.workload
    else:
        assert name == "family"


@pytest.mark.parametrize("changes, message", [
    ({"trials": 0}, "trials must be an integer from 1"),
    ({"seed": -1}, "seed must be an integer from 0"),
    ({"priority": 5000}, "priority must be an integer from -1000 to 1000"),
    ({"early_stopping": 0}, "early stopping must be an integer from 1"),
    ({"wait_timeout_s": float("nan")}, "wait timeout must be a finite number"),
    ({"time_budget_s": -1.0}, "time budget must not be negative"),
    ({"time_budget_s": float("inf")}, "time budget must be a finite number"),
    ({"device_key": "bad key!"}, "invalid device key"),
    ({"strategy": "magic"}, "unknown strategy 'magic'"),
    ({"workload": "conv9(M=1)"}, "unknown operator"),
    ({"target": "fpga"}, "unknown target 'fpga'"),
    ({"pins": ("no-equals",)}, "--pin takes KNOB=VALUE"),
    ({"family": "matmul(M=16..32,N=2,K=2)"}, "is not in the range"),
    ({"workload": "matmul(M=2,N=2,K=2)" + " " * 2000}, "workload must be at most 1000 characters"),
    ({"pins": ("behaviour=ok",) * 65}, "at most 64 pins"),
    ({"constraints": ("variant < 3" + " " * 3000,)}, "each of the constraints must be at most 2000 characters"),
    ({"wait_timeout_s": 1e12}, "wait timeout must be at most"),
    ({"reuse_share": 1.0}, r"reuse share must be a number in \[0, 1\), not 1.0"),
    ({"reuse_share": float("nan")}, r"reuse share must be a number in \[0, 1\)"),
    ({"reuse_share": True}, r"reuse share must be a number in \[0, 1\)"),
])
def test_validation_names_the_field_in_one_line(changes, message):
    with pytest.raises(JobSpecError, match=message) as caught:
        dataclasses.replace(BASE, **changes).validate()
    assert "\n" not in str(caught.value)


def test_a_bad_field_is_refused_by_the_daemon_with_the_same_message(tmp_path):
    with TuningLog(f"sqlite:///{tmp_path / 'spec.db'}") as log:
        daemon = start_daemon(log)
        try:
            with FleetClient(daemon.address) as client:
                with pytest.raises(InvalidRequest, match="priority must be an integer from -1000 to 1000"):
                    client.submit(dataclasses.replace(BASE, priority=5000))
                with pytest.raises(TypeError, match="takes a JobSpec"):
                    client.submit("matmul(M=2,N=2,K=2)")
                assert client.jobs() == []
        finally:
            daemon.stop()

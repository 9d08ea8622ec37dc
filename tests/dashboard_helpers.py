"""A small tuning log for dashboard tests: one workload on two devices (sleep target of the
``testing`` catalog, so kernel sources render without numba), each with a job of ok and failed trials."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from measure_agent.engine.types import MeasureResult, MeasureStatus
from measure_agent.workload import parse_workload
from tuner.log import TrialRecord, TuningLog

WL = "matmul(M=64,N=64,K=3)"
OTHER_SHAPE = "matmul(M=64,N=64,K=5)"
FAMILY = "matmul(M=64,N=64,K=1..8)"
DEVICES = ("dev-fast", "dev-slow")
OK_PER_JOB = 9
FAILED_PER_JOB = 3
FAILURE_MESSAGE = "TypingError: no implementation <script>alert(1)</script>"


def fill_log(log: TuningLog) -> dict[str, int]:
    """Jobs (one per device, finished) and a family of two shapes; returns job ids by device key."""
    jobs = {}
    log.record_family(FAMILY, "matmul", "float32", [parse_workload(WL).key, parse_workload(OTHER_SHAPE).key])
    for d, device in enumerate(DEVICES):
        log.upsert_device(device, {"arch": "x86_64", "cpu_model": f"Test CPU {d}", "cores": 4 * (d + 1)})
        job = log.create_job(WL, device, "sleep", "random", OK_PER_JOB + FAILED_PER_JOB,
                             {"pins": ["variant=1"], "constraints": [], "seed": 3})
        t0 = datetime.now(timezone.utc) + timedelta(seconds=1)  # trials follow the job's creation
        records = []
        for i in range(OK_PER_JOB):
            seconds = (2e-5 / (i + 1)) * (d + 1)  # later trials are faster; dev-slow is half as fast
            records.append(TrialRecord.from_result(
                WL, device, "sleep", {"variant": i}, MeasureResult(MeasureStatus.OK, costs=(seconds,)),
                agent=f"{device}-agent", created_at=t0 + timedelta(seconds=2 * i), job_id=job))
        for j in range(FAILED_PER_JOB):
            records.append(TrialRecord.from_result(
                WL, device, "sleep", {"variant": 100 + j},
                MeasureResult(MeasureStatus.COMPILE_ERROR, message=FAILURE_MESSAGE),
                agent=f"{device}-agent", created_at=t0 + timedelta(seconds=2 * j + 1), job_id=job))
        records.append(TrialRecord.from_result(
            OTHER_SHAPE, device, "sleep", {"variant": 0}, MeasureResult(MeasureStatus.OK, costs=(3e-5,)),
            created_at=t0))
        log.record_trials(records)
        log.finish_job(job, "done")
        jobs[device] = job
    return jobs

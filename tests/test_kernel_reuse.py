"""Kernel reuse (issue 26 point 2): candidates that render a kernel already built cost no compile.

Rendering only: nothing here compiles a kernel (the scripted measurer answers from the config)."""

from __future__ import annotations

import pytest

from measure_agent.engine import MeasureResult, MeasureStatus
from measure_agent.engine.build import source_digest
from measure_agent.templates import default_catalog
from measure_agent.workload import parse_workload
from tuner.job import TuneOptions, TuningJob
from tuner.log import TuningLog
from tuner.measure import SyncMeasurer
from tuner.search.kernel_reuse import KernelReuse

W = parse_workload("matmul(M=256,N=256,K=256)")
TEMPLATE = default_catalog().get("matmul", "cpu")
SPACE = TEMPLATE.space(W)


def kernel_of(config):
    return source_digest(TEMPLATE.render(W, config))


def test_variants_render_the_kernel_of_the_config_they_vary_and_are_new():
    default = TEMPLATE.default_config(W, SPACE)
    seen = {default.digest}
    reuse = KernelReuse(SPACE, kernel_of, seed=1)
    variants = reuse.variants([default], 8, lambda c: c.digest not in seen)
    assert len(variants) == 8 and len({v.digest for v in variants}) == 8
    assert all(SPACE.is_valid(v) and v.digest not in seen for v in variants)
    assert {kernel_of(v) for v in variants} == {kernel_of(default)}
    # what differs is what the kernel takes at run time: its cache blocks
    assert any(v.as_dict() != default.as_dict() for v in variants)


def test_no_measured_config_no_variants():
    assert KernelReuse(SPACE, kernel_of).variants([], 4, lambda c: True) == []


class ScriptedMeasurer(SyncMeasurer):
    """A cost per config, no compiling; counts the kernels it was asked to build."""

    device_key = "scripted"
    device_info = {"arch": "none"}
    agent_name = "scripted"
    template_version = "scripted"

    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[str] = []

    def measure_now(self, items):
        results = []
        for item in items:
            self.kernels.append(kernel_of(item.config))
            results.append(MeasureResult(MeasureStatus.OK, costs=(1.0 + int(item.config.digest[:6], 16) % 997,)))
        return results


@pytest.mark.parametrize("share", [0.0, 0.5])
def test_a_job_gives_its_reuse_share_to_kernels_already_built(tmp_path, share):
    measurer = ScriptedMeasurer()
    with TuningLog(f"sqlite:///{tmp_path}/log.db") as log:
        summary = TuningJob(W, measurer, log, default_catalog(),
                            TuneOptions(trials=40, strategy="random", seed=3, reuse_share=share)).run()
        trials = log.trials(workload_key=W.key)
    assert summary.measured_now == 40 and len({repr(sorted(t.config.items())) for t in trials}) == 40
    reused = sum(1 for i, kernel in enumerate(measurer.kernels) if kernel in measurer.kernels[:i])
    if share:
        assert reused >= 0.3 * 40  # about half of the batches after the first results
    else:
        assert reused <= 4  # random configs of this space rarely share a kernel


def test_reuse_share_must_be_a_fraction():
    with pytest.raises(ValueError, match="reuse_share"):
        TuneOptions(reuse_share=1.0)


def test_the_engine_builds_a_kernel_once_for_every_config_that_renders_it(kernel_cache_dir):
    """Configs differing only in runtime knobs share a kernel: the engine builds it for the first
    and the run worker loads it for the others (no build, compile time 0), every one measured."""
    from measure_agent.engine import MeasureEngine, MeasureInput, TimingConfig

    small = parse_workload("matmul(M=24,N=40,K=16)")
    space = TEMPLATE.space(small)
    default = TEMPLATE.default_config(small, space)
    seen = {default.digest}
    variants = KernelReuse(space, lambda c: source_digest(TEMPLATE.render(small, c)), seed=2).variants(
        [default], 2, lambda c: c.digest not in seen)
    assert len(variants) == 2
    timing = TimingConfig(number=1, repeat=1, min_repeat_ms=0, warmup=1, build_timeout_s=300, run_timeout_s=60)
    with MeasureEngine(timing, cache_dir=kernel_cache_dir / "reuse") as engine:
        first = engine.measure([MeasureInput(small, default)])
        rest = engine.measure([MeasureInput(small, v) for v in variants])
    assert [r.status for r in first + rest] == [MeasureStatus.OK] * 3
    assert first[0].compile_time_s > 0 and [r.compile_time_s for r in rest] == [0.0, 0.0]

"""What an agent does per leased candidate outside its build and run workers, done once per job
where it can be: the workload's space, the candidate's timing config."""

from __future__ import annotations

import math

import pytest

from measure_agent.agent import SPACE_CACHE_SIZE, Agent
from measure_agent.protocol.convert import clamped_timing_from_proto, timing_from_proto
from measure_agent.protocol.v1 import fleet_pb2 as pb1
from measure_agent.templates import TemplateNotFound
from measure_agent.workload import WorkloadError


@pytest.fixture()
def agent(tmp_path):
    # no daemon: the channel connects lazily, the engine starts its workers on first use
    agent = Agent("127.0.0.1:1", "k", name="cache-test", catalog="testing", cache_dir=tmp_path)
    yield agent
    agent.engine.close()
    agent._tracker.close()


def test_a_workloads_space_is_made_once_and_distinct_workloads_get_distinct_spaces(agent, monkeypatch):
    catalog = agent.engine.catalog
    made = []
    space_of = type(catalog).space
    monkeypatch.setattr(type(catalog), "space", lambda self, *a, **k: made.append(a) or space_of(self, *a, **k))

    workload, space = agent._workload_space("matmul(M=2,N=2,K=1)", "sleep")
    again = agent._workload_space("matmul(M=2,N=2,K=1)", "sleep")
    assert again[0] is workload and again[1] is space and len(made) == 1  # the second candidate: no lookup
    assert space.from_json('{"variant": 7}')["variant"] == 7

    other_workload, other_space = agent._workload_space("matmul(M=2,N=2,K=3)", "sleep")
    assert other_workload != workload and other_workload["K"] == 3
    # the catalog's own cache would hand the same object for an equal space: what matters is that
    # each (workload, target) gets the space made for it
    assert other_space is catalog.space(other_workload, "sleep", agent.device)
    on_cpu = agent._workload_space("matmul(M=2,N=2,K=1)", "cpu")[1]
    assert on_cpu is not space and "behaviour" in on_cpu.knob_names and "behaviour" not in space.knob_names
    assert len(made) == 3 + 1  # one per distinct (workload, target), plus the direct call above


def test_what_cannot_be_parsed_or_has_no_template_raises_each_time_and_is_not_kept(agent):
    for _ in range(2):
        with pytest.raises(WorkloadError):
            agent._workload_space("matmul(M=2", "sleep")
        with pytest.raises(TemplateNotFound):
            agent._workload_space("matmul(M=2,N=2,K=1)", "no-such-target")
    assert agent._spaces == {}


def test_the_space_cache_is_bounded(agent):
    for k in range(1, SPACE_CACHE_SIZE + 10):
        agent._workload_space(f"matmul(M=2,N=2,K={k})", "sleep")
    assert len(agent._spaces) == SPACE_CACHE_SIZE
    assert ("matmul(M=2,N=2,K=1)", "sleep") not in agent._spaces  # the oldest went first
    assert (f"matmul(M=2,N=2,K={SPACE_CACHE_SIZE + 9})", "sleep") in agent._spaces


@pytest.mark.parametrize("fields", [
    {},
    {"number": 3, "repeat": 5, "min_repeat_ms": 20.0, "warmup": 2, "build_timeout_s": 60.0, "run_timeout_s": 5.0},
    {"number": 10**9, "repeat": 10**6, "min_repeat_ms": 1e12, "warmup": -4, "build_timeout_s": -1.0,
     "run_timeout_s": math.inf},
    {"min_repeat_ms": math.nan, "build_timeout_s": math.nan},
])
def test_a_candidates_timing_is_clamped_as_before_and_made_once(fields):
    message = pb1.Timing(**fields)
    timing = clamped_timing_from_proto(message)
    assert timing == timing_from_proto(message, clamp=True)
    if not any(isinstance(v, float) and math.isnan(v) for v in fields.values()):
        assert clamped_timing_from_proto(pb1.Timing(**fields)) is timing  # equal messages: one config

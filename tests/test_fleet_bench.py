"""bench/fleet.py measures a small fleet of light protocol agents end to end and reports each point
with the fields the fleet issue names."""

from __future__ import annotations

import pytest

from script_modules import load_script

pytestmark = pytest.mark.timeout(180)


def fleet_module():
    return load_script("bench/fleet.py")


def test_a_point_of_light_agents_runs_every_candidate_and_reports_what_the_issue_asks(tmp_path):
    fleet = fleet_module()
    row = fleet.run_one(agents=3, per_agent=4, sleep_ms=5, workdir=str(tmp_path), protocol="v2", light=True)
    assert row["candidates"] == 12
    for name in ("agents", "sleep_ms", "efficiency", "overhead_ms", "daemon_cpu_ms", "daemon_rss_mb", "p99_ms"):
        assert name in row, name
    assert row["agents"] == 3 and row["sleep_ms"] == 5
    assert 0 < row["efficiency"] <= 1
    assert row["daemon_rss_mb"] > 0 and row["p99_ms"] >= 5  # a result cannot come back before its kernel ran


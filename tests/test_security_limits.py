"""docs/security.md lists every limit of the daemon's edge, with the value the code enforces."""

from __future__ import annotations

import re
from pathlib import Path

from measure_agent import bounded_json
from measure_agent.engine.types import TIMING_LIMITS
from measure_agent.space import expressions, space
from tuner import steering
from tuner.daemon import limits, service
from tuner.fleet import jobs
from tuner.log import bestfile, jsonl
from tuner.user_space import cache_file

DOC = Path(__file__).resolve().parents[1] / "docs" / "security.md"
# Where limits live; every MAX_* (and the other names below) of these modules must be documented.
MODULES = (jobs, limits, service, expressions, space, bounded_json, steering, jsonl, bestfile, cache_file)
OTHER_NAMES = ("DRIVER_THREADS", "VALIDATION_THREADS", "FINISHED_JOBS_KEPT", "LEASE_GRACE_S", "OVERDUE_LEASES_TO_QUARANTINE", "CONSTRAINT_CHECK_BUDGET_S")


def documented() -> dict[str, float]:
    section = DOC.read_text().split("## Limits", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([A-Za-z_.]+)` \| ([0-9.e+]+) \|", section, flags=re.M)
    return {name: float(value) for name, value in rows}


def in_code() -> dict[str, float]:
    values = {f"timing.{name}": float(value) for name, value in TIMING_LIMITS.items()}
    for module in MODULES:
        for name, value in vars(module).items():
            if (name.startswith("MAX_") or name in OTHER_NAMES) and isinstance(value, (int, float)):
                values[name] = float(value)
    return values


def test_every_limit_is_documented_with_its_value():
    doc, code = documented(), in_code()
    assert {name: code[name] for name in code if name not in doc} == {}, "limits missing from docs/security.md"
    assert {name: (doc[name], code.get(name)) for name in doc if doc[name] != code.get(name)} == {}

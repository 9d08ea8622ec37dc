"""Transfer learning from the tuning log: records of related problems as a strategy's prior.

A job tuning workload W on device D starts from what the log holds for other workloads of W's
operator (on any device) and for W on other devices. Each (workload, device) pair is its own
ranking group (times of different problems are never compared), weighted below the job's own
measurements (weight 1): ``same_device_weight`` for other workloads on D, ``other_device_weight``
for other devices. Large histories are thinned per group to the fastest configs plus a spread of
the rest, so the model's training set stays bounded.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from measure_agent.workload import Workload, WorkloadError, parse_workload
from tuner.search.base import PriorObservation


def prior_from_log(
    log: Any,
    workload: Workload,
    device_key: str,
    target: str,
    *,
    space_of: Callable[[Workload], Any] | None = None,
    same_device_weight: float = 0.5,
    other_device_weight: float = 0.25,
    max_per_group: int = 512,
    max_total: int = 4096,
) -> list[PriorObservation]:
    """Records of the same operator other than (``workload``, ``device_key``) as a prior.

    ``log`` is a :class:`~tuner.log.TuningLog`. ``space_of(workload)`` (e.g. the template's
    ``space``) turns each record's JSON config into a ``Config`` of its own workload's space, so
    a template's :class:`~tuner.cost_model.FeatureProvider` can describe it; records it rejects
    keep their JSON form (knob features only).
    """
    groups: dict[tuple[str, str], list] = {}
    for key in log.workload_keys():
        try:
            other = parse_workload(key)
        except WorkloadError:
            continue
        if other.op != workload.op:
            continue
        for record in log.trials(workload_key=key, target=target):
            if record.workload_key == workload.key and record.device_key == device_key:
                continue  # the job's own history, not a prior
            groups.setdefault((record.workload_key, record.device_key), []).append(record)
    if not groups:
        return []
    per_group = max(16, min(max_per_group, max_total // len(groups)))
    spaces: dict[str, Any] = {}
    out: list[PriorObservation] = []
    for (workload_key, record_device), records in sorted(groups.items()):
        records = _thin(records, per_group)
        source = parse_workload(workload_key)
        weight = same_device_weight if record_device == device_key else other_device_weight
        space = None
        if space_of is not None:
            if workload_key not in spaces:
                try:
                    spaces[workload_key] = space_of(source)
                except Exception:  # a workload the template no longer supports: knob features only
                    spaces[workload_key] = None
            space = spaces[workload_key]
        for record in records:
            config: Any = record.config
            if space is not None:
                try:
                    config = space.from_json(record.config)
                except ValueError:
                    config = record.config
            out.append(PriorObservation(config, record.mean_s, group=f"{workload_key}@{record_device}",
                                        weight=weight, workload=source))
    return out


def _thin(records: list, limit: int) -> list:
    """At most ``limit`` records: the fastest half of the limit plus an even spread of the rest."""
    if len(records) <= limit:
        return records
    order = sorted(range(len(records)), key=lambda i: (records[i].mean_s is None, records[i].mean_s or 0.0, i))
    head = order[: limit // 2]
    rest = order[limit // 2:]
    picks = np.linspace(0, len(rest) - 1, limit - len(head)).round().astype(int)
    return [records[i] for i in sorted(head + [rest[j] for j in picks])]

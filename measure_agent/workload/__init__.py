"""Workloads: operator + sizes + dtype, parsed from the command-line syntax."""

from measure_agent.workload.operators import OPERATORS, OperatorSpec
from measure_agent.workload.workload import (
    SUPPORTED_DTYPES,
    Workload,
    WorkloadError,
    make_workload,
    parse_workload,
)

__all__ = [
    "OPERATORS",
    "OperatorSpec",
    "SUPPORTED_DTYPES",
    "Workload",
    "WorkloadError",
    "make_workload",
    "parse_workload",
]

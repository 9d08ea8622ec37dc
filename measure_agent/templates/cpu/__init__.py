"""CPU templates (numba), one module per operator family."""

from __future__ import annotations

from measure_agent.templates.base import Template


def cpu_templates() -> list[Template]:
    """Every installed CPU template (the matmul template lives in ``templates/matmul_cpu.py``)."""
    return []

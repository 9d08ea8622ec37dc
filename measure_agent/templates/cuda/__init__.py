"""CUDA templates (numba-cuda), one module per operator family."""

from __future__ import annotations

from measure_agent.templates.base import Template


def cuda_templates() -> list[Template]:
    """Every installed CUDA template."""
    return []

"""CPU templates (numba), one module per operator family."""

from __future__ import annotations

from measure_agent.templates.base import Template


def cpu_templates() -> list[Template]:
    """Every installed CPU template (the matmul template lives in ``templates/matmul_cpu.py``)."""
    from measure_agent.templates.cpu.batch_matmul import BatchMatmulCpuTemplate
    from measure_agent.templates.cpu.conv2d import Conv2dNchwCpuTemplate, Conv2dNhwcCpuTemplate
    from measure_agent.templates.cpu.dense import DenseCpuTemplate
    from measure_agent.templates.cpu.depthwise import DepthwiseConv2dNchwCpuTemplate, DepthwiseConv2dNhwcCpuTemplate

    return [
        Conv2dNchwCpuTemplate(),
        Conv2dNhwcCpuTemplate(),
        DepthwiseConv2dNchwCpuTemplate(),
        DepthwiseConv2dNhwcCpuTemplate(),
        DenseCpuTemplate(),
        BatchMatmulCpuTemplate(),
    ]

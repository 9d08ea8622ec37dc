"""CPU templates (numba), one module per operator family; ``_gemm`` renders the matmul, dense and
batch_matmul kernels, ``_conv`` the convolutions' shared pieces, ``_common`` what all of them share."""

from __future__ import annotations

from measure_agent.templates.base import Template


def cpu_templates() -> list[Template]:
    """Every installed CPU template."""
    from measure_agent.templates.cpu.batch_matmul import BatchMatmulCpuTemplate
    from measure_agent.templates.cpu.conv2d import Conv2dNchwCpuTemplate, Conv2dNhwcCpuTemplate
    from measure_agent.templates.cpu.dense import DenseCpuTemplate
    from measure_agent.templates.cpu.depthwise import DepthwiseConv2dNchwCpuTemplate, DepthwiseConv2dNhwcCpuTemplate
    from measure_agent.templates.cpu.matmul import MatmulCpuTemplate

    return [
        MatmulCpuTemplate(),
        Conv2dNchwCpuTemplate(),
        Conv2dNhwcCpuTemplate(),
        DepthwiseConv2dNchwCpuTemplate(),
        DepthwiseConv2dNhwcCpuTemplate(),
        DenseCpuTemplate(),
        BatchMatmulCpuTemplate(),
    ]

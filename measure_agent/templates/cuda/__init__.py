"""CUDA templates (numba.cuda), one module per operator family.

``gemm``: matmul, dense, batch_matmul, conv2d_nchw and conv2d_nhwc (implicit GEMM);
``depthwise``: depthwise_conv2d_nchw and depthwise_conv2d_nhwc. Rendering imports nothing from
numba: the rendered kernels do (``from numba import cuda``), on the agent that measures them.
"""

from __future__ import annotations

from measure_agent.templates.base import Template


def cuda_templates() -> list[Template]:
    """Every installed CUDA template."""
    from measure_agent.templates.cuda.depthwise import DepthwiseConv2dNchwCudaTemplate, DepthwiseConv2dNhwcCudaTemplate
    from measure_agent.templates.cuda.gemm import (
        BatchMatmulCudaTemplate,
        Conv2dNchwCudaTemplate,
        Conv2dNhwcCudaTemplate,
        DenseCudaTemplate,
        MatmulCudaTemplate,
    )

    return [
        MatmulCudaTemplate(),
        DenseCudaTemplate(),
        BatchMatmulCudaTemplate(),
        Conv2dNchwCudaTemplate(),
        Conv2dNhwcCudaTemplate(),
        DepthwiseConv2dNchwCudaTemplate(),
        DepthwiseConv2dNhwcCudaTemplate(),
    ]

"""Build a CPU template's kernel for a config and check it against numpy (shared by the template tests)."""

from __future__ import annotations

import numpy as np

from measure_agent.engine.build import compile_kernel, load_kernel
from measure_agent.engine.checking import check_output, make_problem
from measure_agent.space import Config
from measure_agent.templates.base import Template
from measure_agent.workload import Workload


def check_kernel(template: Template, workload: Workload, config: Config, cache_dir):
    """Compile the config's kernel (into ``cache_dir``) and compare it with the reference; the output
    starts as NaN, so an element the kernel never writes fails. Returns the loaded kernel and its
    rendered source."""
    source = template.render(workload, config)
    kernel = load_kernel(source, cache_dir)
    problem = make_problem(workload)
    out = np.full(workload.spec.output_shape(workload.params), np.nan, dtype=workload.dtype)
    args = (*problem.inputs, out, *source.runtime_args)
    compile_kernel(kernel, args)
    kernel(*args)
    result = check_output(problem, out)
    assert result.correct, f"{workload.key} {config}: max abs error {result.max_abs_error}"
    return kernel, source


def count_instructions(assembly: str, mnemonic_prefixes: tuple[str, ...], operand: str = "") -> int:
    """Instructions of ``assembly`` whose mnemonic starts with one of ``mnemonic_prefixes`` (and
    whose line names ``operand``, e.g. ``"zmm"``, if given)."""
    return sum(line.split()[0].startswith(mnemonic_prefixes) and operand in line
               for line in assembly.splitlines() if line.split())

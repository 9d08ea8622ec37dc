"""The template contract: a schedule space for a workload and the kernel each config renders to.

Agents render kernels only from templates installed with them; what crosses the network is a
workload and a config, never code. A template's ``version`` changes whenever the kernels it renders
change, so results measured with different kernels are never mixed.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from measure_agent.device import DeviceInfo
from measure_agent.space import Config, ConfigSpace
from measure_agent.workload import Workload


@dataclass(frozen=True)
class KernelSource:
    """A rendered kernel: a self-contained Python module and how to call it.

    The engine calls ``entry(*inputs, out, *runtime_args)``; the kernel writes its result into
    ``out``. Knobs that need not be compile-time constants (cache-block sizes) travel in
    ``runtime_args`` so that configs differing only in them share one compiled kernel.

    ``launch`` says how the entry is called: ``"host"`` (CPU kernels) on numpy arrays, returning when
    done; ``"cuda"`` on numba CUDA device arrays, asynchronously (the engine copies the inputs to
    the device once, synchronises after every call and copies ``out`` back to check it). A
    ``"cuda"`` entry is a host function that launches kernels; its attribute ``kernels`` lists the
    ``cuda.jit`` kernels it launches, which take the entry's own arguments, so that the engine can
    compile them at build time.
    """

    text: str
    entry: str
    runtime_args: tuple[int, ...] = ()
    launch: str = "host"


class Template(ABC):
    """Schedules for one operator on one target family (``cpu`` or ``cuda``).

    Contract:
    - ``space(workload, device)`` is deterministic for a workload and device and contains
      ``default_config``. ``device`` (None when unknown) lets the space adapt to the target: vector
      widths of the ISA, a GPU's compute capability, and pruning of configs beyond the device's
      limits (threads or shared memory per block) so they are never proposed;
    - every valid config renders, compiles and computes the operator's reference result for any
      sizes of the workload (remainders included);
    - ``render`` never executes anything: it only returns source text.
    """

    op: str
    target: str
    version: str
    # Whether a kernel's timing is the host CPU's: then an agent builds nothing while it times
    # (a numba compile on another core skews a CPU timing); GPU kernels let builds overlap runs.
    timed_on_host_cpu: bool = True

    @abstractmethod
    def space(self, workload: Workload, device: DeviceInfo | None = None) -> ConfigSpace:
        """The valid configs for this workload on this device."""

    @abstractmethod
    def default_config(self, workload: Workload, space: ConfigSpace) -> Config:
        """What users get without tuning: a sensible, explicit choice."""

    @abstractmethod
    def render(self, workload: Workload, config: Config) -> KernelSource:
        """Kernel source for a valid config."""

"""Fault-injection template: a matmul whose config chooses how it misbehaves.

Only in the ``testing`` catalog. It lets tests and benchmarks drive every failure path of the
engine (compile error, runtime error, wrong answer, hang, crash) and a kernel of known duration,
through the same protocol as real templates.
"""

from __future__ import annotations

from measure_agent.device import DeviceInfo
from measure_agent.space import ChoiceKnob, Config, ConfigSpace
from measure_agent.templates.base import KernelSource, Template
from measure_agent.workload import Workload

BEHAVIOURS = ("ok", "compile_error", "raise", "wrong", "hang", "abort", "segfault", "sleep")
SLEEP_VARIANTS = 100_000  # distinct configs of the sleep template (fleet benches size their jobs within it)

_HEADER = '''import time
import os
import ctypes

import numpy as np
from numba import njit
'''
# The sleep kernel is plain Python: its workers need not import numba (fleet benchmarks start many).
_SLEEP_HEADER = "import time\n"

_BODIES = {
    "ok": '''
@njit(cache=True)
def kernel(A, B, out):
    out[:, :] = A @ B
''',
    "compile_error": '''
@njit(cache=True)
def kernel(A, B, out):
    out[0, 0] = A.no_such_attribute
''',
    "raise": '''
@njit(cache=True)
def kernel(A, B, out):
    raise ValueError("injected runtime error")
''',
    "wrong": '''
@njit(cache=True)
def kernel(A, B, out):
    out[:, :] = A @ B
    out[0, 0] += 1.0
''',
    "hang": '''
def kernel(A, B, out):
    while True:
        time.sleep(0.05)
''',
    "abort": '''
def kernel(A, B, out):
    os.abort()
''',
    "segfault": '''
def kernel(A, B, out):
    ctypes.string_at(0)
''',
    "sleep": '''
def kernel(A, B, out):
    out[:, :] = A @ B
    time.sleep({sleep_ms} / 1000.0)
''',
}


class FaultyMatmulTemplate(Template):
    op = "matmul"
    target = "cpu"
    version = "testing-1"

    def space(self, workload: Workload, device: DeviceInfo | None = None) -> ConfigSpace:
        return ConfigSpace(
            [
                ChoiceKnob("behaviour", BEHAVIOURS),
                ChoiceKnob("sleep_ms", (0, 1, 5, 10, 20, 50, 100)),
                ChoiceKnob("variant", tuple(range(64))),
            ]
        )

    def default_config(self, workload: Workload, space: ConfigSpace) -> Config:
        return space.make({"behaviour": "ok", "sleep_ms": 0, "variant": 0})

    def render(self, workload: Workload, config: Config) -> KernelSource:
        body = _BODIES[config["behaviour"]].format(sleep_ms=config["sleep_ms"])
        # ``variant`` only makes distinct configs (and sources) for throughput tests.
        return KernelSource(text=f"{_HEADER}\nVARIANT = {config['variant']}\n{body}", entry="kernel")


class SleepTemplate(Template):
    """A "kernel" of known duration for fleet tests and benchmarks: target ``sleep``.

    ``matmul(M,N,K)`` on target ``sleep`` computes A @ B and then sleeps K milliseconds per call;
    its only knob, ``variant``, makes :data:`SLEEP_VARIANTS` distinct configs that all behave the same.
    """

    op = "matmul"
    target = "sleep"
    timed_on_host_cpu = False  # it sleeps: builds on other cores do not change how long
    version = "testing-1"

    def space(self, workload: Workload, device: DeviceInfo | None = None) -> ConfigSpace:
        return ConfigSpace([ChoiceKnob("variant", tuple(range(SLEEP_VARIANTS)))])

    def default_config(self, workload: Workload, space: ConfigSpace) -> Config:
        return space.make({"variant": 0})

    def render(self, workload: Workload, config: Config) -> KernelSource:
        body = _BODIES["sleep"].format(sleep_ms=workload["K"])
        return KernelSource(text=f"{_SLEEP_HEADER}\nVARIANT = {config['variant']}\n{body}", entry="kernel")

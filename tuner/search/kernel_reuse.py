"""Candidates that cost no compile: configs that reuse a kernel already built.

A CPU template compiles some knobs into its kernel (register tiles, loop order, unrolling,
packing, parallel) and passes the others at run time (cache blocks such as matmul's MC, NC and KC):
configs that differ only in the run-time ones render the same source and share one compiled kernel
(numba's disk cache, keyed by the source). A candidate whose kernel is built is measured for its run
time alone, where a new kernel costs a compile of seconds (a median 3.5 s for matmul with numba).

:class:`KernelReuse` finds such candidates near the best configs measured so far: random changes of
one or two knobs that keep the rendered source (its digest) the same. The tuning job gives them a
share of each batch (``TuneOptions.reuse_share``), so the cache blocks of the best kernels are tuned
while the search model spends the compiles on new kernels.
"""

from __future__ import annotations

from typing import Callable, Iterable, Sequence

import numpy as np

from measure_agent.space import Config, ConfigSpace


class KernelReuse:
    """Runtime variants of measured configs. ``kernel_of(config)``: the digest of the kernel source
    the config renders (equal digests: one compiled kernel)."""

    def __init__(self, space: ConfigSpace, kernel_of: Callable[[Config], str], seed: int = 0,
                 attempts_per_variant: int = 40) -> None:
        self.space = space
        self.kernel_of = kernel_of
        self.rng = np.random.default_rng(seed)
        self.attempts_per_variant = attempts_per_variant
        self._kernels: dict[str, str] = {}  # config digest -> kernel digest

    def kernel(self, config: Config) -> str:
        digest = self._kernels.get(config.digest)
        if digest is None:
            digest = self._kernels[config.digest] = self.kernel_of(config)
        return digest

    def variants(self, best: Sequence[Config], n: int, is_new: Callable[[Config], bool],
                 kernels: int = 2) -> list[Config]:
        """Up to ``n`` valid configs, new by ``is_new``, that each render the kernel of one of the
        first ``kernels`` distinct kernels of ``best`` (fastest first), taken in turn."""
        seeds = _distinct_kernels(best, self.kernel)[:kernels]
        out: list[Config] = []
        taken: set[str] = set()
        if not seeds or n <= 0:
            return out
        for attempt in range(n * self.attempts_per_variant):
            if len(out) >= n:
                break
            origin = seeds[len(out) % len(seeds)]
            candidate = self._mutate(origin)
            if (candidate is None or candidate.digest in taken or not is_new(candidate)
                    or self.kernel(candidate) != self.kernel(origin)):
                continue
            taken.add(candidate.digest)
            out.append(candidate)
        return out

    def _mutate(self, config: Config) -> Config | None:
        """``config`` with one or two knobs set to random values; None when that is not valid."""
        knobs = self.space.knobs
        changed = dict(config.as_dict())
        for index in self.rng.choice(len(knobs), size=min(len(knobs), int(self.rng.integers(1, 3))), replace=False):
            knob = knobs[int(index)]
            changed[knob.name] = knob.values[int(self.rng.integers(len(knob.values)))]
        try:
            candidate = self.space.make(changed)
        except ValueError:
            return None
        return candidate if self.space.is_valid(candidate) else None


def _distinct_kernels(configs: Iterable[Config], kernel: Callable[[Config], str]) -> list[Config]:
    seen: set[str] = set()
    out = []
    for config in configs:
        digest = kernel(config)
        if digest not in seen:
            seen.add(digest)
            out.append(config)
    return out


__all__ = ["KernelReuse"]

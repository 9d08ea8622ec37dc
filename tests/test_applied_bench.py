"""bench/applied_vs_measured.py's paired-ratio statistics (the bench itself tunes and times: not run here)."""

from __future__ import annotations

import math

import pytest

from script_modules import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("bench/applied_vs_measured.py")


def test_median_interval_uses_order_statistics_with_binomial_coverage(bench):
    # 15 rounds: the 4th and 12th values cover the median with probability 1 - 2 * P(Bin(15, .5) <= 3)
    values = [1.0 + i / 100 for i in (7, 3, 11, 0, 14, 5, 9, 1, 13, 2, 8, 12, 4, 10, 6)]
    median, lo, hi, coverage = bench.median_interval(values)
    assert median == pytest.approx(1.07)
    assert (lo, hi) == (pytest.approx(1.03), pytest.approx(1.11))
    assert coverage == pytest.approx(1 - 2 * sum(math.comb(15, i) for i in range(4)) / 2 ** 15)
    assert coverage >= 0.95


def test_median_interval_with_few_values_is_the_range_and_says_its_coverage(bench):
    median, lo, hi, coverage = bench.median_interval([1.2, 0.9, 1.0])
    assert (median, lo, hi) == (1.0, 0.9, 1.2)
    assert coverage == pytest.approx(0.75)  # three values: below 95%, and the table says so
    assert bench.median_interval([2.0]) == (2.0, 2.0, 2.0, 0.0)


def test_median_interval_refuses_no_values(bench):
    with pytest.raises(ValueError):
        bench.median_interval([])

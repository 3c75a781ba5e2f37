"""The tuning benchmark's own rules: misses stay in every statistic, and the test split cannot be read."""

from __future__ import annotations

import math

import numpy as np
import pytest

from benchmarks.bench_tune import GOAL_R, _Sealed, summarise


def test_misses_are_kept_in_the_median_and_the_quartiles():
    three_misses = summarise([0.2, 0.3, math.inf, math.inf, math.inf])
    assert three_misses["median"] == math.inf and three_misses["misses"] == 3  # not the median of [0.2, 0.3]
    assert three_misses["q1"] == 0.3 and three_misses["q3"] == math.inf
    assert three_misses["p_r_le_goal"] == pytest.approx(2 / 5)
    one_miss = summarise([0.1, 0.2, 0.3, math.inf])
    assert one_miss["median"] == pytest.approx(0.25) and one_miss["n"] == 4
    assert one_miss["p_r_le_goal"] == pytest.approx(3 / 4) and GOAL_R == 0.4


def test_the_sealed_test_split_fails_any_read():
    sealed = _Sealed("test_images")
    for read in (len, np.asarray, lambda x: x[0], lambda x: x.shape, list):
        with pytest.raises(AssertionError, match="read the test split"):
            read(sealed)

"""A vectorized group of runs on 4 simulated CPU devices (DP, FSDP) equals 1 device
(tests/parallel_cases.py, case `vectorized`, in its own subprocess: see tests/test_parallel.py)."""

import pytest

from test_parallel import TOL, case_results

results = case_results("vectorized")


@pytest.mark.slow
def test_vectorized_group_on_four_devices(results):
  r = results
  for mode in ("dp", "fsdp"):
    assert r[mode]["params"] <= TOL and r[mode]["metrics"] <= TOL, r
    assert r[mode]["runs_differ"] > 1e-3, r

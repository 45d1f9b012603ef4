"""Checkpoints saved by FSDP on 4 simulated CPU devices restore bit-exactly on 2 and 1 devices
(tests/parallel_cases.py, case `checkpoint`, in its own subprocess: see tests/test_parallel.py)."""

import pytest

from test_parallel import TOL, case_results

results = case_results("checkpoint")


@pytest.mark.slow
def test_checkpoints_restore_across_device_counts(results):
  r = results
  for name, devices in (("dp2", 2), ("single", 1)):
    assert r[name]["restored"] == 0.0, r          # bit-exact, whatever the layout
    assert r[name]["devices"] == devices
    assert r[name]["step"] == 3
    assert r[name]["next_step_metrics"] <= TOL, r
    assert r[name]["next_step_params"] <= TOL, r

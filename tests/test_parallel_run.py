"""`train.run` on 4 simulated CPU devices (FSDP) equals 1 device, and resumes on 1
(tests/parallel_cases.py, case `run`, in its own subprocess: see tests/test_parallel.py)."""

import pytest

from test_parallel import TOL, case_results

results = case_results("run")


@pytest.mark.slow
def test_train_run_on_four_devices_and_resume_on_one(results):
  r = results
  assert r["steps"] == [0, 2, 3, 4, 6]
  assert r["fsdp"] <= TOL, r
  assert r["resume_steps"] == r["steps"] and r["resume"] <= TOL, r

"""provenance.json: one segment per start of a run."""

import sys

from actlab.run import lane
from conftest import tiny


def test_provenance_segment(tmp_path):
  seg = lane.segment(tiny(**{"train.progress": False}), start_step=40)
  assert seg["start_step"] == 40 and seg["device_count"] >= 1 and seg["device_kind"]
  assert set(lane.PACKAGES) <= set(seg["versions"]) and seg["versions"]["jax"]
  assert seg["git_commit"] is None or len(seg["git_commit"]) == 40
  assert seg["command"][0] == sys.executable and seg["runtime"]["train.progress"] is False
  assert [s["start_step"] for s in lane.append_segment(tmp_path, seg)] == [40]
  assert [s["start_step"] for s in lane.append_segment(tmp_path, {**seg, "start_step": 90})] \
      == [40, 90]

"""The report's per-run table as `runs.csv`, for plotting elsewhere (docs/metrics.md §9): the
`summary.json` numbers of `SUMMARY_COLUMNS` in full precision, missing and non-finite ones empty."""

import csv
import io
import pathlib
from typing import Sequence

from actlab.measure.stats import Run, SEED_KEY, finite, group_keys
from actlab.run import workdir

SUMMARY_COLUMNS = ("initial_val_loss", "best_val_loss", "final_val_loss", "final_train_loss",
                   "train_val_gap", "act_zero_frac", "dead_units", "act_mean", "act_std",
                   "attn_logit_max", "grad_norm", "wall_time_sec")


def _number(x) -> str:
  return repr(float(x)) if isinstance(x, (int, float)) and finite(x) else ""


def write(manifest, runs: Sequence[Run], path: pathlib.Path) -> None:
  keys = group_keys(manifest)
  rows = [["run", *keys, SEED_KEY, "state", "status", "learned", "last_step", *SUMMARY_COLUMNS]]
  for r in runs:
    s = dict(r.summary)
    if finite(s.get("final_val_loss")) and finite(s.get("final_train_loss")):
      s["train_val_gap"] = s["final_val_loss"] - s["final_train_loss"]
    last = s.get("last_step", r.rows[-1].get("step") if r.rows else None)
    rows.append([r.name, *(str(r.overrides.get(k, "")) for k in [*keys, SEED_KEY]), r.state,
                 r.status, {True: "true", False: "false"}.get(r.learned, ""),
                 "" if last is None else str(last), *(_number(s.get(c)) for c in SUMMARY_COLUMNS)])
  buffer = io.StringIO()
  csv.writer(buffer, lineterminator="\n").writerows(rows)
  workdir.write_text(path, buffer.getvalue())

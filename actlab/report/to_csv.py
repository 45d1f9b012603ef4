"""The report's per-run table as `runs.csv` (docs/metrics.md §9): every per-run measure of
`summary.json` in full precision, missing and non-finite ones empty, and the verdict's reasons."""

import csv
import io
import pathlib
from typing import Sequence

from actlab.infra import workdir
from actlab.report.stats import Run, SEED_KEY, finite, group_keys

COLUMNS = [  # (summary key, written always (else where some run has it)), after `last_step`
    ("initial_val_loss", True), ("best_val_loss", True), ("final_val_loss", True),
    ("final_train_loss", True), ("train_val_gap", True),  # final val − final train loss
    ("final_test_loss", True),  # the held-out test windows (data.test_batches)
    ("initial_val_accuracy", False), ("best_val_accuracy", False),  # MLM, classification
    ("final_val_accuracy", False), ("final_test_accuracy", False),
    ("final_val_mask_loss", False), ("final_val_mask_accuracy", False),  # MLM: [MASK] inputs
    ("final_test_mask_loss", False), ("final_test_mask_accuracy", False),
    ("unigram_loss", True), ("copy_loss", False), ("mask_unigram_loss", False),  # the bars
    ("act_zero_frac", True), ("dead_units", True), ("act_mean", True), ("act_std", True),
    ("attn_logit_max", True), ("attn_entropy_min", True),
    ("grad_norm", True), ("grad_norm_init", True), ("grad_norm_max", True),
    ("grad_norm_max_rel", True), ("sharpness", True), ("sharpness_max", True),
    ("diverged_at", True), ("spike_steps", True),  # steps, space-separated
    ("steps", True), ("params", True), ("params_non_embedding", True), ("vocab_size", True),
    ("wall_time_sec", True), ("train_time_sec", True), ("tokens_per_sec", True),
    ("vectorized_runs", False),
]
LEADING = ("status", "last_step")  # summary keys written before `COLUMNS`, with the run's state
NOT_COLUMNS = ("status_reasons", "provenance")  # the reasons are the last column; no provenance


def _is_number(x) -> bool:
  return isinstance(x, (int, float)) and not isinstance(x, bool)


def _number(x) -> str:
  if isinstance(x, list):  # spike_steps
    return " ".join(map(_number, x))
  if isinstance(x, int) and not isinstance(x, bool):
    return str(x)
  return repr(float(x)) if _is_number(x) and finite(x) else ""


def columns(runs: Sequence[Run]) -> list[str]:
  """`COLUMNS` (some only where a run has them), then any other key whose values are numbers."""
  summaries = [r.summary for r in runs]
  has = lambda key: any(s.get(key) is not None for s in summaries)
  known = {key for key, _ in COLUMNS} | set(LEADING) | set(NOT_COLUMNS)
  others = sorted({k for s in summaries for k in s if k not in known})
  others = [k for k in others if has(k) and all(_is_number(s[k]) or s[k] is None
                                                 for s in summaries if k in s)]
  return [key for key, always in COLUMNS if always or has(key)] + others


def write(manifest, runs: Sequence[Run], path: pathlib.Path) -> None:
  keys = group_keys(manifest)
  summary_columns = columns(runs)
  rows = [["run", *keys, SEED_KEY, "state", "status", "learned", "last_step", *summary_columns,
           "status_reasons"]]
  for r in runs:
    s = dict(r.summary)
    if finite(s.get("final_val_loss")) and finite(s.get("final_train_loss")):
      s["train_val_gap"] = s["final_val_loss"] - s["final_train_loss"]
    last = s.get("last_step", r.rows[-1].get("step") if r.rows else None)
    rows.append([r.name, *(str(r.overrides.get(k, "")) for k in [*keys, SEED_KEY]), r.state,
                 r.status, {True: "true", False: "false"}.get(r.learned, ""),
                 "" if last is None else str(last), *(_number(s.get(c)) for c in summary_columns),
                 "; ".join(s.get("status_reasons") or [])])
  buffer = io.StringIO()
  csv.writer(buffer, lineterminator="\n").writerows(rows)
  workdir.write_text(path, buffer.getvalue())

"""A sweep's TensorBoard HParams table (docs/tracking.md): each ended cell's overrides and final
numbers; a run's own trackers are rows.py's."""

import os
import pathlib
import tempfile
from typing import Mapping

from actlab.infra import workdir as workdir_lib
from actlab.run.rows import tensorboardx

STATUS_CODES = {"stable": 0.0, "unstable": 1.0, "diverged": 2.0}  # HParams: the verdict as a number


def hparams_metrics(summary: Mapping) -> dict[str, float]:
  """A cell's final numbers for the HParams table (NaN where the run has none)."""
  number = lambda key: float(summary[key]) if summary.get(key) is not None else float("nan")
  out = {f"hparam/{k}": number(k) for k in ("final_val_loss", "best_val_loss")}
  if "final_val_accuracy" in summary:
    out["hparam/final_val_accuracy"] = number("final_val_accuracy")
  out["hparam/status"] = STATUS_CODES.get(summary.get("status"), float("nan"))
  out["hparam/diverged"] = float(summary.get("status") == "diverged")
  return out


def write_hparams(sweep_dir: pathlib.Path) -> int:
  """Adds each ended cell of `sweep_dir` not added yet to `tb_hparams/<cell>/` (via a temporary
  directory: shards may call this concurrently); returns how many it added."""
  manifest = workdir_lib.read_json(sweep_dir / "sweep.json") or {}
  out = sweep_dir / "tb_hparams"
  todo = []
  for cell in manifest.get("cells", []):
    summary = None if (out / cell["name"]).exists() else workdir_lib.read_summary(
        sweep_dir / cell["name"], warn=False)
    if summary is not None:
      todo.append((cell, summary))
  if not todo:
    return 0
  tensorboardX = tensorboardx()
  out.mkdir(exist_ok=True)
  with tempfile.TemporaryDirectory(dir=sweep_dir, prefix=".tb_hparams-") as tmp:
    with tensorboardX.SummaryWriter(tmp) as writer:
      for cell, summary in todo:
        hparams = {k: v if isinstance(v, (bool, int, float, str)) else str(v)
                   for k, v in cell["overrides"].items()}
        writer.add_hparams(hparams, hparams_metrics(summary), name=cell["name"], global_step=0)
    for cell, _ in todo:
      try:
        os.rename(pathlib.Path(tmp) / cell["name"], out / cell["name"])
      except OSError:  # Another process added it meanwhile: the same session.
        pass
  return len(todo)


"""TensorBoard and Weights & Biases (docs/tracking.md): a writer takes every metrics row (`write`,
histograms too) and is closed with the run's summary (None when the run stopped early)."""

import hashlib
import os
import pathlib
import sys
import tempfile
import threading
import weakref
from typing import Any, Mapping, Sequence

import jax
import ml_collections

from actlab.infra import workdir as workdir_lib
from actlab.infra.errors import UserError
from actlab.measure.histogram import Histogram

STATUS_CODES = {"stable": 0.0, "unstable": 1.0, "diverged": 2.0}  # HParams: the verdict as a number


def _tensorboardx():
  """tensorboardX without torch, which its writer imports (about 2 s) only to accept torch
  tensors; actlab logs none."""
  if "torch" in sys.modules:
    import tensorboardX
    return tensorboardX
  sys.modules["torch"] = None  # `import torch` raises ImportError while tensorboardX loads
  try:
    import tensorboardX
  finally:
    del sys.modules["torch"]
  return tensorboardX


def _scalars(row: Mapping[str, Any]):
  return ((k, v) for k, v in row.items()
          if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool))


def _histograms(row: Mapping[str, Any]):
  return ((k, v) for k, v in row.items() if isinstance(v, Histogram))


_WRITERS = weakref.WeakKeyDictionary()  # tensorboardX's threads → the error that ended it or None
_other_threads_hook = threading.excepthook


def _keep_writer_errors(args) -> None:
  """`threading.excepthook`: an error that ends a writer's thread is kept for the run to raise
  (not printed); any other thread's goes to the hook this one replaced."""
  if args.thread in _WRITERS:
    _WRITERS[args.thread] = args.exc_value
  else:
    _other_threads_hook(args)


class TensorBoard:
  """Every metrics row in `logdir`; `purge_step` (the resumed step) hides the events after it.

  tensorboardX writes the events in a thread of its own. An error that ends it (a full disk) is
  raised at the next row or at `close`, where the run reports it in one line, rather than printed
  as the thread's traceback while the run goes on; its queue is unbounded, so that the rows added
  before then never wait for a thread that is gone."""

  def __init__(self, logdir: pathlib.Path, purge_step: int | None = None):
    global _other_threads_hook
    if threading.excepthook is not _keep_writer_errors:
      _other_threads_hook, threading.excepthook = threading.excepthook, _keep_writer_errors
    before = set(threading.enumerate())
    self._writer = _tensorboardx().SummaryWriter(str(logdir), purge_step=purge_step or None,
                                                 max_queue=0)
    self._threads = set(threading.enumerate()) - before
    _WRITERS.update(dict.fromkeys(self._threads))

  def _raise_writer_error(self) -> None:
    for thread in self._threads:
      if (error := _WRITERS.get(thread)) is not None:
        _WRITERS[thread] = None
        raise error

  def write(self, row: Mapping[str, Any]) -> None:
    self._raise_writer_error()
    for key, value in _scalars(row):
      self._writer.add_scalar(key, value, row["step"])
    for key, hist in _histograms(row):
      edges, counts = hist.buckets()
      self._writer.add_histogram_raw(key, hist.min, hist.max, hist.num, hist.sum,
                                     hist.sum_squares, edges[1:].tolist(), counts.tolist(),
                                     row["step"])

  def close(self, summary: dict | None = None) -> None:
    del summary  # TensorBoard shows the rows; the summary is summary.json's.
    self._writer.close()  # Flushes first.
    self._raise_writer_error()


def wandb_run_id(logdir: pathlib.Path, first_segment: Mapping) -> str:
  """The W&B run id of the run in `logdir`, the same at every start of it: a hash of its path and
  the host and time of its first start."""
  key = f"{logdir.resolve()}|{first_segment.get('host')}|{first_segment.get('started')}"
  return "actlab-" + hashlib.sha256(key.encode()).hexdigest()[:16]


class WandB:
  """Every metrics row logged to a W&B run, one per workdir across resumes."""

  def __init__(self, config: ml_collections.ConfigDict, logdir: pathlib.Path, run_id: str):
    import wandb  # Imported here: an optional extra, checked by config.validate.
    m = config.metrics
    sweep_dir = logdir.parent if (logdir.parent / "sweep.json").exists() else None
    try:
      self._run = wandb.init(
          project=m.wandb_project, mode=m.wandb_mode or None, dir=str(logdir), id=run_id,
          resume="allow", name=logdir.name, group=sweep_dir.name if sweep_dir else None,
          config=config.to_dict(), reinit="create_new")
    except wandb.Error as e:
      raise UserError(f"metrics.wandb_project={m.wandb_project!r}: W&B refused the run ({e}); "
                      "log in (`wandb login`) or set --config.metrics.wandb_mode=offline") from None
    self._wandb = wandb

  def write(self, row: Mapping[str, Any]) -> None:
    data = dict(_scalars(row))
    for key, hist in _histograms(row):
      edges, counts = hist.buckets()
      data[key] = self._wandb.Histogram(np_histogram=(counts.tolist(), edges.tolist()))
    self._run.log(data, step=int(row["step"]))

  def close(self, summary: dict | None = None) -> None:
    if summary is not None:
      self._run.summary.update({k: v for k, v in summary.items() if k != "provenance"})
    self._run.finish(exit_code=0 if summary is not None else 1)


def open_writers(config: ml_collections.ConfigDict, logdir: pathlib.Path, start: int,
                 segments: Sequence[Mapping]) -> list:
  """The trackers of `config` for the run in `logdir`, resuming at `start` (W&B on process 0)."""
  writers = []
  if config.metrics.tensorboard:
    writers.append(TensorBoard(logdir / "tb", purge_step=start))
  if config.metrics.wandb_project and jax.process_index() == 0:
    try:
      writers.append(WandB(config, logdir, wandb_run_id(logdir, segments[0])))
    except BaseException:
      for w in writers:
        w.close()
      raise
  return writers


# --- TensorBoard HParams of a sweep ----------------------------------------------------------


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
  """Adds each ended cell of the sweep in `sweep_dir` not added yet to `tb_hparams/<cell>/`, via a
  temporary directory: shards and reruns may call this concurrently. Returns how many it added."""
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
  tensorboardX = _tensorboardx()
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


"""Trackers (actlab/run/rows.py, a sweep's HParams: actlab/run/tracking.py): FFN pre-activation histograms (actlab/measure/histogram.py) in
TensorBoard, Weights & Biases in offline mode, and a sweep's TensorBoard HParams table."""

import errno
import json
import pathlib
import struct
import subprocess
import sys
import threading

import jax
import numpy as np
import pytest

from actlab import config as config_lib
from actlab.infra import workdir as workdir_lib
from actlab.measure import histogram
from actlab.run import rows as run_rows, tracking, train
from conftest import DEEP, tiny


def read_events(logdir: pathlib.Path) -> list:
  """Every Event proto of the TensorBoard event files in `logdir` (TFRecords: length, its CRC,
  the record, its CRC)."""
  from tensorboardX.proto import event_pb2
  events = []
  for path in sorted(logdir.glob("events.out.tfevents.*")):
    raw, i = path.read_bytes(), 0
    while i < len(raw):
      (n,) = struct.unpack("<Q", raw[i:i + 8])
      events.append(event_pb2.Event.FromString(raw[i + 12:i + 12 + n]))
      i += 12 + n + 4
  return events


def rows(workdir: pathlib.Path) -> list[dict]:
  return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


# --- Histograms -------------------------------------------------------------------------------


def test_device_histogram_equals_numpy_with_the_same_edges():
  edges = histogram.edges(64, 8.0)
  rng = np.random.default_rng(0)
  # Normal values well past the range, every edge exactly (the bins' closed sides), ±inf, NaN.
  x = np.concatenate([rng.normal(0, 5, 20_000), edges, [np.inf, -np.inf, np.nan]])
  x = x.astype(np.float32).reshape(4, -1)
  out = jax.device_get(jax.jit(lambda x: histogram.count(x, edges))(x))
  inside, _ = np.histogram(x[~np.isnan(x)], bins=edges)
  np.testing.assert_array_equal(out["counts"][1:-1], inside)
  assert out["counts"][0] == np.sum(x < -8)
  assert out["counts"][-1] == np.sum(x > 8) + 1  # NaN counts as overflow
  assert out["counts"].sum() == x.size
  # Pooled over batches: counts add; the trackers' buckets put under/overflow at the ends.
  pooled = histogram.Histogram.pool(edges, [out, out])
  np.testing.assert_array_equal(pooled.counts, 2 * out["counts"])
  bucket_edges, counts = pooled.buckets()
  assert len(bucket_edges) == len(counts) + 1 == 64 + 3 and counts.sum() == 2 * x.size
  assert np.all(np.diff(bucket_edges) > 0)


def test_histogram_config_is_validated():
  for field, value in [("ffn_hist_bins", -1), ("ffn_hist_bins", 1000), ("ffn_hist_range", 0.0),
                       ("wandb_mode", "sometimes")]:
    with pytest.raises(config_lib.ConfigError, match=f"metrics.{field}"):
      config_lib.validate(tiny(**{f"metrics.{field}": value}))


@pytest.mark.slow
def test_tiny_run_writes_a_histogram_per_layer_per_evaluation(tmp_path):
  c = tiny(**{"train.steps": 4, "train.eval_every": 2, "train.log_every": 2, **DEEP,
              "optim.warmup_steps": 1, "metrics.ffn_hist_bins": 16, "metrics.ffn_hist_range": 2.0})
  train.run(c, tmp_path)
  logged = rows(tmp_path)
  evals = [r["step"] for r in logged if "val_loss" in r]
  assert evals == [0, 2, 4]
  assert not any(k.startswith("ffn_preact") for r in logged for k in r)  # rows stay scalar
  hists = {}
  for event in read_events(tmp_path / "tb"):
    for value in event.summary.value:
      if value.HasField("histo"):
        hists.setdefault(value.tag, []).append((event.step, value.histo))
  assert sorted(hists) == [f"ffn_preact/layer_{i}" for i in range(c.model.num_layers)]
  entries = c.data.val_batches * c.train.batch_size * c.data.seq_len * c.model.d_ff
  for tag, per_step in hists.items():
    assert [step for step, _ in per_step] == evals
    for _, h in per_step:
      assert h.num == sum(h.bucket) == entries and len(h.bucket) in (16, 17, 18)


def test_a_full_disk_in_tensorboards_thread_is_raised_by_the_run_not_printed_or_waited_on(
    tmp_path, monkeypatch, capfd):
  """tensorboardX writes in a thread, from a queue of 10 events by default: a thread ended by a
  full disk printed its traceback, and the rows after it filled the queue and waited forever. The
  error must reach the run (which says it in one line: tests/test_resume.py), and soon."""
  from tensorboardX import record_writer

  def full(self, data):
    raise OSError(errno.ENOSPC, "No space left on device")
  board, raised = run_rows.TensorBoard(tmp_path), []  # its first event is written, not queued
  monkeypatch.setattr(record_writer.RecordWriter, "write", full)

  def rows_then_close():
    try:
      for step in range(200):  # 20 events a row
        board.write({"step": step, **{f"metric_{i}": float(i) for i in range(20)}})
      board.close()
    except OSError as e:
      raised.append(e)
  writer = threading.Thread(target=rows_then_close, daemon=True)
  writer.start()
  writer.join(timeout=20)
  assert not writer.is_alive(), "the rows wait on tensorboardX's dead thread"
  assert [e.errno for e in raised] == [errno.ENOSPC]
  assert "Traceback" not in capfd.readouterr().err


# --- Weights & Biases (offline) --------------------------------------------------------------


def wandb_records(run_dir: pathlib.Path) -> list:
  """The records of an offline run's `run-<id>.wandb` file: a 7-byte header, then 32 KiB
  blocks of chunks (checksum u32, length u16, type u8: full 1, first 2, middle 3, last 4), each
  record a `wandb_internal_pb2.Record`. wandb has no reader of its own for it."""
  from wandb.proto import wandb_internal_pb2
  (path,) = run_dir.glob("run-*.wandb")
  raw, i, block, records, parts = path.read_bytes(), 7, 32768, [], b""
  assert raw[:4] == b":W&B"
  while i + 7 <= len(raw):
    if block - i % block < 7:  # A block's tail too short for a chunk header is padding.
      i += block - i % block
      continue
    _, n, kind = struct.unpack("<IHB", raw[i:i + 7])
    parts, i = parts + raw[i + 7:i + 7 + n], i + 7 + n
    if kind in (1, 4):
      records.append(wandb_internal_pb2.Record.FromString(parts))
      parts = b""
  return records


@pytest.mark.slow
def test_wandb_offline_run_holds_the_logged_metrics(tmp_path, monkeypatch):
  pytest.importorskip("wandb", reason="the wandb extra: pip install -e '.[wandb]'")
  monkeypatch.setenv("WANDB_SILENT", "true")
  monkeypatch.setenv("WANDB_DIR", str(tmp_path / "elsewhere"))  # dir= wins: the workdir
  c = tiny(**{"train.steps": 4, "train.eval_every": 2, "train.log_every": 2,
              "optim.warmup_steps": 1, "metrics.wandb_project": "actlab-test",
              "metrics.wandb_mode": "offline",
              "metrics.ffn_hist_bins": 8})
  work = tmp_path / "run"
  summary = train.run(c, work)
  (run_dir,) = (work / "wandb").glob("offline-run-*")
  segments = json.loads((work / "provenance.json").read_text())["segments"]
  run_id = run_rows.wandb_run_id(work, segments[0])
  assert run_dir.name.endswith(run_id)
  history, config, summaries = {}, {}, {}
  for record in wandb_records(run_dir):
    kind = record.WhichOneof("record_type")
    if kind == "history":
      items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json)
               for i in record.history.item}
      history[items["_step"]] = items
    elif kind == "run":
      assert record.run.run_id == run_id and record.run.project == "actlab-test"
      config = {u.key: json.loads(u.value_json) for u in record.run.config.update}
    elif kind == "summary":
      summaries.update({"/".join(u.nested_key) or u.key: json.loads(u.value_json)
                        for u in record.summary.update})
  logged = {r["step"]: r for r in rows(work)}
  assert sorted(history) == sorted(logged)
  for step, row in logged.items():
    if "train_loss" in row:
      assert history[step]["train_loss"] == row["train_loss"]
    assert history[step].get("val_loss") == row.get("val_loss")
  assert history[2]["ffn_preact/layer_1/_type"] == "histogram"
  assert config["model"] == c.model.to_dict() and config["metrics"]["wandb_mode"] == "offline"
  assert summaries["final_val_loss"] == summary["final_val_loss"]
  assert summaries["status"] == summary["status"]


def test_wandb_run_id_is_stable_per_run(tmp_path):
  first = {"host": "a", "started": "2026-01-01T00:00:00+00:00"}
  run_id = run_rows.wandb_run_id(tmp_path / "run", first)
  assert run_id == run_rows.wandb_run_id(tmp_path / "run", dict(first))  # resumed: the same
  assert run_id != run_rows.wandb_run_id(tmp_path / "other", first)
  assert run_id != run_rows.wandb_run_id(tmp_path / "run", {**first, "host": "b"})
  assert len(run_id) <= 64 and run_id.replace("-", "").isalnum()


def test_wandb_without_the_extra_is_refused_by_validation(monkeypatch):
  import importlib.util
  real = importlib.util.find_spec
  monkeypatch.setattr(importlib.util, "find_spec",
                      lambda name, *a: None if name == "wandb" else real(name, *a))
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(tiny(**{"metrics.wandb_project": "p"}))
  assert str(e.value) == ("metrics.wandb_project='p' needs wandb, which is not installed: "
                          'pip install -e ".[wandb]"')
  assert "\n" not in str(e.value)


# --- TensorBoard HParams of a sweep ----------------------------------------------------------


def test_sweep_hparams_table_has_every_cell(tmp_path):
  """A sweep directory as the sweep leaves it (sweep.json, summaries; one cell unfinished):
  every ended cell becomes one HParams session with its varied fields and final numbers."""
  cells = [{"name": f"activation={a},lr={lr:g},seed={s}",
            "overrides": {"model.activation": a, "optim.lr": lr, "train.seed": s}}
           for a in ("relu", "gelu") for lr in (1e-3, 0.5) for s in (0, 1)]
  workdir_lib.write_json(tmp_path / "sweep.json", {"cells": cells})
  summaries = {}
  for k, cell in enumerate(cells[:-1]):
    diverged = cell["overrides"]["optim.lr"] == 0.5
    summaries[cell["name"]] = {"status": "diverged" if diverged else "stable",
                               "final_val_loss": None if diverged else 2.0 + k / 10,
                               "best_val_loss": 1.9 + k / 10}
    (tmp_path / cell["name"]).mkdir()
    workdir_lib.write_json(tmp_path / cell["name"] / "summary.json", summaries[cell["name"]])
  assert tracking.write_hparams(tmp_path) == len(cells) - 1
  assert tracking.write_hparams(tmp_path) == 0  # written once
  from tensorboardX.proto import plugin_hparams_pb2
  sessions = sorted(p.name for p in (tmp_path / "tb_hparams").iterdir())
  assert sessions == sorted(summaries) and not list(tmp_path.glob(".tb_hparams-*"))
  for name, summary in summaries.items():
    hparams, scalars = {}, {}
    for event in read_events(tmp_path / "tb_hparams" / name):
      for value in event.summary.value:
        if value.tag == "_hparams_/session_start_info":
          data = plugin_hparams_pb2.HParamsPluginData.FromString(
              value.metadata.plugin_data.content)
          hparams = {k: v.string_value or v.number_value
                     for k, v in data.session_start_info.hparams.items()}
        elif value.HasField("simple_value"):
          scalars[value.tag] = value.simple_value
    overrides = next(c["overrides"] for c in cells if c["name"] == name)
    assert hparams == pytest.approx(overrides)
    status = summary["status"]
    assert scalars["hparam/status"] == tracking.STATUS_CODES[status]
    assert scalars["hparam/diverged"] == (status == "diverged")
    assert scalars["hparam/best_val_loss"] == pytest.approx(summary["best_val_loss"])
    if summary["final_val_loss"] is None:
      assert np.isnan(scalars["hparam/final_val_loss"])
    else:
      assert scalars["hparam/final_val_loss"] == pytest.approx(summary["final_val_loss"])


@pytest.mark.slow
def test_tensorboard_does_not_import_torch(tmp_path):
  """tensorboardX's writer imports torch wherever it is installed (seconds per process); actlab's
  TensorBoard writer keeps it out, and torch still imports afterwards."""
  pytest.importorskip("torch", reason="torch is not installed: nothing to keep out")
  code = ("import sys, pathlib\n"
          "from actlab.run import rows as run_rows\n"
          "w = run_rows.TensorBoard(pathlib.Path(sys.argv[1]))\n"
          "w.write({'step': 1, 'train_loss': 2.5}); w.close()\n"
          "print('torch' in sys.modules)\n"
          "import torch\n"
          "print(torch.ones(2).sum().item())\n")
  out = subprocess.run([sys.executable, "-c", code, str(tmp_path)], capture_output=True,
                       text=True, timeout=120)
  assert out.returncode == 0, out.stderr[-2000:]
  assert out.stdout.split() == ["False", "2.0"]
  assert list(tmp_path.glob("events.out.tfevents.*"))  # the writer wrote its events

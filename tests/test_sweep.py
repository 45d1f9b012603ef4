"""Sweeps: grid, names, overrides, the shipped sweep files, compile reuse, skip/resume/diverge."""

import contextlib
import json
import pathlib
import shutil
import struct
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actlab import activations, config as config_lib, models, steps, sweep, train
from actlab.checkpoint import Checkpoints
from conftest import REPO, tiny

EXPERIMENTS = REPO / "experiments"


def test_grid_names_overrides_and_groups():
  s = sweep.parse({"axes": {"model.activation": ["relu", "gelu"], "optim.lr": [1e-3, 3e-3]},
                   "seeds": [0, 1], "fixed": {"train.steps": 20}})
  cells = sweep.cells(tiny(), s)
  assert len(cells) == 2 * 2 * 2
  assert cells[0].name == "activation=relu,lr=0.001,seed=0"
  assert cells[-1].name == "activation=gelu,lr=0.003,seed=1"
  last = cells[-1].config
  assert (last.model.activation, last.optim.lr, last.train.seed, last.train.steps) == (
      "gelu", 3e-3, 1, 20)
  groups = sweep.group(cells)
  assert [len(g) for g in groups] == [4, 4]  # LR and seed do not split a compile group
  assert {c.config.model.activation for c in groups[0]} == {"relu"}


def test_ambiguous_short_names_use_the_full_key():
  s = sweep.parse({"axes": {"model.dropout": [0.0, 0.1], "optim.b1": [0.9]}, "seeds": [3]})
  assert sweep.cells(tiny(), s)[1].name == "dropout=0.1,b1=0.9,seed=3"
  c = tiny()
  c.data.dropout = 0.0  # another section with the same field name
  s = sweep.parse({"axes": {"model.dropout": [0.0], "data.dropout": [0.1]}})
  assert sweep.cells(c, s)[0].name == "model.dropout=0,data.dropout=0.1,seed=0"


@pytest.mark.parametrize("bad, message", [
    ({"axes": {"optim.lrr": [1e-3]}}, "no such field"),
    ({"axes": {"optimizer.lr": [1e-3]}}, "no section"),
    ({"axes": {"model.activation": ["relu", "relu"]}}, "distinct"),
    ({"axes": {"model.activation": ["nope"]}}, "valid|choose|unknown"),
    ({"axes": {"train.seed": [1]}}, "seeds"),
    ({"grid": {}}, "unknown keys"),
])
def test_bad_sweeps_are_refused_before_anything_runs(bad, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    sweep.cells(tiny(), sweep.parse(bad))


def test_reference_grid_and_smoke_variants_load():
  full = sweep.load(f"{EXPERIMENTS}/relu_vs_gelu_lr.py")
  assert full.axes == {"model.activation": ["relu", "gelu"], "optim.lr": [1e-4, 1e-3, 3e-3]}
  assert len(full.seeds) == 3
  for name in ("relu_vs_gelu_lr", "activation_zoo", "glu_variants"):
    for arg in ("", ":smoke"):
      s = sweep.load(f"{EXPERIMENTS}/{name}.py{arg}")
      cells = sweep.cells(config_lib.base(), s)  # validates every cell
      if arg:
        assert all(c.config.data.source == "synthetic" for c in cells)
  with pytest.raises(config_lib.ConfigError, match="unknown variant 'nope'"):
    sweep.load(f"{EXPERIMENTS}/relu_vs_gelu_lr.py:nope")
  zoo = sweep.load(f"{EXPERIMENTS}/activation_zoo.py")
  assert zoo.axes["model.activation"] == list(activations.NAMES)


def test_glu_variants_are_parameter_matched():
  s = sweep.load(f"{EXPERIMENTS}/glu_variants.py:smoke")
  names = s.axes["model.activation"]
  counts = {}
  for cell in sweep.cells(config_lib.base(), s)[::len(s.seeds)]:
    task = steps.Steps.create(cell.config, 257)
    counts[cell.config.model.activation] = models.count_params(
        jax.eval_shape(task.init, 0).params)["non_embedding"]
  for plain, gated in zip(names[::2], names[1::2]):
    assert not activations.get(plain).gated and activations.get(gated).gated
    assert abs(counts[gated] / counts[plain] - 1) < 0.03, (plain, gated, counts)


# --- A small sweep, run once for the tests below -------------------------------------------

LRS, SEEDS, BAD_LR, BAD_FROM = [0.5, 1e-3, 3e-3], [0, 1], 0.5, 13


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
  """Six 20-step cells (LR × seed) of the tiny decoder with statistics, sharpness and
  TensorBoard on. Every training step is counted at trace time, and peak LR 0.5 makes the
  parameters NaN from step 13 on: a deterministic divergence in the first cells of the grid."""
  traces = []
  original = steps.Steps.train_step

  def counted(self, state, batch):
    traces.append(1)  # Python runs at trace time only.
    state, out = original(self, state, batch)
    bad = (state.opt_state.hyperparams["peak_lr"] > 0.1) & (state.step >= BAD_FROM)
    nan = jnp.where(bad, jnp.nan, 0.0)
    out["param_norm"] = out["param_norm"] + nan
    return state.replace(params=jax.tree.map(lambda p: p + nan, state.params)), out

  tmp = tmp_path_factory.mktemp("sweep")
  spec = tmp / "grid.py"
  spec.write_text(
      "def get_sweep(arg=None):\n"
      f"  return {{'axes': {{'optim.lr': {LRS!r}}}, 'seeds': {SEEDS!r},\n"
      "          'fixed': {'train.steps': 20, 'train.checkpoint_every': 10,\n"
      "                    'train.eval_every': 10, 'metrics.sharpness_every': 10,\n"
      "                    'metrics.sharpness_iters': 5}}\n")
  with pytest.MonkeyPatch.context() as mp, compilations() as compiled:
    mp.setattr(steps.Steps, "train_step", counted)
    cache, compiled_by_cell = {}, []
    results = sweep.run(tiny(), str(spec), tmp / "runs", cache=cache,
                        log=lambda _: compiled_by_cell.append(len(compiled)))
    yield types.SimpleNamespace(root=tmp / "runs", spec=str(spec), results=results,
                                traces=traces, cache=cache, compiled_by_cell=compiled_by_cell)


@contextlib.contextmanager
def compilations():
  """The list of XLA compilations (jax.monitoring events) while the context is open."""
  events = []

  def listener(name, *_, **__):
    if name.endswith("backend_compile_duration"):
      events.append(name)

  jax.monitoring.register_event_duration_secs_listener(listener)
  try:
    yield events
  finally:
    jax.monitoring.unregister_event_duration_listener(listener)


def _rows(workdir):
  return [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]


def _losses(workdir):
  return np.array([r["train_loss"] for r in _rows(workdir) if "train_loss" in r])


@pytest.mark.slow
def test_cells_differing_in_lr_and_seed_share_one_compiled_step(swept, tmp_path):
  assert len(swept.traces) == 1
  # log() runs once at the start and once per finished cell: all compiling happened in cell 1.
  first, *later = swept.compiled_by_cell[1:]
  assert first >= 4 and later == [first] * 5, swept.compiled_by_cell
  assert list(swept.results) == [f"lr={lr:g},seed={s}" for lr in LRS for s in SEEDS]
  # The LR and the seed reached the shared step: logged LRs scale with the peak LR, the seed
  # changes the initialisation and the LR does not.
  lr_at = lambda name: _rows(swept.root / name)[1]["lr"]
  assert lr_at("lr=0.003,seed=0") == pytest.approx(3 * lr_at("lr=0.001,seed=0"), rel=1e-5)
  init = {n: r["initial_val_loss"] for n, r in swept.results.items()}
  assert init["lr=0.001,seed=0"] == init["lr=0.003,seed=0"] != init["lr=0.001,seed=1"]
  # A cell equals the same config run on its own, compiled afresh (without sharpness, which
  # takes long to compile and does not touch training).
  cell = next(c for c in sweep.cells(tiny(), sweep.load(swept.spec)) if c.name == "lr=0.003,seed=1")
  cell.config.metrics.sharpness_every = 0
  train.run(cell.config, tmp_path / "alone")
  assert len(swept.traces) == 2
  np.testing.assert_allclose(_losses(tmp_path / "alone"), _losses(swept.root / cell.name),
                             rtol=1e-6)


@pytest.mark.slow
def test_runs_log_statistics_sharpness_and_tensorboard(swept):
  workdir = swept.root / "lr=0.003,seed=0"
  rows = _rows(workdir)
  evals = [r for r in rows if "val_loss" in r]
  assert [r["step"] for r in evals] == [0, 10, 20]
  for r in evals:
    assert {"act_zero_frac", "act_zero_frac/layer_1", "dead_units", "act_mean", "act_std",
            "attn_logit_max/layer_0", "sharpness"} <= set(r)
    assert r["attn_logit_max"] == max(r["attn_logit_max/layer_0"], r["attn_logit_max/layer_1"])
  assert {"grad_norm", "update_norm", "param_norm", "lr"} <= set(rows[1])
  summary = swept.results[workdir.name]
  assert summary["status"] == "stable" and summary["act_zero_frac"] == evals[-1]["act_zero_frac"]
  assert summary["sharpness"] == evals[-1]["sharpness"] != evals[0]["sharpness"]
  scalars = _read_events(workdir / "tb")
  assert [step for step, _ in scalars["act_zero_frac"]] == [0, 10, 20]
  assert scalars["train_loss"][-1] == (20, pytest.approx(rows[-1]["train_loss"]))


def _read_events(logdir):
  """{tag: [(step, value)]} from TensorBoard event files (TFRecords of Event protos)."""
  from tensorboardX.proto import event_pb2
  out = {}
  for path in sorted(logdir.glob("events.out.tfevents.*")):
    raw, i = path.read_bytes(), 0
    while i < len(raw):
      (n,) = struct.unpack("<Q", raw[i:i + 8])  # length, its CRC, the record, its CRC
      event = event_pb2.Event.FromString(raw[i + 12:i + 12 + n])
      i += 12 + n + 4
      for value in event.summary.value:
        out.setdefault(value.tag, []).append((event.step, value.simple_value))
  return out


@pytest.mark.slow
def test_divergence_is_a_result_and_keeps_the_last_good_checkpoint(swept):
  for seed in SEEDS:
    name = f"lr={BAD_LR:g},seed={seed}"
    summary = swept.results[name]
    assert summary["status"] == "diverged" and summary["diverged_at"] == BAD_FROM
    assert json.loads((swept.root / name / "summary.json").read_text())["status"] == "diverged"
    last = _rows(swept.root / name)[-1]
    assert last["step"] == BAD_FROM and last["param_norm"] is None  # strict JSON: null
    ckpts = swept.root / name / "checkpoints"
    assert sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) == [10]
  # The sweep went on after the diverged cells (they come first in the grid).
  assert all(r["status"] != "diverged" for n, r in swept.results.items() if "lr=0.5" not in n)
  compiled = next(iter(swept.cache.values()))
  ckpt = Checkpoints(ckpts.absolute(), 3)
  restored, _ = ckpt.restore(10, compiled.init(SEEDS[-1], BAD_LR))
  ckpt.close()
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(restored.params))
  # Rerunning a diverged run returns its recorded result without training.
  cell = sweep.cells(tiny(), sweep.load(swept.spec))[1]
  traces = len(swept.traces)
  assert train.run(cell.config, swept.root / cell.name, cache=swept.cache) == summary
  assert len(swept.traces) == traces


@pytest.mark.slow
def test_rerun_skips_finished_cells_and_resumes_an_interrupted_one(swept, tmp_path, monkeypatch):
  root = tmp_path / "runs"
  shutil.copytree(swept.root, root)
  victim = root / "lr=0.001,seed=1"
  before = _losses(victim)
  (victim / "summary.json").unlink()  # As if killed after its step-10 checkpoint.
  shutil.rmtree(victim / "checkpoints" / "20")
  real_run_group, ran = train.run_group, []

  def counting_run_group(configs, workdirs, cache=None, log=print):
    ran.extend(pathlib.Path(w).name for w in workdirs)
    return real_run_group(configs, workdirs, cache, log)

  monkeypatch.setattr(train, "run_group", counting_run_group)
  with compilations() as compiled:
    again = sweep.run(tiny(), swept.spec, root, log=lambda _: None, cache=swept.cache)
  assert ran == [victim.name]  # finished and diverged cells were skipped
  assert compiled == []  # the resumed state hits the compiled functions of the fresh runs
  assert again["lr=0.5,seed=0"]["status"] == "diverged"
  assert [r["step"] for r in _rows(victim)] == [r["step"] for r in _rows(swept.root / victim.name)]
  np.testing.assert_allclose(_losses(victim), before, rtol=1e-6)
  assert again[victim.name]["final_val_loss"] == pytest.approx(
      swept.results[victim.name]["final_val_loss"], rel=1e-6)

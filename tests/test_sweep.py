"""Sweeps: compile reuse, skip/resume/diverge, shards and worker processes (the grid itself:
test_grid.py)."""

import collections
import contextlib
import json
import math
import os
import pathlib
import re
import shutil
import socket
import struct
import subprocess
import sys
import time
import types

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest
from absl import flags

from actlab import config as config_lib, core, sweep
from actlab.core import kernels
from actlab.infra import errors, workdir as workdir_lib
from actlab.infra.checkpoint import Checkpoints
from actlab.run import loop, program, train
from actlab.sweep import grid, progress, vectorized, workers
from conftest import REPO, production_env, tiny
from test_entry_points import guarded

EXPERIMENTS = REPO / "experiments"


# --- A small sweep, run once for the tests below -------------------------------------------

LRS, SEEDS, BAD_LR, BAD_FROM = [0.5, 3e-3], [0, 1], 0.5, 13


@pytest.fixture(scope="module")
def swept(tmp_path_factory):
  """Four 20-step cells (LR × seed) of the tiny decoder with statistics, sharpness and
  TensorBoard on. Every training step is counted at trace time, and peak LR 0.5 makes the
  parameters NaN from step 13 on: a deterministic divergence in the first cells of the grid.
  (Sharpness by 2 iterations, as in test_train's runs: the session's XLA cache then holds the
  one sharpness program both compile.)"""
  traces = []
  original = core.Step.train_step

  def counted(self, state, batch, diagnostics=True):
    traces.append(diagnostics)  # Python runs at trace time only.
    state, out = original(self, state, batch, diagnostics)
    bad = (state.opt_state.hyperparams["peak_lr"] > 0.1) & (state.step >= BAD_FROM)
    nan = jnp.where(bad, jnp.nan, 0.0)
    out["grad_norm"] = out["grad_norm"] + nan
    return state.replace(params=jax.tree.map(lambda p: p + nan, state.params)), out

  tmp = tmp_path_factory.mktemp("sweep")
  spec = tmp / "grid.py"
  spec.write_text(
      "def get_sweep(arg=None):\n"
      f"  return {{'axes': {{'optim.lr': {LRS!r}}}, 'seeds': {SEEDS!r},\n"
      "          'fixed': {'train.steps': 20, 'train.checkpoint_every': 10,\n"
      "                    'train.eval_every': 10, 'metrics.sharpness_every': 10,\n"
      "                    'metrics.sharpness_iters': 2}}\n")
  with pytest.MonkeyPatch.context() as mp, compilations() as compiled:
    mp.setattr(core.Step, "train_step", counted)
    cache, compiled_by_cell, logged_at = {}, [], []

    def log(_):
      compiled_by_cell.append(len(compiled))
      logged_at.append(time.perf_counter())
    results = sweep.run(tiny(), str(spec), tmp / "runs", cache=cache, log=log)
    yield types.SimpleNamespace(root=tmp / "runs", spec=str(spec), results=results,
                                traces=traces, cache=cache, compiled_by_cell=compiled_by_cell,
                                logged_at=logged_at)


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
  assert sorted(swept.traces) == [False, True]  # the step, and the step with diagnostics
  # log() runs once at the start, once per finished cell and once for the HParams table: all
  # compiling happened in cell 1.
  first, *later = swept.compiled_by_cell[1:5]
  assert first >= 4 and later == [first] * 3, swept.compiled_by_cell
  assert len(swept.compiled_by_cell) == 6, swept.compiled_by_cell
  assert list(swept.results) == [f"lr={lr:g},seed={s}" for s in SEEDS for lr in LRS]  # by seed
  # A later cell's fixed cost is its own, from its start to its first step, not the process's
  # age: within the time between the log lines around it.
  for k, summary in enumerate(list(swept.results.values())[1:], start=2):
    startup = summary["timing"]["startup_sec"]
    assert 0 < startup < swept.logged_at[k] - swept.logged_at[k - 1], (k, startup)
  # The LR and the seed reached the shared step: logged LRs scale with the peak LR, the seed
  # changes the initialisation and the LR does not (a row before the LR-0.5 cells diverge).
  lr_at = lambda name: _rows(swept.root / name)[1]["lr"]
  assert lr_at("lr=0.5,seed=0") == pytest.approx(0.5 / 3e-3 * lr_at("lr=0.003,seed=0"),
                                                 rel=1e-5)
  init = {n: r["initial_val_loss"] for n, r in swept.results.items()}
  assert init["lr=0.5,seed=0"] == init["lr=0.003,seed=0"] != init["lr=0.5,seed=1"]
  # A cell equals the same config run on its own, compiled afresh (without sharpness, which
  # takes long to compile and does not touch training).
  cell = next(c for c in grid.cells(tiny(), grid.load(swept.spec)) if c.name == "lr=0.003,seed=1")
  cell.config.metrics.sharpness_every = 0
  train.run(cell.config, tmp_path / "alone")
  assert len(swept.traces) == 4
  np.testing.assert_allclose(_losses(tmp_path / "alone"), _losses(swept.root / cell.name),
                             rtol=1e-6)


@pytest.mark.slow
def test_runs_log_statistics_sharpness_and_tensorboard(swept):
  workdir = swept.root / "lr=0.003,seed=0"
  rows = _rows(workdir)
  evals = [r for r in rows if "val_loss" in r]
  assert [r["step"] for r in evals] == [0, 10, 20]
  for r in evals:
    assert {"act_zero_frac", "act_zero_frac/layer_0", "dead_units", "act_mean", "act_std",
            "attn_logit_max/layer_0", "sharpness"} <= set(r)
    assert r["attn_logit_max"] == r["attn_logit_max/layer_0"]  # the tiny model's one block
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
    assert last["step"] == BAD_FROM and last["grad_norm"] is None  # strict JSON: null
    ckpts = swept.root / name / "checkpoints"
    assert sorted(int(p.name) for p in ckpts.iterdir() if p.name.isdigit()) == [10]
  # The sweep went on after the diverged cells (they come first in the grid).
  assert all(r["status"] != "diverged" for n, r in swept.results.items() if "lr=0.5" not in n)
  compiled = next(iter(swept.cache.values()))
  ckpt = Checkpoints(ckpts.absolute(), 3)
  restored, _ = ckpt.restore(10, compiled.run_state_like)
  ckpt.close()
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(restored.params))
  # Rerunning a diverged run returns its recorded result without training.
  cell = grid.cells(tiny(), grid.load(swept.spec))[1]
  traces = len(swept.traces)
  assert train.run(cell.config, swept.root / cell.name, cache=swept.cache) == summary
  assert len(swept.traces) == traces


@pytest.mark.slow
def test_rerun_skips_finished_cells_and_resumes_an_interrupted_one(swept, tmp_path, monkeypatch):
  root = tmp_path / "runs"
  shutil.copytree(swept.root, root)
  victim = root / "lr=0.003,seed=1"
  before = _losses(victim)
  (victim / "summary.json").unlink()  # As if killed after its step-10 checkpoint.
  shutil.rmtree(victim / "checkpoints" / "20")
  real_run_group, ran = train.run_group, []

  def counting_run_group(configs, workdirs, cache=None, log=print, **hooks):
    ran.extend(pathlib.Path(w).name for w in workdirs)
    return real_run_group(configs, workdirs, cache, log, **hooks)

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


# --- Shards and workers ----------------------------------------------------------------------

CONFIG_FILE = str(REPO / "tests" / "tiny_config.py")


def test_shards_partition_the_cells_and_each_trains_only_its_own(tmp_path, monkeypatch):
  axes = {"model.activation": ["relu", "gelu"], "optim.lr": [1e-3, 3e-3, 1e-2]}
  spec = tmp_path / "grid.py"
  spec.write_text(f"def get_sweep(arg=None):\n  return {{'axes': {axes!r}, 'seeds': [0, 1], "
                  "'baseline': 'gelu'}\n")
  names = [c.name for c in sweep.plan(tiny(), str(spec), tmp_path / "plan", manifest=False)]
  assert len(names) == 12
  for n in (1, 2, 5, 12, 13):
    shards = [[c.name for c in sweep.plan(tiny(), str(spec), tmp_path / "plan", (i, n),
                                          manifest=False)] for i in range(n)]
    assert collections.Counter(sum(shards, [])) == collections.Counter(names)  # each cell once
    assert [s[:1] for s in shards] == [names[i:i + 1] for i in range(n)]  # cells i, i + n, …
  # A sweep run as shard i of 3 trains cells i, i + 3, … and writes the whole grid's sweep.json.
  trained = []

  def fake_run_group(configs, workdirs, cache=None, log=print, **hooks):
    trained.extend(pathlib.Path(w).name for w in workdirs)
    return [{"status": "stable", "final_val_loss": 1.0}] * len(configs)

  monkeypatch.setattr(train, "run_group", fake_run_group)
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # cell by cell, on a GPU host too
  for i in range(3):
    results = sweep.run(tiny(), str(spec), tmp_path / "runs", log=lambda _: None, shard=(i, 3))
    assert list(results) == trained[-4:] and sorted(trained[-4:]) == sorted(names[i::3])
  assert sorted(trained) == sorted(names)
  # Seed by seed: every activation and LR of seed 0 (its own cells, shard by shard) before seed 1.
  seeds = [name.rsplit("seed=", 1)[1] for name in trained]
  assert all(seeds[4 * i:4 * i + 4] == sorted(seeds[4 * i:4 * i + 4]) for i in range(3))
  manifest = json.loads((tmp_path / "runs" / "sweep.json").read_text())
  assert [c["name"] for c in manifest["cells"]] == names
  assert manifest["baseline"] == "gelu"  # the report's baseline, from the sweep file


def test_cpus_split_into_disjoint_blocks_that_keep_hyperthreads_together(monkeypatch):
  for cpus in ([0], [0, 1], list(range(8)), [3, 5, 6, 10, 11]):
    for n in range(1, len(cpus) + 1):
      blocks = workers.split_cpus(cpus, n)
      assert len(blocks) == n and all(blocks)
      assert collections.Counter(sum(blocks, [])) == collections.Counter(cpus)
      assert max(map(len, blocks)) - min(map(len, blocks)) <= 1
  # 4 cores × 2 threads as Linux often numbers them: CPUs c and c + 4 share core c.
  assert workers.split_cpus(range(8), 4, core=lambda c: c % 4) == [[0, 4], [1, 5], [2, 6], [3, 7]]
  assert workers.split_cpus(range(8), 2, core=lambda c: c % 4) == [[0, 4, 1, 5], [2, 6, 3, 7]]
  for n in (0, 3):
    with pytest.raises(ValueError):
      workers.split_cpus([0, 1], n)
  assert workers.ranges([8, 0, 1, 2, 5, 7]) == "0-2,5,7-8"
  monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5, 6})
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
  assert [(w.cpus, w.gpu) for w in workers.plan(2)] == [((4, 5), None), ((6,), None)]
  with pytest.raises(errors.UserError, match=r"^--workers=4: this process may use 3 CPU\(s\) "
                                             r"\(4-6\); use at most --workers=3$"):
    workers.plan(4)
  monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,GPU-ab12")
  assert [w.gpu for w in workers.plan(2)] == ["3", "GPU-ab12"]
  with pytest.raises(errors.UserError, match="2 GPU"):
    workers.plan(3)


def test_children_sharing_a_pipe_under_pythonunbuffered_write_whole_lines():
  """Under `python -u` print writes a message and its newline in two calls; the children of
  `--workers` printing to their parent's pipe spliced their lines (a CI failure) until the
  sweep's processes called workers.whole_lines(). The children load workers.py alone (the
  package's __init__ imports JAX: seconds) and write for long enough to overlap (without
  whole_lines(), 30,000 lines each spliced thousands on a 2-core machine; 3,000 often none)."""
  child = ("import importlib.util, sys\n"
           "spec = importlib.util.spec_from_file_location('workers', 'actlab/sweep/workers.py')\n"
           "workers = sys.modules['workers'] = importlib.util.module_from_spec(spec)\n"
           "spec.loader.exec_module(workers)\nworkers.whole_lines()\n"
           "for i in range(30000):\n"
           "  print(f'child {sys.argv[1]} line {i}', flush=True)\n"
           "  print(f'child {sys.argv[1]} error {i}', file=sys.stderr, flush=True)\n")
  read, write = os.pipe()
  children = [subprocess.Popen([sys.executable, "-u", "-c", child, str(k)], cwd=REPO,
                               stdout=write, stderr=write) for k in (0, 1)]
  os.close(write)
  with os.fdopen(read) as pipe:
    lines = pipe.read().splitlines()
  assert [c.wait() for c in children] == [0, 0]
  assert len(lines) == 4 * 30000
  spliced = [line for line in lines if not re.fullmatch(r"child [01] (line|error) \d+", line)]
  assert not spliced, spliced[:3]


def test_bad_shard_or_axis_flag_is_refused_before_anything_is_written(tmp_path):
  for shard in ("3/2", "x"):
    with pytest.raises(errors.UserError, match=rf"^--shard={shard}: give i/N"):
      grid.parse_shard(shard)  # what `main` does first
  base = tiny(**{"optim.lr": 0.1})  # as --config.optim.lr=0.1 sets it
  with pytest.raises(errors.UserError,
                     match=r"^--config.optim.lr: the sweep varies optim.lr \(its axis"):
    sweep.run(base, f"{EXPERIMENTS}/relu_vs_gelu_lr.py:smoke", tmp_path / "runs",
              log=lambda _: None, overridden=["optim.lr"])
  assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_bad_workers_flag_is_one_line_and_exit_2(tmp_path):
  """The command line's form of a refused flag (the others: the test above), checked before
  the sweep writes anything."""
  result = subprocess.run([sys.executable, "-m", "actlab.sweep", f"--config={CONFIG_FILE}",
                           f"--sweep={EXPERIMENTS}/relu_vs_gelu_lr.py:smoke",
                           f"--workdir={tmp_path / 'runs'}", "--workers=100000"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
  assert result.returncode == errors.UserError.exit_code, result.stderr
  assert result.stderr.startswith("error: --workers=100000: this process may use") and \
      result.stderr.count("\n") == 1, result.stderr
  assert not (tmp_path / "runs").exists()


def test_a_flag_wins_over_the_sweeps_fixed_value_in_the_parent_and_in_a_worker(
    tmp_path, monkeypatch):
  spec = tmp_path / "grid.py"
  spec.write_text("def get_sweep(arg=None):\n  return {'axes': {'optim.lr': [1e-3, 3e-3]}, "
                  "'fixed': {'train.steps': 20}}\n")
  trained = []

  def fake_run_group(configs, workdirs, cache=None, log=print, **hooks):
    trained.extend(c.train.steps for c in configs)
    return [{"status": "stable"}] * len(configs)

  monkeypatch.setattr(train, "run_group", fake_run_group)
  base = tiny(**{"train.steps": 7})  # as --config.train.steps=7 sets it
  for root, worker in [(tmp_path / "parent", False), (tmp_path / "worker", True)]:
    lines = []
    sweep.run(base, str(spec), root, log=lines.append, worker=worker, overridden=["train.steps"])
    assert trained[-2:] == [7, 7]
    said = [l for l in lines if "replaces" in l]
    if worker:  # Its parent wrote sweep.json and said it.
      assert not said and not (root / "sweep.json").exists()
    else:
      assert said == ["sweep: --config.train.steps=7 replaces the sweep's fixed train.steps=20"]
      assert json.loads((root / "sweep.json").read_text())["fixed"] == {"train.steps": 7}


HOLD = ("import fcntl, sys, time\n"
        "f = open(sys.argv[1], 'a'); fcntl.flock(f, fcntl.LOCK_EX)\n"
        "f.write(sys.argv[2]); f.flush()\n"
        "print('held', flush=True); time.sleep(120)\n")


def test_a_worker_skips_its_siblings_cells_quietly_and_says_whose_others_are(tmp_path,
                                                                             monkeypatch):
  cells = grid.cells(tiny(), grid.parse({"axes": {"optim.lr": [1e-3, 3e-3]}}))
  here = {"host": socket.gethostname(), "since": "then"}
  holders = [{**here, "pid": 4242, "parent": os.getppid()},  # another child of our parent
             {**here, "pid": 4343, "parent": os.getppid() + 1}]  # anyone else
  procs = []
  try:
    for cell, holder in zip(cells, holders):
      (tmp_path / cell.name).mkdir()
      procs.append(subprocess.Popen(
          [sys.executable, "-c", HOLD, str(tmp_path / cell.name / ".lock"), json.dumps(holder)],
          stdout=subprocess.PIPE, text=True))
      assert procs[-1].stdout.readline().strip() == "held"
    busy = lambda cell, pid: (f"{cell.name}: skipped: {tmp_path / cell.name} is in use by pid "
                              f"{pid} on {here['host']} (since then); wait for that run")
    for worker, expected in [("1/2", [busy(cells[1], 4343)]),
                             (None, [busy(cells[0], 4242), busy(cells[1], 4343)])]:
      if worker:
        monkeypatch.setenv(workers.ENV, worker)
      else:
        monkeypatch.delenv(workers.ENV)
      lines = []
      assert sweep.run_group(cells, tmp_path, {}, lines.append) == [None, None]
      assert len(lines) == len(expected) and all(map(str.startswith, lines, expected)), lines
  finally:
    for p in procs:
      p.kill()
      p.wait()


def _cpu_set(ranges: str) -> set[int]:
  """"0-2,5" → {0, 1, 2, 5}."""
  out = set()
  for part in ranges.split(","):
    a, _, b = part.partition("-")
    out.update(range(int(a), int(b or a) + 1))
  return out


@pytest.mark.slow
def test_two_workers_train_each_cell_once_with_the_results_of_one_process(tmp_path):
  if len(os.sched_getaffinity(0)) < 2:
    pytest.skip("needs 2 CPUs")
  spec = tmp_path / "grid.py"
  spec.write_text("def get_sweep(arg=None):\n"
                  "  return {'axes': {'optim.lr': [1e-3, 3e-3]}, 'seeds': [0],\n"
                  "          'fixed': {'train.steps': 10, 'train.checkpoint_every': 10,\n"
                  "                    'train.eval_every': 10, 'metrics.sharpness_every': 0}}\n")
  one, two = tmp_path / "one", tmp_path / "two"

  def run(workdir, n, timeout=600, command=(sys.executable, "-m", "actlab.sweep")):
    """`actlab.sweep --workers=n` at real runs' compile settings, which the claim is about
    (conftest.production_env), with a flag that wins over a fixed value of the sweep."""
    return subprocess.run([*command, f"--config={CONFIG_FILE}",
                           f"--sweep={spec}", f"--workdir={workdir}", f"--workers={n}",
                           "--config.train.checkpoint_every=5"],
                          cwd=REPO, env=production_env(), capture_output=True, text=True,
                          timeout=timeout)

  replaced = ("sweep: --config.train.checkpoint_every=5 replaces the sweep's fixed "
              "train.checkpoint_every=10\n")

  # Under test_entry_points' guard: the sweep sets up devices before anything asks for one.
  alone = run(one, 1, command=guarded("actlab.sweep"))
  assert alone.returncode == 0, alone.stdout + alone.stderr
  reference = re.findall(r"^\[\d/2\] (\S+): stable, val loss", alone.stdout, re.M)
  assert len(reference) == 2, alone.stdout
  result = run(two, 2)
  out = result.stdout
  assert result.returncode == 0, out + result.stderr
  # Each child reports the CPUs it may use: disjoint blocks that cover ours.
  cpus = dict(re.findall(r"^worker (\d)/2: pid \d+, CPUs (\S+)$", out, re.M))
  assert sorted(cpus) == ["0", "1"], out
  assert _cpu_set(cpus["0"]).isdisjoint(_cpu_set(cpus["1"]))
  assert _cpu_set(cpus["0"]) | _cpu_set(cpus["1"]) == os.sched_getaffinity(0)
  # Each cell trained once, by one of the children; the parent prints cell k/2 as each ends;
  # one line per child, one end line.
  trained = re.findall(r"^\[(\d)/2\] (\S+): stable, val loss", out, re.M)
  assert sorted(name for _, name in trained) == sorted(reference), out
  assert [k for k, _ in trained] == ["1", "2"], out
  assert len(re.findall(r"^worker \d/2 \(CPUs \S+\): done$", out, re.M)) == 2, out
  # The children resolve the flag as the parent did, which says so once; a cell the other child
  # trains is no error.
  assert out.startswith(replaced) and out.count(replaced) == 1, out
  assert "in use by" not in out + result.stderr, out
  assert out.count("sweep done") == 1 and out.endswith(
      f"2 stable, 0 unstable, 0 diverged; report: python -m actlab.report {two}\n"), out
  assert (two / "sweep.json").read_text() == (one / "sweep.json").read_text()
  strip = lambda rows: [{k: v for k, v in r.items() if k != "tokens_per_sec"} for r in rows]
  for name in reference:
    segments = json.loads((two / name / "provenance.json").read_text())["segments"]
    assert len(segments) == 1  # trained from scratch once, never resumed or retrained
    assert json.loads((two / name / "config.json").read_text())["train"]["checkpoint_every"] == 5
    assert strip(_rows(two / name)) == strip(_rows(one / name))  # bitwise: JSON floats
  # Run again, nothing is left to train: no child starts, the same end.
  again = run(two, 2, timeout=120)
  assert again.returncode == 0 and again.stdout.count("\n") == 2, again.stdout + again.stderr
  assert again.stdout.startswith(replaced) and again.stdout.endswith(
      f"2 stable, 0 unstable, 0 diverged; report: python -m actlab.report {two}\n"), again.stdout


# --- Progress ---------------------------------------------------------------------------------


def test_progress_lines_count_every_cell_and_time_only_those_finished_here():
  lines, now = [], [100.0]
  p = progress.Progress(["a", "b", "c", "d", "e", "f"], ["a"], lines.append,
                        clock=lambda: now[0])
  now[0] = 140.0
  p.done("b", {"status": "stable", "final_val_loss": 2.0, "wall_time_sec": 8.4})
  p.done("b", {"status": "stable"})  # reported twice (a poll after the run): once
  p.done("c", {"status": "stable"}, here=False)  # another process's: counted, not timed
  now[0] = 150.0
  p.done("d", {"status": "stable", "final_val_loss": 1.5, "wall_time_sec": 9.6})
  now[0] = 140.0 + 2 * 754
  p.done("e", {"status": "diverged", "final_val_loss": None, "wall_time_sec": 3.0})
  now[0] = 100.0 + 3 * 3700
  p.done("f", {"status": "unstable", "final_val_loss": 3.14159, "wall_time_sec": 7384})
  assert lines == ["[2/6] b: stable, val loss 2.0000, 8 s",  # it compiled: no rate yet
                   "[4/6] d: stable, val loss 1.5000, 10 s; ETA 20 s",      # 10 s a cell, 2 left
                   "[5/6] e: diverged, val loss n/a, 3 s; ETA 12 min 34 s",  # 754 s a cell, 1 left
                   "[6/6] f: unstable, val loss 3.1416, 2 h 03 min"]        # none left: no ETA
  assert progress.duration(59.4) == "59 s" and progress.duration(3599) == "59 min 59 s"


def test_the_eta_leaves_out_the_compile_of_the_first_cell_each_worker_trains():
  """Two workers, each 30 s for its first cell (compile, data) and 10 s for each later one: the
  ETA waits for a cell of each after their first, then times those."""
  lines, now = [], [0.0]
  names = [f"c{i}" for i in range(8)]
  p = progress.Progress(names, [], lines.append, clock=lambda: now[0], at_once=2)
  for name, end in zip(names, [30, 31, 40, 41, 50, 51, 60, 61]):
    now[0] = float(end)
    p.done(name, {"status": "stable"})
  etas = [l.partition("; ETA ")[2] or None for l in lines]
  # 2 cells a 10 s from 31 s on: 5 s a cell (cells left × 5 s; 19 s = 3 × 19/3, 6 s = 29/5).
  assert etas == [None, None, None, "20 s", "19 s", "10 s", "6 s", None], lines
  cells = grid.cells(tiny(**{"sweep.vectorize": True}), grid.parse(
      {"axes": {"model.activation": ["relu", "gelu"], "optim.lr": [1e-3, 3e-3]}, "seeds": [0, 1]}))
  assert sweep._at_once(cells[:1], 2) == 2  # a program of one cell per worker
  assert sweep._at_once(cells, 2) == 8  # a vectorized group of 4 per worker
  for cell in cells:  # a sweep's cells share its settings
    cell.config.sweep.max_runs = 3
  assert sweep._at_once(cells, 1) == 3
  auto = grid.cells(tiny(), grid.parse({"axes": {"optim.lr": [1e-3, 3e-3]}, "seeds": [0, 1]}))
  assert sweep._at_once(auto, 2, "cpu") == 2 and sweep._at_once(auto, 2, "gpu") == 8
  assert sweep._at_once(auto, 1, "gpu", bytes_limit=1) == 1  # memory for one run at a time


# --- Vectorized or not, and how many runs one program holds ----------------------------------

@pytest.mark.parametrize("setting, accelerator, cpu", [
    ("auto", True, False), ("true", True, True), ("false", False, False), ("True", True, True),
    (True, True, True), (False, False, False)])
def test_auto_vectorizes_on_an_accelerator_only_and_true_or_false_everywhere(
    setting, accelerator, cpu):
  """A bool (a Python sweep file's or override's) is the field's text: `override`."""
  c = tiny(**{"sweep.vectorize": setting})
  config_lib.validate(c)
  assert c.sweep.vectorize == (str(setting).lower() if isinstance(setting, bool) else setting)
  assert [vectorized.vectorizes(c, b) for b in ("gpu", "tpu", "cpu")] == [accelerator] * 2 + [cpu]


def test_a_config_json_from_before_auto_loads_and_means_what_it_meant(tmp_path):
  """config.json files hold `"vectorize": true` or `false`: they validate, the run resumes under
  today's default (a runtime field), and the bool means what it meant on any backend."""
  for old in (True, False):
    recorded = json.loads(tiny().to_json())
    recorded["sweep"]["vectorize"] = old
    c = ml_collections.ConfigDict(recorded)
    config_lib.validate(c)
    assert vectorized.vectorizes(c, "cpu") == vectorized.vectorizes(c, "gpu") == old
    (tmp_path / "config.json").write_text(json.dumps(recorded))
    train.finished(tiny(), workdir_lib.RunDir.open(tmp_path))


def test_the_flag_takes_auto_true_or_false_and_refuses_other_values(monkeypatch, tmp_path):
  for text in ("auto", "true", "false"):
    monkeypatch.setattr(sys, "argv", ["sweep", f"--config={CONFIG_FILE}",
                                      f"--config.sweep.vectorize={text}"])
    values = flags.FlagValues()
    errors.define_config_file("config", "", flag_values=values)
    errors.parse_flags(sys.argv, values)
    assert values.config.sweep.vectorize == text
  spec = tmp_path / "grid.py"
  spec.write_text("def get_sweep(arg=None):\n  return {'axes': {'optim.lr': [1e-3]}}\n")
  with pytest.raises(errors.UserError, match=r"^sweep cell lr=0.001,seed=0: "
                     r"sweep.vectorize='yes': choose 'auto', 'true' or 'false'$"):
    sweep.run(tiny(**{"sweep.vectorize": "yes"}), str(spec), tmp_path / "runs",
              log=lambda _: None)
  assert not (tmp_path / "runs").exists()


def test_a_program_holds_the_runs_that_fit_the_devices_memory():
  c = tiny()
  per_run = vectorized.run_bytes(c)
  # The least memory that holds k runs' estimate (+1: the fraction's float rounding).
  holding = lambda k: math.ceil(k * per_run / vectorized.MEMORY_FRACTION) + 1
  lines = []
  assert vectorized.program_size(c, 8, holding(3), lines.append) == 3
  assert lines == [f"sweep: 3 cells per program (device memory: {holding(3) / 2**30:.1f} GiB, "
                   f"about {per_run / 2**30:.1f} GiB a run)"]
  assert vectorized.program_size(c, 8, holding(3) - 2) == 2
  assert vectorized.program_size(c, 8, 1) == 1  # not even one run fits: one at a time
  assert vectorized.program_size(c, 3, holding(3), lines.append) == 3 and len(lines) == 1
  assert vectorized.program_size(c, 8, None) == 8  # the memory is not known (a CPU): no cap
  c.sweep.max_runs = 2
  assert vectorized.program_size(c, 8, holding(3)) == vectorized.program_size(c, 8, None) == 2


@pytest.mark.parametrize("vectorize", ["false", "true"])
def test_the_next_group_compiles_while_a_group_trains_and_counts_as_its_own(vectorize, tmp_path,
                                                                            monkeypatch):
  """With `sweep.compile_next` on (a GPU's default), the GELU group's step compiles while the ReLU
  group trains (one run, or two vectorized as on a GPU): the ReLU group waits at its step 20 until
  it has (at most 60 s); the GELU runs' `init` is compiling too. Each group's summaries count its
  own programs once (the GELU group's, compiled ahead, among them); one run each, the rows are
  those of the same sweep compiled group by group."""
  spec = tmp_path / "grid.py"
  lrs = [1e-3, 3e-3] if vectorize == "true" else [1e-3]
  spec.write_text("def get_sweep(arg=None):\n  return {'axes': {'model.activation': ['relu', "
                  f"'gelu'], 'optim.lr': {lrs}}}, 'seeds': [0]}}\n")
  cache, opened, init_started, take = {}, [], [], loop.Prefetch.take

  def next_step_compiled():
    programs = [p for (_, key), p in cache.items() if '"model.activation": "gelu"' in key]
    compiled = programs and programs[0].train_step.compiled
    return bool(compiled and compiled.done() and not compiled.exception())

  def waiting_take(self, k):
    if k == 20 and not opened:
      deadline = time.monotonic() + 60
      while not next_step_compiled() and time.monotonic() < deadline:
        time.sleep(0.02)
      opened.append(next_step_compiled())
      gelu = [p for (_, key), p in cache.items() if '"model.activation": "gelu"' in key]
      init_started.append(bool(gelu) and gelu[0].init.compiled is not None)
    return take(self, k)
  monkeypatch.setattr(loop.Prefetch, "take", waiting_take)
  settings = {"sweep.vectorize": vectorize, "train.steps": 24}
  ahead = sweep.run(tiny(**settings, **{"sweep.compile_next": "true"}), str(spec),
                    tmp_path / "ahead", log=lambda _: None, cache=cache)
  assert opened == [True]
  for summary in ahead.values():
    counted = summary["timing"]["compile"]
    assert counted["programs_compiled"] + counted["programs_cached"] == len(
        set(counted["compiled"]) | set(counted["cached"])), counted  # each program once
  gelu = ahead[next(name for name in ahead if "gelu" in name)]["timing"]["compile"]
  assert {"jit(init)", "jit(train_step)", "jit(log_step)", "jit(eval_step)"} <= set(
      gelu["compiled"] + gelu["cached"])
  assert init_started == [True]  # the GELU group's fresh runs' `init` too
  if vectorize == "true":
    return  # The rows: those of one run each, below.
  monkeypatch.setattr(loop.Prefetch, "take", take)
  sweep.run(tiny(**settings, **{"sweep.compile_next": "false"}), str(spec),
            tmp_path / "one_by_one", log=lambda _: None)
  for name in ahead:
    rows = lambda root: [{k: v for k, v in r.items() if k != "tokens_per_sec"}
                         for r in _rows(root / name)]
    assert rows(tmp_path / "ahead") == rows(tmp_path / "one_by_one"), name


def test_a_next_group_that_fails_to_compile_ahead_is_one_line_and_compiles_at_its_start(
    tmp_path, monkeypatch):
  spec = tmp_path / "grid.py"
  spec.write_text("def get_sweep(arg=None):\n  return {'axes': {'model.activation': ['relu', "
                  "'gelu']}, 'seeds': [0]}\n")

  def failing(self, pool, dataset, fresh):
    raise RuntimeError("no memory for autotuning")
  monkeypatch.setattr(program.Program, "compile_all", failing)
  lines = []
  results = sweep.run(tiny(**{"sweep.compile_next": "true", "train.steps": 24}), str(spec),
                      tmp_path / "runs", log=lines.append)
  assert [s["last_step"] for s in results.values()] == [24, 24]
  assert [l for l in lines if "ahead" in l] == [
      "sweep: compiling the next group ahead failed (no memory for autotuning); it compiles when "
      "it starts"]


def test_by_default_a_sweep_trains_cells_one_by_one_on_a_cpu_and_vectorized_on_a_gpu(
    tmp_path, monkeypatch):
  """On a GPU whose memory holds three runs, four cells train as programs of 3 and 1 (said)."""
  spec = tmp_path / "grid.py"
  spec.write_text("def get_sweep(arg=None):\n  return {'axes': {'optim.lr': [1e-3, 3e-3]}, "
                  "'seeds': [0, 1]}\n")
  programs = []

  def fake_run_group(configs, workdirs, cache=None, log=print, **hooks):
    programs.append([pathlib.Path(w).name for w in workdirs])
    return [{"status": "stable"}] * len(configs)

  monkeypatch.setattr(train, "run_group", fake_run_group)
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # a CPU, on a GPU host too
  lines = []
  sweep.run(tiny(), str(spec), tmp_path / "cpu", log=lines.append)
  assert programs == [["lr=0.001,seed=0"], ["lr=0.003,seed=0"], ["lr=0.001,seed=1"],
                      ["lr=0.003,seed=1"]]  # seed by seed
  assert not any("per program" in l or "vectorized" in l for l in lines), lines
  per_run = vectorized.run_bytes(tiny())
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  memory = math.ceil(3.5 * per_run / vectorized.MEMORY_FRACTION)
  monkeypatch.setattr(vectorized, "device_memory", lambda: memory)
  programs.clear()
  sweep.run(tiny(), str(spec), tmp_path / "gpu", log=lines.append)
  assert programs == [["lr=0.001,seed=0", "lr=0.001,seed=1", "lr=0.003,seed=0"],
                      ["lr=0.003,seed=1"]]  # the whole group, in the grid's order
  assert sum(l.startswith("sweep: 3 cells per program (device memory: ") for l in lines) == 1
  assert "sweep: 3 cells as one program (vectorized ×3)" in lines


def test_the_estimate_is_the_state_and_a_workspace_that_grows_with_the_batch():
  """The state's bytes exactly (the parameters and AdamW's two moments, float32), a gradient and
  an update as large as the parameters, and a workspace linear in the batch, 3× with sharpness
  estimates on (`run_bytes`' docstring)."""
  c = tiny()
  step = program.create_step(c, 257)
  params = sum(x.size for x in jax.tree.leaves(jax.eval_shape(step.init, 0, 1.0).params))
  one, two = (vectorized.run_bytes(tiny(**{"train.batch_size": b})) for b in (8, 16))
  fixed = one - (two - one)  # the estimate at batch 0
  assert 5 * 4 * params < fixed < 5 * 4 * params + 1024  # + the step, the RNG key, the peak LR
  sharpness = vectorized.run_bytes(tiny(**{"metrics.sharpness_every": 10}))
  assert sharpness - fixed == 3 * (one - fixed)


def test_the_estimate_counts_one_chunk_of_logits_under_the_fused_loss():
  """The fused loss holds one chunk of positions' logits (`kernels.chunk_length`), the plain one
  all [B, L, V]: the reference decoder's (GPT-2's vocabulary, B 32, L 128), 3 floats a logit."""
  c = config_lib.decoder("gelu")
  c.metrics.sharpness_every = 0
  plain = config_lib.decoder("gelu")
  plain.metrics.sharpness_every, plain.model.loss_impl = 0, "plain"
  B, L, V = c.train.batch_size, c.data.seq_len, core.pad_vocab(50257)
  chunk = kernels.chunk_length(B, L, V)
  assert chunk < L
  assert vectorized.run_bytes(plain) - vectorized.run_bytes(c) == 3 * B * (L - chunk) * V * 4


def test_sweep_prints_cell_k_of_n_and_skips_cells_done_before(tmp_path, monkeypatch):
  spec = tmp_path / "grid.py"
  spec.write_text("def get_sweep(arg=None):\n  return {'axes': {'optim.lr': [1e-3, 3e-3]}, "
                  "'seeds': [0, 1]}\n")
  root = tmp_path / "runs"
  before = root / "lr=0.003,seed=0"
  before.mkdir(parents=True)
  (before / "summary.json").write_text('{"status": "stable", "final_val_loss": 1.5}')

  def fake_run_group(configs, workdirs, cache=None, log=print, **hooks):
    out = [{"status": "stable", "final_val_loss": 1.0 + c.optim.lr, "wall_time_sec": 2.0}
           for c in configs]
    for w, summary in zip(workdirs, out):
      (pathlib.Path(w) / "summary.json").write_text(json.dumps(summary))
    return out

  monkeypatch.setattr(train, "run_group", fake_run_group)
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")  # cell by cell, on a GPU host too
  lines = []
  results = sweep.run(tiny(), str(spec), root, log=lines.append)
  assert len(results) == 4
  assert lines[0] == f"sweep: 4 cells (1 done before) in 1 compile group(s) → {root}"
  assert lines[1] == "lr=0.003,seed=0: done before (stable), skipped"
  assert [re.sub(r"; ETA \d+ s$", "", l) for l in lines[2:5]] == [
      "[2/4] lr=0.001,seed=0: stable, val loss 1.0010, 2 s",
      "[3/4] lr=0.001,seed=1: stable, val loss 1.0010, 2 s",
      "[4/4] lr=0.003,seed=1: stable, val loss 1.0030, 2 s"]
  assert "ETA" not in lines[2] + lines[4] and "ETA" in lines[3]  # not for the compiling first
  assert lines[5].startswith("sweep: HParams table in ") and len(lines) == 6
  assert sorted(p.name for p in (root / "tb_hparams").iterdir()) == sorted(results)

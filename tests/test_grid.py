"""The grid of a sweep file: names, overrides, refusals, the shipped sweep files, shards."""

import dataclasses
import json
import re

import jax
import pytest

from actlab import config as config_lib
from actlab import core, sweep
from actlab.core import activations
from actlab.infra import errors
from actlab.run import program
from actlab.sweep import grid
from conftest import REPO, tiny

EXPERIMENTS = REPO / "experiments"


def test_grid_names_overrides_and_groups():
  s = grid.parse({"axes": {"model.activation": ["relu", "gelu"], "optim.lr": [1e-3, 3e-3]},
                   "seeds": [0, 1], "fixed": {"train.steps": 20}})
  cells = grid.cells(tiny(), s)
  assert len(cells) == 2 * 2 * 2
  assert cells[0].name == "activation=relu,lr=0.001,seed=0"
  assert cells[-1].name == "activation=gelu,lr=0.003,seed=1"
  last = cells[-1].config
  assert (last.model.activation, last.optim.lr, last.train.seed, last.train.steps) == (
      "gelu", 3e-3, 1, 20)
  groups = sweep.group(cells)
  assert [len(g) for g in groups] == [4, 4]  # LR and seed do not split a compile group
  assert {c.config.model.activation for c in groups[0]} == {"relu"}


def test_ambiguous_short_names_use_the_full_key(monkeypatch):
  s = grid.parse({"axes": {"model.dropout": [0.0, 0.1], "optim.b1": [0.9]}, "seeds": [3]})
  assert grid.cells(tiny(), s)[1].name == "dropout=0.1,b1=0.9,seed=3"
  c = tiny()
  c.data.dropout = 0.0  # another section with the same field name (none has one today, and
  monkeypatch.setattr(config_lib, "validate", lambda config: None)  # validate refuses this one)
  s = grid.parse({"axes": {"model.dropout": [0.0], "data.dropout": [0.1]}})
  assert grid.cells(c, s)[0].name == "model.dropout=0,data.dropout=0.1,seed=0"


def test_command_line_flags_win_over_fixed_values_and_may_not_set_an_axis():
  s = grid.parse({"axes": {"optim.lr": [1e-3, 3e-3]}, "seeds": [0, 1],
                   "fixed": {"train.steps": 20, "train.log_every": 5, "model.dropout": 0.1}})
  base = tiny(**{"train.steps": 7, "train.log_every": 5})  # as --config.train.steps=7 ... set it
  flagged, lines = grid.with_flags(s, base, ["train.steps", "train.log_every", "data.seq_len"])
  assert flagged.fixed == {"train.steps": 7, "train.log_every": 5, "model.dropout": 0.1}
  assert lines == ["sweep: --config.train.steps=7 replaces the sweep's fixed train.steps=20"]
  assert {(c.config.train.steps, c.config.model.dropout) for c in grid.cells(base, flagged)} == {
      (7, 0.1)}
  assert grid.with_flags(s, base, []) == (s, [])
  for key, axis in [("optim.lr", "its axis 'optim.lr'"), ("train.seed", "its seeds")]:
    with pytest.raises(config_lib.ConfigError,
                       match=rf"^--config\.{key}: the sweep varies {key} \({axis}\); drop"):
      grid.with_flags(s, base, ["train.steps", key])


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
    grid.cells(tiny(), grid.parse(bad))


def test_pairs_and_equivalence_margin_are_checked_and_recorded(tmp_path):
  acts = {"model.activation": ["relu", "reglu", "gelu", "geglu"], "optim.lr": [1e-3]}
  s = grid.parse({"axes": acts, "pairs": [("reglu", "relu"), ["geglu", "gelu"]],
                  "equivalence_margin": 1 / 50})
  assert (s.pairs, s.equivalence_margin) == ([["reglu", "relu"], ["geglu", "gelu"]], 0.02)
  grid.write_manifest(tmp_path, "x.py", s, grid.cells(tiny(), s))
  manifest = json.loads((tmp_path / "sweep.json").read_text())
  assert manifest["pairs"] == [["reglu", "relu"], ["geglu", "gelu"]]
  assert manifest["equivalence_margin"] == 0.02
  assert (grid.parse({"axes": acts}).pairs, grid.parse({"axes": acts}).equivalence_margin) == (
      [], None)
  for margin in [0, -0.1, float("nan"), float("inf"), "0.02", True]:
    with pytest.raises(config_lib.ConfigError, match="equivalence_margin must be a number > 0"):
      grid.parse({"axes": acts, "equivalence_margin": margin})
  for pairs in [[("relu", "relu")], [("relu", "swish")], [("relu",)], ["relu"],
                [("relu", "gelu", "geglu")]]:
    with pytest.raises(config_lib.ConfigError, match="not two different values of the activat"):
      grid.parse({"axes": acts, "pairs": pairs})
  with pytest.raises(config_lib.ConfigError, match=r"\['gelu', 'relu'\] is given twice"):
    grid.parse({"axes": acts, "pairs": [("relu", "gelu"), ("gelu", "relu")]})


def test_reference_grid_and_smoke_variants_load():
  full = grid.load(f"{EXPERIMENTS}/relu_vs_gelu_lr.py")
  assert full.axes == {"model.activation": ["relu", "gelu"], "optim.lr": [1e-4, 1e-3, 3e-3]}
  assert len(full.seeds) == 3
  for name in ("relu_vs_gelu_lr", "activation_zoo", "glu_variants"):
    for arg in ("", ":smoke"):
      s = grid.load(f"{EXPERIMENTS}/{name}.py{arg}")
      cells = grid.cells(config_lib.base(), s)  # validates every cell
      if arg:
        assert all(c.config.data.source == "synthetic" for c in cells)
  with pytest.raises(config_lib.ConfigError, match="unknown variant 'nope'"):
    grid.load(f"{EXPERIMENTS}/relu_vs_gelu_lr.py:nope")
  zoo = grid.load(f"{EXPERIMENTS}/activation_zoo.py")
  assert zoo.axes["model.activation"] == list(activations.NAMES)
  assert grid.load(f"{EXPERIMENTS}/activation_zoo.py:cpu").pairs == [
      ["swiglu", "silu"], ["geglu", "gelu"], ["reglu", "relu"]]
  glu = grid.load(f"{EXPERIMENTS}/glu_variants.py")
  assert all(activations.get(g).gated and not activations.get(p).gated for g, p in glu.pairs)


def test_glu_variants_are_parameter_matched():
  s = grid.load(f"{EXPERIMENTS}/glu_variants.py:smoke")
  names = s.axes["model.activation"]
  counts = {}
  for cell in grid.cells(config_lib.base(), s)[::len(s.seeds)]:
    task = program.create_step(cell.config, 257)
    counts[cell.config.model.activation] = core.count_params(
        jax.eval_shape(task.init, 0).params)["non_embedding"]
  for plain, gated in zip(names[::2], names[1::2]):
    assert not activations.get(plain).gated and activations.get(gated).gated
    assert abs(counts[gated] / counts[plain] - 1) < 0.03, (plain, gated, counts)


def test_parse_shard():
  assert grid.parse_shard("0/1") == (0, 1) and grid.parse_shard("2/3") == (2, 3)
  for bad in ("3/2", "2/2", "-1/2", "1/0", "x", "1", "1/2/3", "", "/"):
    with pytest.raises(errors.UserError, match=f"^--shard={re.escape(bad)}: give i/N"):
      grid.parse_shard(bad)


def test_fixed_by_sets_fields_for_the_cells_of_one_axis_value():
  """Each activation at its own LR (a primary test whose arms chose different LRs)."""
  s = grid.parse({"axes": {"model.activation": ["relu", "gelu"]}, "seeds": [0, 1],
                  "fixed": {"optim.lr": 1e-3, "train.steps": 20},
                  "fixed_by": {"model.activation": {"gelu": {"optim.lr": 3e-3}}}})
  cells = grid.cells(tiny(), s)
  assert sorted((c.name, c.config.optim.lr, c.config.train.steps) for c in cells) == [
      ("activation=gelu,seed=0", 3e-3, 20), ("activation=gelu,seed=1", 3e-3, 20),
      ("activation=relu,seed=0", 1e-3, 20), ("activation=relu,seed=1", 1e-3, 20)]
  assert [len(g) for g in sweep.group(cells)] == [2, 2]  # the LR splits no compile group
  with pytest.raises(config_lib.ConfigError, match="per value of an axis"):
    grid.with_flags(s, tiny(), ["optim.lr"])
  for bad in ({"optim.lr": {"gelu": {"optim.b1": 0.8}}}, {"model.activation": {"tanh": {}}},
              {"model.activation": {"gelu": {"train.seed": 3}}}, {"model.activation": [1]}):
    with pytest.raises(config_lib.ConfigError, match="fixed_by"):
      grid.parse({"axes": {"model.activation": ["relu", "gelu"]}, "fixed_by": bad})


def test_exclude_leaves_out_the_cells_with_every_value_of_an_entry():
  """Three clipping settings from two fields that one config refuses together."""
  s = grid.parse({"axes": {"model.activation": ["relu"], "optim.clip_norm": [0.0, 1.0],
                           "optim.spike_clip": [0.0, 10.0]}, "seeds": [0],
                  "exclude": [{"optim.clip_norm": 1.0, "optim.spike_clip": 10.0}]})
  assert [c.name for c in grid.cells(tiny(), s)] == [
      "activation=relu,clip_norm=0,spike_clip=0,seed=0",
      "activation=relu,clip_norm=0,spike_clip=10,seed=0",
      "activation=relu,clip_norm=1,spike_clip=0,seed=0"]
  with pytest.raises(config_lib.ConfigError, match="one clipping at a time"):
    grid.cells(tiny(), dataclasses.replace(s, exclude=[]))
  for bad in ([{"optim.clip_norm": 2.0}], [{"optim.b1": 0.9}], [{}], ["optim.clip_norm"]):
    with pytest.raises(config_lib.ConfigError, match="exclude"):
      grid.parse({"axes": {"optim.clip_norm": [0.0, 1.0]}, "exclude": bad})


# --- A sweep directory holds one sweep -------------------------------------------------------

SMOKE = f"{EXPERIMENTS}/relu_vs_gelu_lr.py:smoke"


def _refusal(workdir, base, spec=SMOKE, overridden=()) -> str:
  with pytest.raises(errors.UserError) as e:
    sweep.plan(base, spec, workdir, overridden=overridden, log=lambda _: None)
  assert "\n" not in str(e.value)
  assert str(e.value).startswith(f"--workdir {workdir} holds another sweep (")
  assert str(e.value).endswith("; rerun the command that started it (its --sweep, --config and "
                               "flags) to resume it, or give this sweep a new --workdir")
  return str(e.value)


def test_another_sweep_file_is_refused_in_a_sweep_directory(tmp_path):
  """relu_vs_gelu_lr's 18 cells stay in sweep.json when activation_zoo is started there."""
  sweep.plan(config_lib.base(), SMOKE, tmp_path, log=lambda _: None)
  written = (tmp_path / "sweep.json").read_text()
  message = _refusal(tmp_path, config_lib.base(), f"{EXPERIMENTS}/activation_zoo.py:smoke")
  assert f"sweep: {SMOKE} → {EXPERIMENTS}/activation_zoo.py:smoke; " in message
  assert "axes.model.activation: ['relu', 'gelu'] → ['relu', 'relu2', 'tanh'" in message
  assert message.count("; ") == 4 and "; and 3 more)" in message  # seeds, optim.lr, description
  assert (tmp_path / "sweep.json").read_text() == written


@pytest.mark.parametrize("key, value, shown", [
    ("train.steps", 60, "train.steps: 150 → 60"),  # a fixed value of the sweep, replaced
    ("optim.b2", 0.99, "optim.b2: 0.95 → 0.99"),  # a field of the base config it does not fix
])
def test_a_flag_that_changes_the_cells_configs_is_refused(tmp_path, key, value, shown):
  sweep.plan(config_lib.base(), SMOKE, tmp_path, log=lambda _: None)
  written = (tmp_path / "sweep.json").read_text()
  message = _refusal(tmp_path, config_lib.override(config_lib.base(), {key: value}),
                     overridden=[key])
  assert f"({shown}); " in message  # named once (not again for each cell)
  assert (tmp_path / "sweep.json").read_text() == written


def test_the_same_sweep_resumes_in_its_directory_whatever_its_runtime_fields(tmp_path):
  """The same command, as a shard, a `--workers` parent or child, or with a field that does not
  change results (the children's --config.train.progress=false), plans the same sweep."""
  sweep.plan(config_lib.base(), SMOKE, tmp_path, log=lambda _: None)
  written = json.loads((tmp_path / "sweep.json").read_text())
  assert written["config"]["train"]["steps"] == 150 and "progress" not in written["config"]["train"]
  assert written["cell_configs"]["activation=relu,lr=0.03,seed=2"] == {
      "model.activation": "relu", "optim.lr": 0.03, "train.seed": 2}
  for shard, manifest in [((0, 1), True), ((1, 3), True), ((0, 2), False)]:
    assert len(sweep.plan(config_lib.base(), SMOKE, tmp_path, shard, manifest,
                          log=lambda _: None)) == 18 // shard[1]
  runtime = config_lib.override(config_lib.base(), {"train.progress": True,
                                                    "sweep.vectorize": "false"})
  sweep.plan(runtime, SMOKE, tmp_path, overridden=["train.progress", "sweep.vectorize"],
             log=lambda _: None)
  assert json.loads((tmp_path / "sweep.json").read_text())["fixed"]["train.progress"] is True


def test_a_sweep_json_from_before_the_configs_compares_the_grid(tmp_path):
  """A sweep.json without `config` and `cell_configs` (results/ holds such) resumes, and refuses
  another fixed value."""
  sweep.plan(config_lib.base(), SMOKE, tmp_path, log=lambda _: None)
  old = json.loads((tmp_path / "sweep.json").read_text())
  for key in ("config", "cell_configs", "exclude", "fixed_by"):
    del old[key]
  (tmp_path / "sweep.json").write_text(json.dumps(old))
  assert "train.steps: 150 → 60" in _refusal(
      tmp_path, config_lib.override(config_lib.base(), {"train.steps": 60}),
      overridden=["train.steps"])
  sweep.plan(config_lib.base(), SMOKE, tmp_path, log=lambda _: None)  # resumes, recording them
  assert "config" in json.loads((tmp_path / "sweep.json").read_text())


def test_a_fixed_field_the_config_gained_since_resumes_at_the_value_runs_had_without_it(tmp_path):
  """A sweep.json written before `train.deterministic_ops` existed (the ladder's) resumes when
  the sweep now fixes it at the value its runs had (off), and refuses another value."""
  sweep.plan(config_lib.base(), SMOKE, tmp_path, log=lambda _: None)
  old = json.loads((tmp_path / "sweep.json").read_text())
  assert "train.deterministic_ops" not in old["fixed"]
  for value, diffs in [(False, []), (True, ["train.deterministic_ops: <absent> → True"])]:
    new = {**old, "fixed": {**old["fixed"], "train.deterministic_ops": value}}
    assert grid.manifest_diffs(old, new) == diffs

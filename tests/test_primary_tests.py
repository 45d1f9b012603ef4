"""experiments/primary_tests.py, the project's pre-registered tests (actlab/report/preregistered.py;
tests/test_preregistered.py): each arm's LR chosen on the pilot's validation windows (in the
recipe family, one step past an edge first), the seeds it asks for, its fresh seeds' sweep, its
results and the platform's noise, as the experiment states them."""

import importlib.util
import json

import numpy as np
import pytest

from actlab.report import factorial, preregistered
from actlab.sweep import grid
from conftest import REPO, tiny, tiny_encoder
from test_preregistered import write_run

spec = importlib.util.spec_from_file_location("primary_tests",
                                              REPO / "experiments" / "primary_tests.py")
primary = importlib.util.module_from_spec(spec)
spec.loader.exec_module(primary)


def needed(sd, name="relu_gelu"):
  """The seeds test `name`'s power rule asks for at a pilot sd of `sd`."""
  t = primary.TESTS[name]
  return preregistered.seeds_needed(sd, t.rule.delta, t.alpha, t.rule.power, t.rule.min_seeds)


def test_the_pilot_chooses_each_arms_lr_on_validation_and_takes_the_sd_on_test(tmp_path,
                                                                              monkeypatch):
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  study = tmp_path / "relu_vs_gelu_cpu_epoch"
  rng = np.random.default_rng(0)
  test_relu, test_gelu = rng.normal(4.0, 0.1, 3), rng.normal(4.1, 0.1, 3)
  for seed in range(3):
    # ReLU's validation loss is lowest at 1e-3 and GELU's at 3e-3; on the test windows the
    # other LR would win, which must not matter.
    write_run(study, "relu", 1e-3, seed, 3.0, test_relu[seed])
    write_run(study, "relu", 3e-3, seed, 3.5, 1.0)
    write_run(study, "gelu", 1e-3, seed, 3.5, 1.0)
    write_run(study, "gelu", 3e-3, seed, 3.0, test_gelu[seed])
  plan = primary.pilot("relu_gelu")
  assert plan["lr"] == {"relu": 1e-3, "gelu": 3e-3} and plan["seeds"] == [0, 1, 2]
  assert plan["sd"] == pytest.approx(np.std(test_relu - test_gelu, ddof=1), rel=1e-12)
  assert plan["n"] == needed(plan["sd"])
  assert primary.pilot("swiglu_silu") is None  # its pilot is not there
  cells = grid.cells(tiny(), grid.parse(primary.get_sweep("relu_gelu")))
  assert {(c.config.model.activation, c.config.optim.lr) for c in cells} == {
      ("relu", 1e-3), ("gelu", 3e-3)}  # each arm at its own LR
  assert sorted({c.config.train.seed for c in cells}) == list(range(100, 100 + plan["n"]))


def test_the_encoders_tests_run_at_most_their_cap_and_read_the_mask_loss(tmp_path, monkeypatch):
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  study = tmp_path / "bert_past_plateau_pilot"
  for seed, (relu, gelu) in enumerate([(3.61, 3.21), (3.09, 3.39)]):  # sd 0.49: n ≈ 290
    for lr, worse in ((1e-3, 0.5), (3e-3, 0.0)):
      write_run(study, "relu", lr, seed, relu + worse, relu + worse, outcome="mask_loss")
      write_run(study, "gelu", lr, seed, gelu + worse, gelu + worse, outcome="mask_loss")
  plan = primary.pilot("bert_relu_gelu")
  assert plan["lr"] == {"relu": 3e-3, "gelu": 3e-3}
  assert plan["needed"] > 200 and plan["n"] == primary.MAX_SEEDS["encoder"] == 10
  assert plan["power"] < 0.1 and plan["detectable"] == preregistered.detectable(
      10, plan["sd"], 0.05 / 7, primary.RULE.power) > 0.5
  cells = grid.cells(tiny_encoder(), grid.parse(primary.get_sweep("bert_relu_gelu")))
  assert sorted({c.config.train.seed for c in cells}) == list(range(100, 110))


def test_an_incomplete_pilot_is_refused_not_read(tmp_path, monkeypatch):
  """A pilot archived before all its runs finished would choose LRs and n on part of it."""
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  study = tmp_path / "relu_vs_gelu_cpu_epoch"
  for act, lr, seed in [("relu", 1e-3, 0), ("relu", 1e-3, 1), ("relu", 3e-3, 0),
                        ("gelu", 1e-3, 0), ("gelu", 1e-3, 1)]:
    write_run(study, act, lr, seed, 3.0, 3.0 + seed / 10 + (act == "relu") * seed / 7)
  incomplete = r"relu_gelu: its pilot is incomplete.*\('relu', 0.003\): \[0\]"
  with pytest.raises(ValueError, match=incomplete):
    primary.pilot("relu_gelu")
  write_run(study, "relu", 3e-3, 1, 3.0, 3.1)
  assert primary.pilot("relu_gelu")["seeds"] == [0, 1]


def test_a_tests_result_pairs_its_fresh_seeds_and_takes_the_platform_sd_from_the_reruns(
    tmp_path, monkeypatch):
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  study, reruns = tmp_path / "primary_relu_gelu", tmp_path / "primary_relu_gelu_two_cores"
  relu, gelu = [3.9, 3.7, 3.8], [4.0, 4.1, 3.7]
  for seed, (r, g) in enumerate(zip(relu, gelu), start=100):
    write_run(study, "relu", 3e-3, seed, 0.0, r)
    write_run(study, "gelu", 3e-3, seed, 0.0, g)
  write_run(study, "relu", 3e-3, 103, 0.0, 9.0)  # no GELU partner: not paired
  assert primary.result("swiglu_silu") is None
  r = primary.result("relu_gelu")
  assert r["seeds"] == [100, 101, 102]
  assert r["diffs"] == pytest.approx({100: -0.1, 101: -0.4, 102: 0.1})
  assert r["means"] == pytest.approx((3.8, 3.9333333333333))
  assert r["paired"].mean == pytest.approx(-0.4 / 3)
  assert r["platform_sd"] is None and r["platform_n"] == 0
  assert primary.pending(r, 4) == " (interim: 3 of 4 seed pairs, 0 of 6 platform reruns)"
  for act, values, seed, shift in (("relu", relu, 100, 0.01), ("gelu", gelu, 100, -0.02),
                                   ("relu", relu, 101, 0.0)):  # rerun - run
    write_run(reruns, act, 3e-3, seed, 0.0, values[seed - 100] + shift)
  r = primary.result("relu_gelu")
  assert r["platform_n"] == 3
  assert r["platform_sd"] == pytest.approx(np.std([0.01, -0.02, 0.0], ddof=1))
  assert primary.pending(r, 3) == " (interim: 3 of 6 platform reruns)"
  for act, seed in (("gelu", 101), ("relu", 102), ("gelu", 102)):
    write_run(reruns, act, 3e-3, seed, 0.0, 4.0)
  assert primary.pending(primary.result("relu_gelu"), 3) == ""


def test_each_encoder_run_is_read_once_with_its_exit_and_final_test_loss(tmp_path, monkeypatch):
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  curves = {("gelu", 100): {0: 5.8, 1000: 4.4, 1250: 3.6}, ("tanh", 100): {0: 5.8, 1000: 4.4},
            ("relu", 100): {0: 5.8, 1250: 4.5, 1500: 4.0, 1750: 3.0}}
  final = {"gelu": 2.5, "tanh": 2.6, "relu": 3.4}
  for test, act in (("bert_tanh_gelu", "tanh"), ("bert_relu_gelu", "relu")):
    for arm in (act, "gelu"):  # GELU's run archived in both tests
      write_run(tmp_path / f"primary_{test}", arm, 3e-3, 100, 0.0, final[arm], "mask_loss",
                {"val_mask_loss": curves[arm, 100]})
  assert primary.plateau_exits() == {("gelu", 100): (1125.0, 2.5, None),  # no step 750
                                     ("tanh", 100): (None, 2.6, None),
                                     ("relu", 100): (1500.0, 3.4, 1.5)}  # 4.5 - 3.0


def test_stability_ranges_each_arms_measures_over_its_fresh_seeds(tmp_path, monkeypatch):
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  study = tmp_path / "primary_relu_gelu"
  measures = {"relu": [(1.2, 1.6, 20.0, 0.03, "stable"), (3.3, 1.5, 25.0, 0.05, "stable")],
              "gelu": [(56.0, 0.9, 40.0, 0.0, "unstable"), (2.0, 1.7, 18.0, 0.0, "stable"),
                       (12.0, 1.1, 30.0, 0.001, "unstable")]}
  for act, runs in measures.items():
    for seed, (grad, entropy, logit, dead, status) in enumerate(runs, start=100):
      write_run(study, act, 3e-3, seed, 4.0, 4.0 + grad / 100)  # A - B: -0.548, +0.013
      summary = study / f"activation={act},lr=0.003,seed={seed}" / "summary.json"
      summary.write_text(json.dumps({**json.loads(summary.read_text()), "status": status,
                                     "grad_norm_max_rel": grad, "attn_entropy_min": entropy,
                                     "attn_logit_max": logit, "dead_units": dead}))
  stability = lambda name: preregistered.stability(primary.TESTS[name], primary.RESULTS,
                                                   primary.STABILITY)
  by_stability = lambda name: preregistered.by_stability(primary.TESTS[name], primary.RESULTS)
  s = stability("relu_gelu")
  assert s["relu"] == {"stable": {"runs": 2, "grad_norm_max_rel": (1.2, 3.3),
                                  "attn_entropy_min": (1.5, 1.6), "attn_logit_max": (20.0, 25.0),
                                  "dead_units": (0.03, 0.05)}}
  assert {status: g["runs"] for status, g in s["gelu"].items()} == {"stable": 1, "unstable": 2}
  assert s["gelu"]["unstable"]["grad_norm_max_rel"] == (12.0, 56.0)
  assert s["gelu"]["stable"]["attn_entropy_min"] == (1.7, 1.7)
  assert stability("swiglu_silu") == {"swiglu": {}, "silu": {}}  # none finished
  # Seed 100: GELU unstable; seed 101: both stable; seed 102: no ReLU run, no pair.
  assert by_stability("relu_gelu") == {"stable": (1, pytest.approx(0.013), None),
                                               "unstable": (1, pytest.approx(-0.548), None)}
  assert by_stability("swiglu_silu") == {}
  assert primary.spiking("relu_gelu") == {100}  # GELU past 10x its initial norm; 102 unpaired


def test_the_platform_shift_of_a_minus_b_is_taken_over_seeds_with_both_arms_rerun(tmp_path,
                                                                              monkeypatch):
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  study, reruns = tmp_path / "primary_relu_gelu", tmp_path / "primary_relu_gelu_two_cores"
  for seed, (r, g) in enumerate([(3.9, 4.0), (3.7, 4.1), (3.8, 3.7)], start=100):
    write_run(study, "relu", 3e-3, seed, 0.0, r)
    write_run(study, "gelu", 3e-3, seed, 0.0, g)
  for act, seed, test in (("relu", 100, 3.95), ("gelu", 100, 4.0), ("relu", 101, 3.7),
                          ("gelu", 101, 4.2), ("relu", 102, 3.9)):  # seed 102: one arm only
    write_run(reruns, act, 3e-3, seed, 0.0, test)
  r = primary.result("relu_gelu")
  assert r["platform_shift_n"] == 2  # shifts +0.05 and -0.1
  assert r["platform_shift_sd"] == pytest.approx(np.std([0.05, -0.1], ddof=1))


def test_a_recipe_pilot_at_the_grids_edge_is_extended_one_step_before_choosing(tmp_path,
                                                                             monkeypatch):
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  pilot_dir = tmp_path / "primary_recipe_clip_pilot"
  val = {"relu": {1e-3: 4.2, 3e-3: 4.0, 1e-2: 4.1},  # ReLU's best inside the grid
         "gelu": {1e-3: 4.0, 3e-3: 4.1, 1e-2: 4.3}}  # GELU's at its lower edge
  for act, by_lr in val.items():
    for lr, v in by_lr.items():
      for seed in primary.RECIPE_PILOT_SEEDS:
        write_run(pilot_dir, act, lr, seed, v, v + 0.01 * seed * (act == "relu"))
  with pytest.raises(ValueError, match="run :recipe_clip_edge first"):
    primary.get_sweep("recipe_clip")
  assert primary.pilot("recipe_clip") == {"edge": {"gelu": 3e-4}, "seeds": [0, 1, 2]}
  edge = grid.cells(tiny(), grid.parse(primary.get_sweep("recipe_clip_edge")))
  assert {(c.config.model.activation, c.config.optim.lr, c.config.optim.clip_norm)
          for c in edge} == {("gelu", 3e-4, 1.0)}
  assert sorted(c.config.train.seed for c in edge) == [0, 1, 2]
  for seed in primary.RECIPE_PILOT_SEEDS:  # the step past the edge is worse: GELU keeps 1e-3
    write_run(tmp_path / "primary_recipe_clip_edge", "gelu", 3e-4, seed, 4.05, 4.05)
  plan = primary.pilot("recipe_clip")
  assert plan["lr"] == {"relu": 3e-3, "gelu": 1e-3}
  assert primary.TESTS["recipe_clip"].alpha == 0.05 / 6
  assert plan["n"] == needed(plan["sd"], "recipe_clip")
  with pytest.raises(ValueError, match="no arm's best LR is at the grid's edge"):
    primary.get_sweep("recipe_clip_edge")
  cells = grid.cells(tiny(), grid.parse(primary.get_sweep("recipe_clip")))
  assert {(c.config.model.activation, c.config.optim.lr) for c in cells} == {
      ("relu", 3e-3), ("gelu", 1e-3)}
  assert sorted({c.config.train.seed for c in cells}) == list(range(200, 200 + plan["n"]))


def test_the_plan_names_the_committed_pilot_studies_and_an_edge_not_needed(tmp_path, monkeypatch,
                                                                         capsys):
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  for act, v in (("relu", 4.0), ("gelu", 4.1)):
    for lr, dv in zip(primary.PILOT_LRS, (0.2, 0.0, 0.3)):  # both best inside the grid
      for seed in primary.RECIPE_PILOT_SEEDS:
        val = v + dv + 0.01 * seed * (act == "relu")
        write_run(tmp_path / "primary_recipe_clip_pilot", act, lr, seed, val, val)
  primary.print_plan("recipe_clip")
  out = capsys.readouterr().out
  assert ("pilot results/primary_recipe_clip_pilot (no step past the grid's edge needed), seeds "
          "[0, 1, 2]: LR 0.003 (relu), 0.003 (gelu)") in out
  assert "primary_recipe_clip_edge" not in out


def test_a_recipe_pilot_missing_an_lr_is_incomplete(tmp_path, monkeypatch):
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  for act in ("relu", "gelu"):
    for lr in primary.PILOT_LRS[:2]:  # 1e-2 not finished
      for seed in primary.RECIPE_PILOT_SEEDS:
        write_run(tmp_path / "primary_recipe_wide_pilot", act, lr, seed, 4.0, 4.0)
  with pytest.raises(ValueError, match="recipe_wide: its pilot is incomplete"):
    primary.pilot("recipe_wide")
  assert primary.TESTS["recipe_wide"].cap == 20 and primary.TESTS["recipe_clip"].cap == 40


def test_the_modern_blocks_tests_share_one_pilot_and_one_step_past_its_edge(tmp_path,
                                                                          monkeypatch):
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  val = {"relu": {1e-3: 4.1, 3e-3: 4.0, 1e-2: 4.2},    # inside the grid
         "relu2": {1e-3: 4.3, 3e-3: 4.2, 1e-2: 4.1},   # at its upper edge
         "gelu": {1e-3: 4.0, 3e-3: 4.1, 1e-2: 4.3}}    # at its lower edge
  for act, by_lr in val.items():
    for lr, v in by_lr.items():
      for seed in primary.RECIPE_PILOT_SEEDS:
        write_run(tmp_path / "primary_modern_pilot", act, lr, seed, v, v + 0.01 * seed)
  assert primary.pilot("modern_relu_gelu")["edge"] == {"gelu": 3e-4}
  assert primary.pilot("modern_relu2_gelu")["edge"] == {"relu2": 3e-2, "gelu": 3e-4}
  with pytest.raises(ValueError, match="run :modern_edge first"):
    primary.get_sweep("modern_relu_gelu")
  edge = grid.cells(tiny(), grid.parse(primary.get_sweep("modern_edge")))
  assert sorted((c.config.model.activation, c.config.optim.lr, c.config.train.seed)
                for c in edge) == sorted((act, lr, s) for act, lr in (("gelu", 3e-4),
                                                                       ("relu2", 3e-2))
                                         for s in (0, 1, 2))  # GELU once for both tests
  assert {c.config.model.position for c in edge} == {"rope"}
  for act, lr, v in (("gelu", 3e-4, 4.05), ("relu2", 3e-2, 4.0)):
    for seed in primary.RECIPE_PILOT_SEEDS:
      write_run(tmp_path / "primary_modern_edge", act, lr, seed, v, v)
  assert primary.pilot("modern_relu2_gelu")["lr"] == {"relu2": 3e-2, "gelu": 1e-3}
  cells = grid.cells(tiny(), grid.parse(primary.get_sweep("modern_relu_gelu")))
  c = cells[0].config.model
  assert (c.norm_type, c.position, c.bias, c.tie_head, c.ffn) == ("rms", "rope", False, False,
                                                                   "plain")


def test_a_gated_test_is_re_tested_on_new_seeds_only_where_the_step_below_moves_its_choice(
    tmp_path, monkeypatch, capsys):
  """Family 1's gated tests chose the grid's lowest LR: the step below runs on the pilot's seeds
  for every arm at that edge, and only a test whose choice then moves gets fresh seeds (600 on)."""
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  val = {"swiglu": {1e-3: 4.0, 3e-3: 4.1, 1e-2: 4.3}, "silu": {1e-3: 4.1, 3e-3: 4.2, 1e-2: 4.4},
         "geglu": {1e-3: 4.0, 3e-3: 4.1, 1e-2: 4.3}, "reglu": {1e-3: 4.0, 3e-3: 4.1, 1e-2: 4.3}}
  plain = {"relu": {1e-3: 4.2, 3e-3: 4.0, 1e-2: 4.1}, "gelu": {1e-3: 4.2, 3e-3: 4.0, 1e-2: 4.1}}
  for study, arms in (("primary_gated_pilot", val), ("relu_vs_gelu_cpu_epoch", plain)):
    for act, by_lr in arms.items():
      for lr, v in by_lr.items():
        for seed in (0, 1, 2):
          write_run(tmp_path / study, act, lr, seed, v, v + 0.01 * seed * (act in plain))
  assert primary.pilot("geglu_gelu")["lr"] == {"geglu": 1e-3, "gelu": 3e-3}  # the old test's
  assert primary.pilot("geglu_gelu_retest")["edge"] == {"geglu": 3e-4}
  with pytest.raises(ValueError, match="run :gated_edge first"):
    primary.get_sweep("geglu_gelu_retest")
  edge = grid.cells(tiny(), grid.parse(primary.get_sweep("gated_edge")))
  assert sorted((c.config.model.activation, c.config.optim.lr, c.config.train.seed)
                for c in edge) == [(act, 3e-4, s) for act in ("geglu", "reglu", "silu", "swiglu")
                                   for s in (0, 1, 2)]
  below = {"swiglu": 4.05, "silu": 4.15, "geglu": 3.9, "reglu": 4.05}  # only GEGLU moves
  for act, v in below.items():
    for seed in (0, 1, 2):
      write_run(tmp_path / "primary_gated_edge", act, 3e-4, seed, v, v - 0.02 * seed)
  assert primary.pilot("geglu_gelu_retest")["lr"] == {"geglu": 3e-4, "gelu": 3e-3}
  assert primary.moved("geglu_gelu_retest") and not primary.moved("swiglu_silu_retest")
  cells = grid.cells(tiny(), grid.parse(primary.get_sweep("geglu_gelu_retest")))
  n = primary.pilot("geglu_gelu_retest")["n"]
  assert n == needed(primary.pilot("geglu_gelu_retest")["sd"], "geglu_gelu_retest")
  assert primary.TESTS["geglu_gelu_retest"].alpha == 0.05 / 3
  assert {(c.config.model.activation, c.config.optim.lr) for c in cells} == {
      ("geglu", 3e-4), ("gelu", 3e-3)}
  assert sorted({c.config.train.seed for c in cells}) == list(range(600, 600 + n))
  for name in ("swiglu_silu_retest", "reglu_relu_retest"):
    with pytest.raises(ValueError, match="verdict stands, nothing to re-test"):
      primary.get_sweep(name)
  primary.report()
  out = capsys.readouterr().out
  assert "- swiglu_silu_retest: the choice of LR stands: not re-tested" in out
  assert "- geglu_gelu_retest: no fresh-seed pair finished" in out


def test_the_factorials_pilot_is_its_12_cells_on_five_seeds_no_test_reads(tmp_path, monkeypatch):
  """ReLU, GELU × no clipping, clipping at 1.0, spike-only clipping at 10× × GPT-2's block, the
  LLaMA-style one with a plain FFN, at LR 3e-3 and test 1's recipe; each sweep cell is one cell
  of the family; the fresh seeds wait for the committed pilot."""
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  fam = primary.FACTORIAL
  assert (fam.k, fam.alpha, fam.rule.min_seeds, fam.cap, fam.margins) == (5, 0.01, 20, 40,
                                                                          (0.1, 0.05))
  cells = grid.cells(tiny(), grid.parse(primary.get_sweep("factorial_pilot")))
  assert len(cells) == 60 and {c.config.train.seed for c in cells} == {300, 301, 302, 303, 304}
  by_cell = {}
  for c in cells:
    by_cell.setdefault(factorial.cell_of(fam, c.config.to_dict()), []).append(c.config)
  assert sorted(by_cell) == sorted(fam.cells) and {len(v) for v in by_cell.values()} == {5}
  for cell, configs in by_cell.items():
    act, clip, block = cell.split("/")
    m, o = configs[0].model, configs[0].optim
    assert (m.activation, o.lr, o.warmup_steps, m.d_model, configs[0].train.steps) == (
        act, 3e-3, 45, 128, 450)
    assert (o.clip_norm, o.spike_clip) == {"none": (0.0, 0.0), "clip": (1.0, 0.0),
                                           "spike": (0.0, 10.0)}[clip]
    assert (m.norm_type, m.position, m.bias, m.tie_head, m.ffn) == (
        ("rms", "rope", False, False, "plain") if block == "llama" else
        ("layer", "learned", True, True, "auto"))
  assert set(fam.pilot_seeds).isdisjoint(fam.fresh_seeds(fam.cap))
  with pytest.raises(ValueError, match="factorial: its pilot .* is not committed yet"):
    primary.get_sweep("factorial")


def test_the_factorials_n_is_the_most_any_contrast_asks_at_its_sds_bound(tmp_path, monkeypatch,
                                                                          capsys):
  """A pilot whose spike-only cells vary most: spike_change and spike_vs_clip ask for the most
  seeds; every cell's fresh runs are the same n seeds from 400; `plan` and `report` print it."""
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  fam, rng = primary.FACTORIAL, np.random.default_rng(2)
  noise = {"none": 0.02, "clip": 0.02, "spike": 0.06}
  for seed in fam.pilot_seeds:
    for cell in fam.cells:
      act, clip, _ = cell.split("/")
      write_factorial_run(tmp_path / fam.pilot_study, cell, seed,
                          4.0 + 0.1 * (act == "gelu") + noise[clip] * rng.standard_normal())
  plan = primary.factorial_plan()
  needs = {name: c["needed"] for name, c in plan["contrasts"].items()}
  assert plan["n"] == min(max(needs.values()), 40) and max(needs, key=needs.get) in (
      "spike_change", "spike_vs_clip")
  sd = plan["contrasts"]["relu_gelu"]["sd"]
  assert plan["contrasts"]["relu_gelu"]["sd_upper"] == pytest.approx(
      sd * np.sqrt(4 / 1.6487766), rel=1e-6)
  cells = grid.cells(tiny(), grid.parse(primary.get_sweep("factorial")))
  assert len(cells) == 12 * plan["n"]
  assert sorted({c.config.train.seed for c in cells}) == list(range(400, 400 + plan["n"]))
  for seed in (400, 401, 402):
    for cell in fam.cells:
      write_factorial_run(tmp_path / fam.study, cell, seed, 4.0 + 0.01 * seed + 0.1 * (
          cell.startswith("gelu/none/gpt2")), grad_rel=30.0 if cell == "gelu/none/gpt2" else 2.0)
  primary.main("report")
  out = capsys.readouterr().out
  assert "family 'factorial': 3 of" in out and "sign-flip p 0.25" in out  # 2 of 8 patterns
  assert "spiking seeds 3 of 3" in out


def write_factorial_run(root, cell, seed, test, grad_rel=2.0):
  """A finished run of family 3's `cell` (its config as the sweep writes it, nested)."""
  fields = {**primary.FACTORIAL.cells[cell], "train.seed": seed}
  config = {}
  for key, value in fields.items():
    section, name = key.split(".")
    config.setdefault(section, {})[name] = value
  run = root / f"{cell.replace('/', ',')},seed={seed}"
  run.mkdir(parents=True)
  (run / "config.json").write_text(json.dumps(config))
  (run / "summary.json").write_text(json.dumps({"status": "stable", "final_test_loss": test,
                                                "grad_norm_max_rel": grad_rel}))


def test_the_factorials_figure_shows_each_cells_gap_and_each_contrast_with_its_sign(
    tmp_path, monkeypatch):
  """GELU 0.1 nats above ReLU unclipped in GPT-2's block alone: that cell's ReLU − GELU is −0.1,
  the others' 0; clipping, spike-only clipping and the LLaMA-style block each change it by +0.1,
  spike-only against full clipping by 0. The figure is drawn from those rows."""
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  fam, rng = primary.FACTORIAL, np.random.default_rng(0)
  for seed in (400, 401, 402, 403):
    for cell in fam.cells:
      write_factorial_run(tmp_path / fam.study, cell, seed, 4.0 + 0.01 * seed + 0.1 * (
          cell == "gelu/none/gpt2") + 1e-3 * rng.standard_normal())
  cells, contrasts = primary.factorial_rows(factorial.verdicts(fam, primary.RESULTS))
  expected = {"GPT-2's block, unclipped": -0.1}
  assert [label for label, *_ in cells] == [
      f"{block}, {clip}" for block in ("GPT-2's block", "the LLaMA-style block")
      for clip in ("unclipped", "clipped at 1.0", "with spike-only clipping")]
  for label, mean, low, high in cells:
    assert mean == pytest.approx(expected.get(label, 0.0), abs=5e-3) and low < mean < high
  changes = {"relu_gelu": -0.1, "clip_change": 0.1, "spike_change": 0.1, "spike_vs_clip": 0.0,
             "block_change": 0.1}
  assert [label.split("\n")[0] for label, *_ in contrasts] == list(changes)
  for (_, mean, low, high), want in zip(contrasts, changes.values()):
    assert mean == pytest.approx(want, abs=5e-3) and low < mean < high
  primary.figure_factorial(tmp_path / "factorial.png")
  assert (tmp_path / "factorial.png").stat().st_size > 10_000


def test_the_factorials_table_rounds_each_number_once_from_the_verdicts(tmp_path, monkeypatch):
  """A row per contrast, in the family's order, each number printed from the verdicts' raw value
  (never from a rounded one) and both margins' verdicts."""
  monkeypatch.setattr(primary, "RESULTS", preregistered.Results(tmp_path))
  fam, rng = primary.FACTORIAL, np.random.default_rng(1)
  for seed in range(400, 410):  # the sign-flip test needs 10 for Holm at K = 5
    for cell in fam.cells:
      write_factorial_run(tmp_path / fam.study, cell, seed, 4.0 + 0.02 * rng.standard_normal() + (
          0.3 if cell == "gelu/none/gpt2" else 0.0), grad_rel=30.0 if (
              cell == "gelu/none/gpt2" and seed < 402) else 2.0)
  v = factorial.verdicts(fam, primary.RESULTS)
  head, rule, *rows = primary.factorial_table(v)
  assert head.count("|") == rule.count("|") == 11 and len(rows) == fam.k
  assert [row.split(" | ")[0] for row in rows] == [f"| `{c.name}`" for c in fam.contrasts]
  first = rows[0].split(" | ")
  r = v["contrasts"]["relu_gelu"]
  signed = lambda x: f"{x:+.3f}".replace("-", "−")
  assert first[2] == (f"{signed(r['paired'].mean)} [{signed(r['paired'].ci_low)}, "
                      f"{signed(r['paired'].ci_high)}]")
  assert first[2].startswith("−0.3")  # ReLU lower by 0.3 where GELU's cell is 0.3 above
  assert first[6] == "10 of 10"
  assert first[7] == "**relu lower by at least 0.1**" and first[8] == "**relu lower by at least 0.05**"
  assert first[9] == f"{signed(r['spikes']['carried'])} (2 seeds) |"

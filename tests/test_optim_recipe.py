"""The optimizer's and schedule's options (issue 100): Muon (`optim.name="muon"`) against a numpy
Newton–Schulz iteration and a whole step built by hand, which leaves take which rule, an LR sweep
under it compiling once, a run under it training; warm-up–stable–decay (`optim.schedule="wsd"`)
against its closed form; their fields' rules, a checkpoint of Muon's state, and sweeps and
questions over them."""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actlab import config as config_lib, core
from actlab.infra import checkpoint
from actlab.report import question as Q
from actlab.run import program as program_lib, train
from actlab.sweep import grid
from conftest import REPO, tiny, tiny_encoder
from test_user_errors import run_cli

NS_COEFFS, NS_STEPS = (3.4445, -4.7750, 2.0315), 5


def newton_schulz(g: np.ndarray) -> np.ndarray:
  """Muon's quintic Newton–Schulz iteration, written out (float64), as optax applies it: the
  matrix over its Frobenius norm (+ 1e-8), transposed while it has more rows than columns, five
  steps of X ← aX + (b·XXᵀ + c·(XXᵀ)²)X."""
  a, b, c = NS_COEFFS
  x = g.astype(np.float64)
  tall = x.shape[0] > x.shape[1]
  x = x.T if tall else x
  x = x / (np.linalg.norm(x) + 1e-8)
  for _ in range(NS_STEPS):
    xxt = x @ x.T
    x = a * x + (b * xxt + c * xxt @ xxt) @ x
  return x.T if tall else x


def optim_spec(**fields) -> core.OptimSpec:
  return core.OptimSpec(**{"total_steps": 100, "warmup_steps": 0, "name": "muon", **fields})


# The model's shapes at d_model 32, d_ff 128: the attention's [D, D] (and [D, 3D] as a fused
# projection would be), the FFN's [D, F] and [F, D].
SHAPES = [(32, 32), (32, 96), (32, 128), (128, 32)]


@pytest.mark.parametrize("shape", SHAPES)
def test_muon_orthogonalizes_by_the_quintic_newton_schulz_iteration(shape):
  """With momentum 0, decay 0 and LR 1, the Muon part's update of a gradient is −(shape factor) ·
  NS(gradient): the numpy iteration's, on random matrices of the model's shapes."""
  optim = optim_spec(muon_momentum=0.0, weight_decay=0.0, muon_scale="width")
  tx = core.step.muon(optim, lambda step: 1.0)
  g = np.random.default_rng(0).normal(size=shape).astype(np.float32)
  params = {"kernel": jnp.zeros(shape)}
  update, _ = tx.update({"kernel": jnp.asarray(g)}, tx.init(params), params)
  factor = np.sqrt(max(1.0, shape[1] / shape[0]))
  np.testing.assert_allclose(-np.asarray(update["kernel"]) / factor, newton_schulz(g), atol=2e-5)


def test_a_scanned_stack_is_orthogonalized_layer_by_layer():
  """Under `model.scan_layers` a kernel is [layers, fan_in, fan_out]: each layer's matrix is
  orthogonalized on its own (the layer axis a batch axis, not flattened into the matrix)."""
  optim = optim_spec(muon_momentum=0.0, weight_decay=0.0, muon_scale="width")
  tx = core.step.muon(optim, lambda step: 1.0)
  g = np.random.default_rng(1).normal(size=(3, 32, 128)).astype(np.float32)
  params = {"kernel": jnp.zeros(g.shape)}
  update, _ = tx.update({"kernel": jnp.asarray(g)}, tx.init(params), params)
  expected = np.stack([newton_schulz(layer) for layer in g]) * 2.0  # √(128 / 32)
  np.testing.assert_allclose(-np.asarray(update["kernel"]), expected, atol=4e-5)


def by_path(tree) -> dict:
  return {"/".join(k.key for k in path): v for path, v in jax.tree_util.tree_leaves_with_path(tree)}


def hand_built_steps(optim: core.OptimSpec, params: dict, grads: list[dict]) -> list[dict]:
  """Each step's update of a path → array dict, in numpy: global-norm clipping; on the blocks'
  kernels optax's bias-corrected Nesterov momentum, NS, the shape factor and decoupled decay at
  lr · schedule; on the rest AdamW at muon_adam_lr_ratio times that, decaying embeddings and
  matrices only."""
  unit = core.step.schedule(optim)
  beta, b1, b2, wd = optim.muon_momentum, optim.b1, optim.b2, optim.weight_decay
  p = {k: np.asarray(v, np.float64) for k, v in params.items()}
  mu = {k: np.zeros_like(v) for k, v in p.items()}
  nu = {k: np.zeros_like(v) for k, v in p.items()}
  updates = []
  for t, g in enumerate(grads, start=1):
    g = {k: np.asarray(v, np.float64) for k, v in g.items()}
    norm = np.sqrt(sum(np.sum(v ** 2) for v in g.values()))
    g = {k: v * min(1.0, optim.clip_norm / norm) for k, v in g.items()}
    lr = optim.lr * float(unit(t - 1))
    update = {}
    for k, v in g.items():
      muon = re.match(r"blocks?(_\d+)?/", k) and k.endswith("/kernel")
      decayed = k.endswith(("kernel", "embedding", "lm_head"))
      if muon:
        mu[k] = beta * mu[k] + (1 - beta) * v
        nesterov = beta * mu[k] / (1 - beta ** (t + 1)) + (1 - beta) * v / (1 - beta ** t)
        fan_in, fan_out = v.shape[-2:]
        factor = (0.2 * np.sqrt(max(fan_in, fan_out)) if optim.muon_scale == "rms"
                  else np.sqrt(max(1.0, fan_out / fan_in)))
        ortho = np.stack([newton_schulz(m) for m in nesterov.reshape(-1, fan_in, fan_out)])
        update[k] = -lr * (factor * ortho.reshape(v.shape) + wd * p[k])
      else:
        mu[k] = b1 * mu[k] + (1 - b1) * v
        nu[k] = b2 * nu[k] + (1 - b2) * v ** 2
        adam = (mu[k] / (1 - b1 ** t)) / (np.sqrt(nu[k] / (1 - b2 ** t)) + optim.eps)
        update[k] = -optim.muon_adam_lr_ratio * lr * (adam + (wd * p[k] if decayed else 0.0))
    p = {k: p[k] + update[k] for k in p}
    updates.append(update)
  return updates


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [
    {"optim.muon_scale": "rms"},
    {"optim.muon_scale": "width", "model.scan_layers": True, "optim.muon_adam_lr_ratio": 0.1}],
    ids=["rms", "width-scanned"])
def test_a_muon_step_of_the_real_optimizer_is_the_one_built_by_hand(overrides):
  """Three steps of `Step.tx` on the tiny model (2 layers; GPT-2's block: biases, scales, tied
  embeddings), clipping active and the warm-up under way, equal the numpy steps leaf by leaf."""
  c = tiny(**{"optim.name": "muon", "optim.lr": 0.02, "optim.warmup_steps": 2,
              "optim.clip_norm": 1.0, "model.num_layers": 2, **overrides})
  step = program_lib.create_step(c, 257)
  params = jax.jit(step.init)(0).params
  rng = np.random.default_rng(2)
  grads = [jax.tree.map(lambda x: jnp.asarray(rng.normal(size=x.shape), jnp.float32), params)
           for _ in range(3)]
  expected = hand_built_steps(step.optim, by_path(params), [by_path(g) for g in grads])
  state, p = step.tx.init(params), params
  for g, want in zip(grads, expected):
    update, state = jax.jit(step.tx.update)(g, state, p)
    p = jax.tree.map(lambda a, b: a + b, p, update)
    got = by_path(update)
    assert got.keys() == want.keys()
    for k in got:
      np.testing.assert_allclose(got[k], want[k], atol=2e-7, err_msg=k)


def split_of(config) -> tuple[dict, str]:
  params = jax.eval_shape(program_lib.create_step(config, 257).init, 0).params
  return by_path(core.step.muon_split(params)), core.step.muon_split_line(params)


BLOCK_MATRICES = {"attn/query/kernel", "attn/key/kernel", "attn/value/kernel", "attn/out/kernel",
                  "ffn/up/kernel", "ffn/down/kernel"}


@pytest.mark.parametrize("block", ["gpt2", "llama"])
@pytest.mark.parametrize("scan", [False, True])
def test_muon_takes_each_blocks_matrices_and_adamw_the_rest(block, scan):
  """The blocks' kernels (q, k, v, out and the FFN's; the gate too in the gated FFN) are Muon's,
  each layer's counted under `scan_layers` too; embeddings, the head (tied, or `lm_head`), biases
  and norm scales are AdamW's. The line a run prints says the same."""
  c = config_lib.override(config_lib.decoder("gelu", "tiny", block),
                          {"model.num_layers": 3, "model.scan_layers": scan})
  rules, line = split_of(c)
  prefix = "blocks/" if scan else "block_{}/"
  matrices = BLOCK_MATRICES | ({"ffn/gate/kernel"} if block == "llama" else set())
  layers = [""] if scan else range(3)
  expected = {prefix.format(i) + m for i in layers for m in matrices}
  assert {k for k, r in rules.items() if r == "muon"} == expected
  others = {k for k, r in rules.items() if r == "adamw"}
  assert "wte/embedding" in others and ("lm_head" in others) == (block == "llama")
  assert all(k.endswith(("bias", "scale", "embedding", "lm_head")) for k in others)
  names = ", ".join(sorted(m.removesuffix("/kernel") for m in matrices))
  kinds = "embedding, lm_head, scale" if block == "llama" else "bias, embedding, scale"
  assert line == (f"optim: muon on {3 * len(matrices)} matrices ({names} of each block), adamw "
                  f"on {len(others)} other arrays ({kinds})")


@pytest.mark.parametrize("task", ["mlm", "classify"])
def test_in_the_encoder_muon_takes_the_blocks_matrices_only(task):
  """The encoder shares the optimizer: its blocks' kernels are Muon's; its heads (the MLM
  transform, the pooler, the classifier), embeddings, biases and scales AdamW's."""
  rules, _ = split_of(tiny_encoder(task))
  assert {k for k, r in rules.items() if r == "muon"} == {f"block_0/{m}" for m in BLOCK_MATRICES}
  head = "mlm/dense/kernel" if task == "mlm" else "classifier/kernel"
  assert rules[head] == rules["wtt/embedding"] == "adamw"


@pytest.mark.slow
def test_an_lr_sweep_under_muon_compiles_once_and_each_lr_reaches_its_update():
  """The peak LR stays in the optimizer state under Muon: one traced init and one traced step
  serve two LRs, alone and vectorized (the state mapped over runs), and the first step's change
  of every parameter (Muon's and AdamW's parts alike) scales with the LR."""
  c = tiny(**{"optim.name": "muon", "optim.warmup_steps": 0, "model.num_layers": 2})
  step = program_lib.create_step(c, 257)
  batch = jnp.asarray(np.random.default_rng(3).integers(0, 257, (8, 33)), jnp.int32)
  init, train_step = jax.jit(step.init), jax.jit(step.train_step)
  vectorized = jax.jit(jax.vmap(step.train_step, in_axes=(0, None)))
  lrs = [1e-3, 4e-3]
  states = [init(0, lr) for lr in lrs]
  changes = [jax.tree.map(lambda a, b: a - b, train_step(s, batch)[0].params, s.params)
             for s in states]
  stacked = jax.vmap(init, in_axes=(None, 0))(0, jnp.asarray(lrs))
  vmapped = vectorized(stacked, batch)[0].params
  assert init._cache_size() == train_step._cache_size() == vectorized._cache_size() == 1
  for k, change in by_path(changes[1]).items():
    np.testing.assert_allclose(change, 4 * by_path(changes[0])[k], rtol=1e-4, atol=3e-8,
                               err_msg=k)
  for r in range(2):
    jax.tree.map(lambda v, s, d: np.testing.assert_allclose(v[r] - s, d, atol=1e-6),
                 vmapped, states[r].params, changes[r])


@pytest.mark.slow
def test_a_run_under_muon_trains_and_says_its_split(tmp_path, capsys):
  """The tiny decoder under Muon for 40 steps: the validation loss falls well below its start, and
  the run says once which leaves Muon takes."""
  c = tiny(**{"optim.name": "muon", "optim.lr": 0.01, "train.steps": 40,
              "train.eval_every": 40, "metrics.sharpness_every": 0})
  summary = train.run(c, tmp_path / "run")
  assert summary["final_val_loss"] < summary["initial_val_loss"] - 1.0, summary
  out = capsys.readouterr().out
  assert out.count("actlab: optim: muon on 6 matrices (attn/key, attn/out, attn/query, "
                   "attn/value, ffn/down, ffn/up of each block), adamw on ") == 1, out
  assert json.loads((tmp_path / "run" / "config.json").read_text())["optim"]["name"] == "muon"


def wsd(step, shape="linear", warmup=10, total=110, decay=22, end=0.1):
  """Warm-up–stable–decay in closed form: 0 → 1 linearly, 1, then 1 → end over the decay's share
  x gone, as 1 − (1 − end)·x or 1 − (1 − end)·√x, reaching `end` at step `total`."""
  if step < warmup:
    return step / warmup
  start = total - decay
  x = min(max(step - start, 0), decay) / decay
  return 1.0 - (1.0 - end) * (x if shape == "linear" else np.sqrt(x))


@pytest.mark.parametrize("shape", ["linear", "sqrt"])
def test_wsd_warms_up_holds_then_decays_over_the_last_fraction(shape):
  """110 steps, warm-up 10, decay_fraction 0.2 (22 steps from step 88), min_lr_ratio 0.1: the
  multiplier at each phase's start, middle and end is the closed form's."""
  optim = core.OptimSpec(total_steps=110, warmup_steps=10, schedule="wsd", decay_fraction=0.2,
                         decay_shape=shape, min_lr_ratio=0.1)
  assert optim.decay_steps == 22
  s = core.step.schedule(optim)
  for step in (0, 5, 9, 10, 50, 87, 88, 99, 109, 110, 120):
    np.testing.assert_allclose(float(s(step)), wsd(step, shape), rtol=1e-6, atol=1e-7,
                               err_msg=step)
  assert float(s(0)) == 0.0 and float(s(10)) == float(s(88)) == 1.0
  np.testing.assert_allclose(float(s(99)), 0.55 if shape == "linear" else 1 - 0.9 * 0.5 ** 0.5,
                             rtol=1e-6)
  np.testing.assert_allclose(float(s(110)), 0.1, rtol=1e-6)
  no_warmup = core.step.schedule(dataclasses.replace(optim, warmup_steps=0))
  assert float(no_warmup(0)) == 1.0 and float(no_warmup(88)) == 1.0


def test_the_default_schedule_is_the_cosine_before_it():
  optim = core.OptimSpec(total_steps=110, warmup_steps=10)
  before = core.step.optax.warmup_cosine_decay_schedule(0.0, 1.0, 10, 110, 0.1)
  for step in (0, 5, 10, 60, 109, 110):
    assert float(core.step.schedule(optim)(step)) == float(before(step))


@pytest.mark.parametrize("field, value, message", [
    ("optim.name", "sgd", "optim.name='sgd': choose 'adamw' or 'muon'"),
    ("optim.schedule", "linear", "optim.schedule='linear': choose 'cosine' or 'wsd'"),
    ("optim.decay_fraction", 0.0, "optim.decay_fraction=0.0 must be in (0, 1)"),
    ("optim.decay_fraction", 1.0, "optim.decay_fraction=1.0 must be in (0, 1)"),
    ("optim.muon_momentum", 1.0, "optim.muon_momentum=1.0 must be in [0, 1)"),
    ("optim.muon_adam_lr_ratio", 0.0, "optim.muon_adam_lr_ratio=0.0 must be positive"),
    ("optim.muon_scale", "spectral", "optim.muon_scale='spectral': choose 'rms' or 'width'"),
    ("optim.decay_shape", "cosine", "optim.decay_shape='cosine': choose 'linear' or 'sqrt'"),
])
def test_each_new_field_is_checked_by_its_rule(field, value, message):
  with pytest.raises(config_lib.ConfigError, match="^" + re.escape(message) + "$"):
    config_lib.validate(tiny(**{field: value}))


def test_the_warm_up_must_end_before_the_decay_starts():
  """50 steps: decay_fraction 0.9 decays from step 5, where the warm-up of 5 ends (allowed); 0.95
  from step 2 (refused); 0.001 rounds to no step (refused). The cosine ignores decay_fraction."""
  c = lambda fraction: tiny(**{"optim.schedule": "wsd", "optim.decay_fraction": fraction})
  config_lib.validate(c(0.9))
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      "optim.warmup_steps=5 and optim.decay_fraction=0.95: the warm-up must end before the decay "
      "starts, at step 2 of train.steps=50; lower one of them")):
    config_lib.validate(c(0.95))
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      "optim.decay_fraction=0.001 of train.steps=50 is no step: raise it to at least 0.02")):
    config_lib.validate(c(0.001))
  config_lib.validate(tiny(**{"optim.decay_fraction": 0.95}))


def test_a_bad_optimizer_is_one_line_and_exit_2(tmp_path):
  line = run_cli("main", "--config=configs/tinystories_gelu.py:smoke", "--config.optim.name=sgd",
                 f"--workdir={tmp_path / 'run'}")
  assert line == "error: optim.name='sgd': choose 'adamw' or 'muon'"
  assert not (tmp_path / "run").exists()


def test_a_sweep_varies_the_optimizer_and_the_schedule_each_cell_its_own_program():
  """A sweep's axes over `optim.name` and `optim.schedule` give valid cells; a Muon and an AdamW
  cell are two programs (never one vectorized group)."""
  sweep = grid.parse({"axes": {"optim.name": ["adamw", "muon"], "optim.schedule": ["cosine", "wsd"]},
                      "seeds": [0]})
  cells = grid.cells(tiny(), sweep)
  assert [(c.config.optim.name, c.config.optim.schedule) for c in cells] == [
      ("adamw", "cosine"), ("adamw", "wsd"), ("muon", "cosine"), ("muon", "wsd")]
  for cell in cells:
    config_lib.validate(cell.config)
  with pytest.raises(program_lib.GroupError, match="optim.name: 'adamw' → 'muon'"):
    program_lib.check_group([cells[0].config, cells[2].config])


def test_a_question_compares_the_optimizers_each_cell_piloting_its_own_lr():
  """A question's cells may differ in `optim.name` (and `optim.schedule`): each cell's config
  validates, and its pilot chooses its peak LR, under Muon the matrices' LR with the AdamW part at
  the stated ratio; a cell with an optimizer that does not exist is one line naming it."""
  base = {"config": str(REPO / "tests" / "tiny_config.py"),
          "contrasts": {"d": {"muon": 1, "adamw": -1}},
          "pilot": {"lrs": [1e-3, 3e-3], "seeds": [0, 1]}, "fresh": {"first_seed": 100}}
  q = Q.parse({**base, "cells": {"adamw": {"optim.name": "adamw"},
                                 "muon": {"optim.name": "muon", "optim.schedule": "wsd",
                                          "optim.muon_adam_lr_ratio": 0.5}}}, "optimizers")
  configs = Q.cell_configs(q)
  assert (configs["muon"]["optim.name"], configs["muon"]["optim.schedule"]) == ("muon", "wsd")
  assert configs["adamw"]["optim.name"] == "adamw" and configs["muon"]["optim.lr"] == 1e-3
  bad = Q.parse({**base, "cells": {"adamw": {}, "muon": {"optim.name": "sgdm"}}}, "optimizers")
  with pytest.raises(Q.QuestionError, match=re.escape(
      "question optimizers: cells.muon: optim.name='sgdm': choose 'adamw' or 'muon'")):
    Q.cell_configs(bad)


@pytest.mark.slow
def test_a_muon_state_checkpoints_and_resumes_bit_for_bit(tmp_path):
  """Muon's state (its momentum on the matrices, AdamW's moments on the rest, empty where a rule
  does not apply) saved after two steps and restored, the next steps are the uninterrupted ones
  to the bit, under a scanned stack too."""
  c = tiny(**{"optim.name": "muon", "optim.schedule": "wsd", "model.scan_layers": True,
              "model.num_layers": 2})
  step = program_lib.create_step(c, 257)
  batches = [jnp.asarray(np.random.default_rng(k).integers(0, 257, (8, 33)), jnp.int32)
             for k in range(4)]
  train_step = jax.jit(lambda s, b: step.train_step(s, b, diagnostics=False)[0])
  states = [jax.jit(step.init)(0)]
  for batch in batches:
    states.append(train_step(states[-1], batch))
  with checkpoint.Checkpoints(tmp_path, 3) as ck:
    ck.save(2, states[2], {})
  with checkpoint.Checkpoints(tmp_path, 3, read_only=True) as ck:
    resumed, _ = ck.restore(2, states[0])
  for batch in batches[2:]:
    resumed = train_step(resumed, batch)
  jax.tree.map(np.testing.assert_array_equal, resumed, states[-1])

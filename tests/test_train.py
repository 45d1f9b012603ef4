"""Training: optimizer, pure step, loss falls, overfitting, workdir files and contracts."""

import contextlib
import functools
import gc
import io
import itertools
import json
import re
import shutil
import threading
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from actlab import config as config_lib, core, data, tasks
from actlab.infra import checkpoint, parallel
from actlab.measure import evaluators
from actlab.run import loop, pretrained, program as program_lib, train
from conftest import tiny, tiny_encoder


def test_schedule_warmup_then_cosine_to_min():
  c = tiny()
  c.optim.update(warmup_steps=10, min_lr_ratio=0.1)
  c.train.steps = 110
  s = core.step.schedule(program_lib.create_step(c, 257).optim)
  assert float(s(0)) == 0.0
  np.testing.assert_allclose(float(s(5)), 0.5, rtol=1e-6)
  np.testing.assert_allclose(float(s(10)), 1.0, rtol=1e-6)
  np.testing.assert_allclose(float(s(60)), 0.1 + 0.9 * 0.5, rtol=1e-5)  # half-way cosine
  np.testing.assert_allclose(float(s(110)), 0.1, rtol=1e-5)


def test_a_run_collects_garbage_less_often_and_restores_the_pace_after_even_on_error():
  before = gc.get_threshold()
  with pytest.raises(RuntimeError):
    with train.fewer_collections(12_345):
      assert gc.get_threshold() == (12_345, *before[1:])
      raise RuntimeError
  assert gc.get_threshold() == before


def test_weight_decay_mask_matrices_and_embeddings_only():
  task = program_lib.create_step(tiny(), 257)
  params = jax.eval_shape(task.init, 0).params
  mask = core.step.decay_mask(params)
  flat = {"/".join(k.key for k in path): v
          for path, v in jax.tree_util.tree_leaves_with_path(mask)}
  assert flat["wte/embedding"] and flat["wpe/embedding"]
  assert flat["block_0/attn/query/kernel"] and flat["block_0/ffn/down/kernel"]
  assert not flat["block_0/attn/query/bias"] and not flat["block_0/ln_ffn/scale"]
  assert not flat["ln_f/bias"]


def flat_mask(config):
  """{"a/b/leaf": (decayed, ndim)} of `config`'s model parameters."""
  params = jax.eval_shape(program_lib.create_step(config, 257).init, 0).params
  mask = core.step.decay_mask(params)
  return {"/".join(k.key for k in path): (v, leaf.ndim) for (path, v), leaf in
          zip(jax.tree_util.tree_leaves_with_path(mask), jax.tree.leaves(params))}


def test_the_llama_style_blocks_untied_head_is_decayed_as_every_matrix():
  """docs/running.md: weight decay on matrices and embeddings; nanoGPT and benchmarks/torch_ref.py
  decay every parameter of two or more dimensions, the same set where no layer axis is stacked."""
  flat = flat_mask(config_lib.decoder("silu", "tiny", "llama"))
  assert flat["lm_head"] == (True, 2)
  assert {k: v for k, (v, ndim) in flat.items() if v != (ndim >= 2)} == {}
  assert not flat["block_0/ln_attn/scale"][0]


@pytest.mark.parametrize("model, scanned", [("gpt2", False), ("encoder", False), ("gpt2", True)])
def test_the_tied_blocks_masks_are_the_kernels_and_embeddings_as_before(model, scanned):
  """GPT-2's head is its embedding and BERT's MLM head a bias over it: their masks are the old
  rule's (leaves named `kernel` or `embedding`); under `model.scan_layers` a bias or scale has a
  layer axis, two dimensions, and is still not decayed."""
  config = (tiny if model == "gpt2" else tiny_encoder)(**{"model.scan_layers": scanned})
  flat = flat_mask(config)
  assert {k: v for k, (v, _) in flat.items()} == {
      k: k.rsplit("/", 1)[-1] in ("kernel", "embedding") for k in flat}
  assert any(not v and ndim == 2 for v, ndim in flat.values()) == scanned


def test_adamw_matches_closed_form_first_step():
  """First AdamW step: update = -lr·(sign(g) + wd·p) on decayed leaves, -lr·sign(g) on others."""
  c = tiny()
  c.optim.update(warmup_steps=0, clip_norm=0.0, eps=0.0, weight_decay=0.5, lr=0.1)
  c.train.steps = 10
  tx = core.optimizer(program_lib.create_step(c, 257).optim)
  params = {"kernel": jnp.array([[1.0, -2.0]]), "bias": jnp.array([3.0])}
  grads = {"kernel": jnp.array([[0.5, 0.25]]), "bias": jnp.array([-4.0])}
  updates, _ = tx.update(grads, tx.init(params), params)
  expected = -0.1 * (np.sign([[0.5, 0.25]]) + 0.5 * np.array([[1.0, -2.0]]))
  np.testing.assert_allclose(updates["kernel"], expected, atol=1e-6)
  np.testing.assert_allclose(updates["bias"], [0.1], rtol=1e-6)


@pytest.mark.parametrize("clip_norm, scale", [(1.0, 1 / 50), (100.0, 1.0), (0.0, 1.0)])
def test_clipping_scales_the_gradient_to_clip_norm_before_adamw(clip_norm, scale):
  """The chain of `core.optimizer` on a gradient of global norm 50: clipped to `clip_norm` when above
  it (scale 1/50), untouched below it or with clipping off (0). First AdamW step in closed form
  (bias-corrected moments g and g², LR multiplier 1 without warm-up): update = -lr·(g/(|g| + eps)
  + wd·p·mask). eps = 1 keeps the gradient's scale in the update, so clipping shows."""
  c = tiny()
  c.optim.update(warmup_steps=0, clip_norm=clip_norm, eps=1.0, weight_decay=0.5, lr=0.1)
  c.train.steps = 10
  tx = core.optimizer(program_lib.create_step(c, 257).optim)
  params = {"kernel": jnp.array([[1.0, -2.0]]), "bias": jnp.array([3.0])}
  grads = {"kernel": jnp.array([[30.0, 0.0]]), "bias": jnp.array([40.0])}  # global norm 50
  updates, _ = tx.update(grads, tx.init(params), params)
  g_kernel, g_bias = scale * np.array([[30.0, 0.0]]), scale * np.array([40.0])
  decay_kernel = 0.5 * np.array([[1.0, -2.0]])  # the bias is not decayed
  np.testing.assert_allclose(updates["kernel"],
                             -0.1 * (g_kernel / (np.abs(g_kernel) + 1) + decay_kernel), rtol=1e-6)
  np.testing.assert_allclose(updates["bias"], -0.1 * g_bias / (np.abs(g_bias) + 1), rtol=1e-6)


SPIKE_PARAMS = {"kernel": jnp.zeros((1, 2)), "bias": jnp.zeros(1)}


def gradient(norm):
  """A gradient of global norm `norm`, always in the direction (0.6, 0, 0.8)."""
  return {"kernel": jnp.array([[0.6 * norm, 0.0]]), "bias": jnp.array([0.8 * norm])}


def test_spike_clipping_scales_only_norms_above_the_multiple_of_the_first_steps():
  """Threshold 10 × the first step's norm 2 = 20: norms 2, 15, 20 pass unchanged; 50 and 400 are
  scaled to exactly 20; the first norm stays in the state throughout."""
  tx, norms = core.step.clip_spikes(10.0), [2.0, 15.0, 50.0, 20.0, 400.0, 3.0]
  state = tx.init(SPIKE_PARAMS)
  for norm in norms:
    clipped, state = tx.update(gradient(norm), state)
    expected = jax.tree.map(lambda g: np.asarray(g) * min(1.0, 20.0 / norm), gradient(norm))
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6), clipped, expected)
    assert float(optax.tree.norm(clipped)) == pytest.approx(min(norm, 20.0), rel=1e-6)
    assert float(state.initial_norm) == pytest.approx(2.0, rel=1e-6)
  assert core.step.clip_spikes(10.0).update(gradient(0.0), state)[0]["bias"][0] == 0.0


def test_spike_clipping_keeps_each_runs_first_norm_vectorized_and_across_a_checkpoint(tmp_path):
  """Under `jax.vmap` (a vectorized sweep) each run's threshold is its own first norm: 1 and 4,
  threshold 10 and 40, so a norm of 30 is clipped in the first run only. The state is a leaf of
  the checkpoint: saved after two steps and restored, the next steps are the uninterrupted ones,
  bit for bit."""
  tx = core.optimizer(core.OptimSpec(total_steps=10, warmup_steps=0, clip_norm=0.0,
                                     spike_clip=10.0))
  stack = lambda *trees: jax.tree.map(lambda *x: jnp.stack(x), *trees)
  params = stack(SPIKE_PARAMS, SPIKE_PARAMS)
  state = jax.vmap(tx.init)(params)
  update = jax.jit(jax.vmap(tx.update))
  steps = [stack(gradient(1.0), gradient(4.0)), stack(gradient(30.0), gradient(30.0)),
           stack(gradient(500.0), gradient(2.0)), stack(gradient(20.0), gradient(80.0))]
  states = [state]
  for grads in steps:
    states.append(update(grads, states[-1], params)[1])
  inner = lambda s: s.inner_state[0]  # inject_hyperparams' chain: the clipping's state first
  np.testing.assert_allclose(inner(states[-1]).initial_norm, [1.0, 4.0], rtol=1e-6)
  clipped, _ = jax.vmap(core.step.clip_spikes(10.0).update)(steps[1], inner(states[1]))
  np.testing.assert_allclose(optax.tree.norm(jax.tree.map(lambda g: g[0], clipped)), 10.0,
                             rtol=1e-6)
  np.testing.assert_array_equal(jax.tree.map(lambda g: g[1], clipped)["bias"], [24.0])
  with checkpoint.Checkpoints(tmp_path, 3) as ck:
    ck.save(2, states[2], {})
  with checkpoint.Checkpoints(tmp_path, 3, read_only=True) as ck:
    resumed, _ = ck.restore(2, state)
  for grads in steps[2:]:
    resumed = update(grads, resumed, params)[1]
  jax.tree.map(np.testing.assert_array_equal, resumed, states[-1])


@pytest.mark.parametrize("clip_norm", [1.0, 0.0])
def test_without_spike_clipping_the_optimizer_is_the_one_before_it(clip_norm):
  """spike_clip 0 (the default): the chain, its state's structure and its updates are those of
  the optimizer before the field existed (written out here), bit for bit."""
  optim = core.OptimSpec(total_steps=20, warmup_steps=5, clip_norm=clip_norm)
  unit = core.step.schedule(optim)

  @optax.inject_hyperparams
  def before(peak_lr):
    clip = optax.clip_by_global_norm(clip_norm) if clip_norm else optax.identity()
    return optax.chain(clip, optax.adamw(
        lambda step: peak_lr * unit(step), b1=optim.b1, b2=optim.b2, eps=optim.eps,
        weight_decay=optim.weight_decay, mask=core.step.decay_mask))

  old, new = before(peak_lr=optim.lr), core.optimizer(optim)
  params = {"kernel": jnp.array([[1.0, -2.0]]), "bias": jnp.array([3.0])}
  s_old, s_new = old.init(params), new.init(params)
  assert jax.tree.structure(s_old) == jax.tree.structure(s_new)
  for norm in (0.5, 3.0, 40.0):
    (u_old, s_old), (u_new, s_new) = (tx.update(gradient(norm), s, params)
                                      for tx, s in ((old, s_old), (new, s_new)))
    jax.tree.map(np.testing.assert_array_equal, (u_new, s_new), (u_old, s_old))


def test_clip_norm_and_spike_clip_are_one_clipping_at_a_time():
  with pytest.raises(config_lib.ConfigError, match=r"^optim.clip_norm=1.0 and "
                     r"optim.spike_clip=10.0: one clipping at a time; set the other to 0$"):
    config_lib.validate(tiny(**{"optim.spike_clip": 10.0}))
  with pytest.raises(config_lib.ConfigError, match=r"^optim.spike_clip=-1.0 must be >= 0"):
    config_lib.validate(tiny(**{"optim.clip_norm": 0.0, "optim.spike_clip": -1.0}))
  with pytest.raises(ValueError, match="one clipping at a time"):
    core.OptimSpec(total_steps=200, spike_clip=10.0)
  config_lib.validate(tiny(**{"optim.clip_norm": 0.0, "optim.spike_clip": 10.0}))


@pytest.mark.slow
def test_grad_norm_metric_is_the_norm_before_clipping():
  """`grad_norm` is the raw gradient's norm (computed here independently), not the clipped one."""
  c = tiny(**{"optim.clip_norm": 1e-3, "optim.warmup_steps": 0})
  step_fns = program_lib.create_step(c, 257)
  state = jax.jit(step_fns.init)(0)
  batch = jnp.asarray(np.random.default_rng(0).integers(0, 257, (8, 33)), jnp.int32)
  key = jax.random.fold_in(state.rng, state.step)

  def loss(params):
    out = step_fns.objective(params, batch, key, train=True)
    return out.loss_sum / out.count

  grads, (_, metrics) = jax.jit(
      lambda s: (jax.grad(loss)(s.params), step_fns.train_step(s, batch)))(state)
  raw_norm = float(optax.tree.norm(grads))
  assert raw_norm > 100 * c.optim.clip_norm  # clipping is active: the clipped norm is 1e-3
  np.testing.assert_allclose(float(metrics["grad_norm"]), raw_norm, rtol=1e-5)


LOSS = evaluators.Evaluators((evaluators.Loss(),), None)


def val_loss(eval_step, params, dataset) -> float:
  return LOSS.pool([eval_step(params, b) for b in dataset.val_batches()])["val_loss"]


@pytest.fixture(scope="module")
def dataset():
  return data.load(tiny())


@pytest.fixture(scope="module")
def compiled():
  """The step functions of this module's tests, each compiled once: (config, vocab size) → the
  config's `program.Program` (its init, `train_step`, `log_step`), its `core.Step`, and one
  run's `init` and `reference`: `Step.train_step` as defined (with diagnostics, donating
  nothing), jitted."""
  made = {}

  def get(config, vocab_size=257):
    key = program_lib.compile_key(config, vocab_size)
    if key not in made:
      program = program_lib.Program.create(config, vocab_size)
      made[key] = types.SimpleNamespace(program=program, step=program.step,
                                        init=jax.jit(program.step.init),
                                        reference=jax.jit(program.step.train_step))
    return made[key]
  return get


@pytest.mark.slow
def test_train_step_is_pure(compiled, dataset):
  c = tiny()
  fns = compiled(c)
  state = fns.program.start([c])
  batch = dataset.train_batch(0)
  jit_state, jit_metrics = fns.reference(state, batch)
  again_state, _ = fns.reference(state, batch)  # same input → same output, input untouched
  for a, b in zip(jax.tree.leaves(jit_state), jax.tree.leaves(again_state)):
    np.testing.assert_array_equal(a, b)
  assert int(jit_state.step) == 1 and int(state.step) == 0
  # untrained loss is close to uniform over the padded vocabulary's used part
  assert abs(float(jit_metrics["train_loss"]) - np.log(257)) < 0.5


@pytest.mark.slow
def test_one_run_program_is_the_plain_step_bitwise(compiled, dataset):
  """A single run (R = 1) is the plain jitted step, not a vmap of it (whose batching rounds
  differently): 10 steps give the same parameters to the bit."""
  c = tiny()
  fns = compiled(c)
  program = fns.program
  state = program.start([c])
  plain = jax.device_get(state)
  plain_step = jax.jit(functools.partial(fns.step.train_step, diagnostics=False))
  for k in range(10):
    batch = dataset.train_batch(k)
    state, _ = program.train_step(state, program.put_batches([batch]))
    plain, _ = plain_step(plain, batch)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(plain)):
    np.testing.assert_array_equal(a, b)


@pytest.mark.slow
def test_loss_falls_over_50_steps(compiled, dataset):
  c = tiny()
  program = compiled(c).program
  eval_step = jax.jit(functools.partial(LOSS.validation_step, program.step))
  state = program.start([c])
  before = val_loss(eval_step, state.params, dataset)
  for k in range(50):
    state, _ = program.train_step(state, program.put_batches([dataset.train_batch(k)]))
  after = val_loss(eval_step, state.params, dataset)
  assert after < before - 1.0, (before, after)


@pytest.mark.slow
def test_overfits_one_batch(dataset):
  c = tiny(**{"model.d_model": 64, "model.d_ff": 256, "optim.lr": 1e-2, "train.steps": 100,
              "train.batch_size": 4})
  task = program_lib.create_step(c, dataset.tokenizer.vocab_size)
  step = jax.jit(task.train_step, donate_argnums=0)
  state = jax.jit(task.init)(0)
  batch = dataset.train_batch(0)[:4]
  for _ in range(100):
    state, metrics = step(state, batch)
  assert float(metrics["train_loss"]) < 0.3


@pytest.mark.slow
def test_step_keys_differ_per_step_and_seed(compiled):
  """Dropout masks come from fold_in(rng, step): different per step, same for same (seed, step).
  (The dropout of the stability measures' test: one compile for both.)"""
  c = tiny(**{"model.dropout": 0.1})
  fns = compiled(c)
  batch = np.ones((8, 33), np.int32)
  s0 = fns.init(0, c.optim.lr)
  _, m_a = fns.reference(s0, batch)
  _, m_b = fns.reference(s0, batch)
  _, m_c = fns.reference(s0.replace(step=jnp.int32(1)), batch)
  _, m_d = fns.reference(fns.init(1, c.optim.lr).replace(params=s0.params), batch)
  assert float(m_a["train_loss"]) == float(m_b["train_loss"])
  assert float(m_a["train_loss"]) != float(m_c["train_loss"])
  assert float(m_a["train_loss"]) != float(m_d["train_loss"])


def run_config(sharpness_every: int):
  """The runs of `runs`: 30 steps of the tiny decoder, the test windows scored at the end, the
  bar on, sharpness estimated every `sharpness_every` steps."""
  return tiny(**{"data.test_batches": 1, "train.steps": 30, "train.eval_every": 30,
                 "train.progress": True, "metrics.sharpness_every": sharpness_every,
                 "metrics.sharpness_iters": 2})


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """`train.run` of `run_config(30)`, which estimates sharpness at steps 0 and 30, and of
  `run_config(31)`, too short for an estimate after step 0, by sharpness_every, which also asks
  for deterministic ops (`train.deterministic_ops`: the same numbers on a CPU): each with its
  config, workdir, summary, metrics.jsonl rows, stdout, stderr, and the compiled programs
  (`cache`, for `program.get`)."""
  cache, out = {}, {}
  for every in (30, 31):
    c, workdir = run_config(every), tmp_path_factory.mktemp(f"sharpness_every_{every}")
    c.train.deterministic_ops = every == 31
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
      summary = train.run(c, workdir, cache=cache)
    rows = [json.loads(l) for l in (workdir / "metrics.jsonl").read_text().splitlines()]
    out[every] = types.SimpleNamespace(config=c, workdir=workdir, summary=summary, rows=rows,
                                       out=stdout.getvalue(), err=stderr.getvalue(), cache=cache)
  return out


@pytest.mark.slow
def test_run_writes_workdir_contract(runs):
  run = runs[30]
  c, workdir, rows, summary = run.config, run.workdir, run.rows, run.summary
  assert json.loads((workdir / "config.json").read_text()) == json.loads(c.to_json())
  assert [r["step"] for r in rows] == [0, 10, 20, 30]
  for r in rows[1:]:
    assert {"train_loss", "lr", "grad_norm", "tokens_per_sec"} <= set(r)
  assert "val_loss" in rows[0] and "val_loss" in rows[-1]
  assert rows[-1]["val_loss"] < rows[0]["val_loss"]
  saved = json.loads((workdir / "summary.json").read_text())
  assert saved == summary
  assert saved["final_val_loss"] == rows[-1]["val_loss"]
  assert saved["best_val_loss"] == min(rows[0]["val_loss"], rows[-1]["val_loss"])
  assert saved["params_non_embedding"] < saved["params"]
  assert saved["unigram_loss"] == pytest.approx(data.load(c).unigram_loss())  # the "learned" bar
  assert saved["unigram_loss"] < rows[0]["val_loss"]  # below ln(V): frequencies are learnable
  assert sorted(int(p.name) for p in (workdir / "checkpoints").iterdir()
                if p.name.isdigit()) == [25, 30]
  # The held-out test windows are scored once, at the end, by the same loss.
  assert ["test_loss" in r for r in rows] == [False, False, False, True]
  assert saved["final_test_loss"] == rows[-1]["test_loss"]
  _, _, task, params, _ = pretrained.load_run(workdir)
  objective = jax.jit(lambda b: task.eval_step(params, b))
  outs = [objective(jnp.asarray(b)) for b in data.load(c).val_batches(test=True)]
  direct = sum(float(o.loss_sum) for o in outs) / sum(float(o.count) for o in outs)
  assert saved["final_test_loss"] == pytest.approx(direct, rel=1e-5)
  assert saved["final_test_loss"] != saved["final_val_loss"]
  # The gradient norm at the initial parameters: step 0's, recorded in the first row only.
  assert ["grad_norm_init" in r for r in rows] == [False, True, False, False]
  program = program_lib.get(c, saved["vocab_size"], cache=run.cache)
  first = data.load(c).train_batch(0)
  _, m0 = program.train_step(program.start([c]), program.put_batches([first]))
  assert saved["grad_norm_init"] == rows[1]["grad_norm_init"] == float(m0["grad_norm"])
  assert saved["grad_norm_max_rel"] == pytest.approx(saved["grad_norm_max"] / saved["grad_norm_init"])
  assert 0 < saved["attn_entropy_min"] <= min(r["train_attn_entropy_min"] for r in rows[1:])


@pytest.mark.slow
def test_different_config_on_used_workdir_is_refused(runs, tmp_path):
  """A run's workdir (a copy of one of `runs`) refuses another config, naming what differs, and
  is left as it was."""
  workdir = shutil.copytree(runs[31].workdir, tmp_path / "run")
  before = sorted(p.name for p in (workdir / "checkpoints").iterdir())
  c = runs[31].config.copy_and_resolve_references()
  c.optim.lr = 1e-4
  c.model.activation = "relu"
  with pytest.raises(pretrained.WorkdirError, match=r"model.activation: 'gelu' → 'relu'.*optim.lr"):
    train.run(c, workdir)
  assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == before


@pytest.mark.slow
def test_init_from_a_run_refuses_another_norm_eps_and_says_another_rope_theta(tmp_path, capsys):
  """A field `train.init_from` checks (its `init_from` mark, config/schema.py) either refuses a
  run of another value in one line (`norm_eps`: the norms would not be the ones trained) or
  allows it and says so in the run's first line (`rope_theta`: changed on purpose, e.g. for a
  longer context)."""
  short = {"model.position": "rope", "train.steps": 2, "optim.warmup_steps": 0,
           "train.progress": False, "metrics.tensorboard": False}
  train.run(tiny(**short), tmp_path / "source")
  capsys.readouterr()
  start = {**short, "train.init_from": str(tmp_path / "source")}
  with pytest.raises(pretrained.WorkdirError, match=r"^train.init_from='.*source' is a different "
                     r"model or tokenizer: model.norm_eps: 1e-05 there, 1e-06 here$"):
    train.run(tiny(**start, **{"model.norm_eps": 1e-6}), tmp_path / "eps")
  assert not (tmp_path / "eps").exists()
  train.run(tiny(**start, **{"model.rope_theta": 500.0}), tmp_path / "theta")
  first, second = capsys.readouterr().out.splitlines()[:2]
  assert re.fullmatch(r"actlab: train.init_from='.*source': model.rope_theta: 10000.0 there, "
                      r"500.0 here \(allowed: the parameters carry over\)", first), first
  assert second.startswith("actlab: causal_lm gelu")


@pytest.mark.slow
def test_rows_keep_the_largest_grad_norm_of_every_step(runs):
  """`grad_norm_max` in a row is the largest `grad_norm` of the steps since the previous row, and
  the summary's the run's largest: the run's steps retaken here one by one (by its program)."""
  run = runs[31]
  c = run.config
  ds = data.load(c)
  program = program_lib.get(c, ds.tokenizer.vocab_size, cache=run.cache)
  state, norms = program.start([c]), []
  for k in range(c.train.steps):
    state, m = program.train_step(state, program.put_batches([ds.train_batch(k)]))
    norms.append(float(m["grad_norm"]))
  rows = run.rows[1:]
  assert [r["step"] for r in rows] == [10, 20, 30]
  intervals = [norms[:10], norms[10:20], norms[20:]]
  for row, interval in zip(rows, intervals):
    np.testing.assert_allclose(row["grad_norm_max"], max(interval), rtol=1e-5)
    np.testing.assert_allclose(row["grad_norm"], interval[-1], rtol=1e-5)
  assert any(max(interval) != interval[-1] for interval in intervals)  # the max is not the last
  np.testing.assert_allclose(run.summary["grad_norm_max"], max(norms), rtol=1e-5)


@pytest.mark.slow
def test_the_bar_says_what_the_run_does_and_a_run_too_short_for_sharpness_skips_it(runs):
  """The bar's description names an evaluation and a sharpness estimate while the loop waits for
  them, training otherwise (step 0's run beside the first steps: the bar starts with training). A
  run of fewer steps than `metrics.sharpness_every` estimates no sharpness, not even at step 0,
  and says so; its other numbers are those of a run that does, though it asked for deterministic
  ops: on a CPU they change nothing (it says so, and provenance.json records the asking)."""
  for every, described in ((30, ["training", "evaluating", "sharpness"]),
                           (31, ["training", "evaluating", "training"])):
    bar = [d for d, _ in itertools.groupby(re.findall(r"(\w+):\s+\d+%", runs[every].err))]
    assert bar[:3] == described, runs[every].err
  assert [r["step"] for r in runs[30].rows if "sharpness" in r] == [0, 30]
  assert not any("sharpness" in r for r in runs[31].rows)
  note = ("actlab: no sharpness estimate, not even at step 0: metrics.sharpness_every (31) is more "
          "than train.steps (30); set it to at most 30 for estimates (docs/metrics.md §5)\n")
  assert note in runs[31].out and "sharpness" not in runs[30].out
  strip = lambda rs: [{k: v for k, v in r.items() if k not in ("sharpness", "tokens_per_sec")}
                      for r in rs]
  assert strip(runs[31].rows) == strip(runs[30].rows)
  said = "actlab: train.deterministic_ops changes nothing here: a CPU's programs are deterministic"
  assert said in runs[31].out and said not in runs[30].out
  asked = [json.loads((runs[every].workdir / "provenance.json").read_text())["segments"][0][
      "deterministic_ops"]["asked"] for every in (30, 31)]
  assert asked == [False, True]


@pytest.mark.slow
def test_the_first_steps_do_not_wait_for_step_0s_measurements(runs, monkeypatch, tmp_path):
  """Step 0's evaluation and sharpness estimate run once their programs are compiled, beside the
  first steps (on a copy of the initial parameters): here the sharpness program's compilation
  waits until step 12 has started, past the first row's step, 10. The run's rows are those of a
  run that measured step 0 first (`runs`), step 0's row first."""
  gate, opened = threading.Event(), []
  start, take = program_lib.Ahead.start, loop.Prefetch.take

  def gated_start(self, pool, *like):
    if self.jitted.__name__ != "sharpness_step":
      return start(self, pool, *like)
    args = program_lib.abstract(like)
    self.compiled = pool.submit(lambda: opened.append(gate.wait(timeout=20))
                                or self.jitted.lower(*args).compile())

  def opening_take(self, k):
    if k == 12:
      gate.set()
    return take(self, k)
  monkeypatch.setattr(program_lib.Ahead, "start", gated_start)
  monkeypatch.setattr(loop.Prefetch, "take", opening_take)
  with contextlib.redirect_stderr(io.StringIO()):
    train.run(run_config(30), tmp_path)
  assert opened == [True], "the first step waited for the sharpness program"
  rows = [json.loads(l) for l in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  strip = lambda rs: [{k: v for k, v in r.items() if k != "tokens_per_sec"} for r in rs]
  assert strip(rows) == strip(runs[30].rows)


def test_a_wait_for_step_0s_sharpness_program_is_sharpness_cost(monkeypatch, tmp_path):
  """The checkpoint at step 25 keeps step 0's row, so it waits for the sharpness program, whose
  compilation starts only once that wait has lasted 0.5 s: the wait is in
  `timing.measure_sec.sharpness`, not lost from the summary."""
  gate = threading.Event()
  start, ready = program_lib.Ahead.start, program_lib.Ahead.ready

  def gated_start(self, pool, *like):
    if self.jitted.__name__ != "sharpness_step":
      return start(self, pool, *like)
    args = program_lib.abstract(like)
    self.compiled = pool.submit(lambda: gate.wait(timeout=20) and self.jitted.lower(*args).compile())

  def opening_ready(self):
    if self.jitted.__name__ == "sharpness_step" and not gate.is_set():
      time.sleep(0.5)
      gate.set()
    return ready(self)
  monkeypatch.setattr(program_lib.Ahead, "start", gated_start)
  monkeypatch.setattr(program_lib.Ahead, "ready", opening_ready)
  with contextlib.redirect_stderr(io.StringIO()):
    summary = train.run(run_config(30), tmp_path)
  assert gate.is_set()
  assert summary["timing"]["measure_sec"]["sharpness"] >= 0.5, summary["timing"]


@pytest.mark.slow
def test_init_and_the_first_step_compile_before_the_first_arrays_go_to_the_devices(monkeypatch,
                                                                                   tmp_path):
  """A fresh run starts compiling `init` and its first step's program before it puts its first
  batch on the devices (on a GPU, the memory pool's allocation, which holds no Python lock, then
  runs beside their tracing); a resumed run compiles no `init`. On an accelerator the sharpness
  program starts with them, and is compiled once."""
  started, at_first_put = [], []
  start, put = program_lib.Ahead.start, parallel.Plan.shard_batch

  def watched_start(self, pool, *like):
    started.append(self.jitted.__name__)
    return start(self, pool, *like)

  def watched_put(self, batch, stacked=False):
    at_first_put.append(at_first_put[0] if at_first_put else list(started))
    return put(self, batch, stacked)

  def run(workdir, **overrides):
    started.clear(), at_first_put.clear()
    with contextlib.redirect_stderr(io.StringIO()):
      return train.run(tiny(**{"train.steps": 10, "train.checkpoint_every": 5,
                               "train.log_every": 5, **overrides}), workdir)
  monkeypatch.setattr(program_lib.Ahead, "start", watched_start)
  monkeypatch.setattr(parallel.Plan, "shard_batch", watched_put)
  run(tmp_path / "cpu")
  assert at_first_put[0] == ["init", "train_step"]
  shutil.rmtree(tmp_path / "cpu" / "checkpoints" / "10")
  (tmp_path / "cpu" / "summary.json").unlink()
  run(tmp_path / "cpu")
  assert at_first_put[0] == ["train_step"]  # from step 5's checkpoint: no `init`
  monkeypatch.setattr(parallel.Plan, "accelerated", True)
  counted = run(tmp_path / "gpu", **{"metrics.sharpness_every": 10,
                                     "metrics.sharpness_iters": 2})["timing"]["compile"]
  assert at_first_put[0] == ["init", "train_step", "sharpness_step"]
  assert "jit(sharpness_step)" in counted["compiled"] + counted["cached"]
  assert counted["programs_compiled"] + counted["programs_cached"] == len(
      set(counted["compiled"]) | set(counted["cached"])), counted  # each program once


@pytest.mark.parametrize("runs", [1, 2])
def test_a_programs_init_is_traced_once_for_its_shapes_and_its_compile(monkeypatch, runs):
  """`Program.create` takes the state's shapes from the function `init`'s program jits, for
  arguments like those it compiles for: compiling `init` then traces nothing again."""
  traced, real = [], core.Step.init
  monkeypatch.setattr(core.Step, "init", lambda self, *args: traced.append(1) or real(self, *args))
  config = tiny()
  program = program_lib.Program.create(config, 260, runs)
  assert len(traced) == 1
  program.init.jitted.lower(*program_lib.abstract(program_lib.init_args([config] * runs, runs)))
  assert len(traced) == 1


def test_the_checkpoints_checksums_run_the_program_compiled_ahead(monkeypatch, tmp_path):
  """Each checkpoint's checksums run `sums` as compiled in the loop's threads for a run's state
  (`Program.checksums`, `checkpoint.use_compiled`), never traced, lowered and loaded at a
  checkpoint; the checksums saved are those of the jitted function on the saved state."""
  called, jitted = [], checkpoint.sums

  class Watched:
    lower = staticmethod(jitted.lower)

    def __call__(self, tree):
      called.append(tree)
      return jitted(tree)
  monkeypatch.setattr(checkpoint, "sums", Watched())
  monkeypatch.setattr(checkpoint, "_compiled", {})
  c = tiny(**{"train.steps": 10, "train.checkpoint_every": 5, "train.keep_checkpoints": 2})
  with contextlib.redirect_stderr(io.StringIO()):
    train.run(c, tmp_path)
  assert not called, "a checkpoint traced its checksums' program"
  monkeypatch.undo()
  program = program_lib.get(c, 257)
  for step in (5, 10):
    state, meta = checkpoint.Checkpoints(tmp_path / "checkpoints", 2, read_only=True).restore(
        step, program.run_state_like)
    assert meta["checksums"] == checkpoint.checksums(state)


def test_the_step_without_diagnostics_trains_alike_and_the_log_step_measures_it(compiled):
  """Program.train_step (every step) and Program.log_step (the steps the loop logs) compute the
  same state (two compiled programs: XLA may round the update differently at the last bit); the
  log step adds the update and parameter norms as defined before the split: the norm of this
  step's AdamW update and of the parameters after it; and the stability measures (only there)."""
  c = tiny()
  fns = compiled(c)
  program = fns.program
  batch = np.random.default_rng(0).integers(0, 257, (8, 33)).astype(np.int32)
  old = jax.device_get(program.start([c]))
  batch = program.put_batches([batch])
  plain, m_plain = program.train_step(jax.device_put(old, program.shardings), batch)
  logged, m_log = program.log_step(jax.device_put(old, program.shardings), batch)
  for a, b in zip(jax.tree.leaves(plain), jax.tree.leaves(logged)):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-10)
  assert set(m_log) - set(m_plain) == {"update_norm", "param_norm", "train_attn_logit_max",
                                       "train_attn_entropy_min", "train_logz_mean"}
  for k in m_plain:
    np.testing.assert_allclose(m_plain[k], m_log[k], rtol=1e-6)
  _, m_ref = fns.reference(old, batch)  # the definition
  assert {k: float(v) for k, v in m_ref.items()} == {k: float(v) for k, v in m_log.items()}
  new_params = jax.device_get(logged.params)
  updates = jax.tree.map(lambda new, prev: np.float64(new) - np.float64(prev), new_params,
                         old.params)
  np.testing.assert_allclose(m_log["param_norm"], optax.tree.norm(new_params), rtol=1e-6)
  np.testing.assert_allclose(m_log["update_norm"], optax.tree.norm(updates), rtol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("overrides", [{}, {"model.loss_impl": "plain", "model.scan_layers": True},
                                       {"model.kind": "encoder"}])
def test_the_log_steps_stability_measures_are_those_of_its_training_forward(overrides, compiled):
  """`train_attn_logit_max` is the largest pre-softmax attention logit of the step's training
  forward (its key, so its dropout) over layers, `train_logz_mean` the mean logsumexp of its
  output logits over the predicted positions: computed here from the model directly."""
  encoder = overrides.pop("model.kind", None)
  c = tiny_encoder() if encoder else tiny(**overrides)
  c.model.dropout = 0.1
  vocab = 300 if encoder else 257
  fns = compiled(c, vocab)
  state = fns.init(0, c.optim.lr)
  batch = jnp.asarray(np.random.default_rng(0).integers(5, vocab, (c.train.batch_size,
                                                                    c.data.seq_len + 1)), jnp.int32)
  _, m = fns.reference(state, batch)
  key = jax.random.fold_in(state.rng, state.step)
  forward = jax.jit(functools.partial(core.apply, fns.step.objective.model, train=True, stats=True))
  if encoder:
    (inputs, positions, _, weights), dropout_key = core.encoder.masked_batch(
        key, batch, tasks.specials(c), vocab, c.data.mlm_prob, c.data.mlm_mask_frac,
        c.data.mlm_random_frac)
    logits, sown = forward(state.params, inputs, inputs != 0, masked_positions_BP=positions,
                           rngs={"dropout": dropout_key})
    logz = np.sum(jax.nn.logsumexp(logits, -1) * weights) / np.sum(weights)
  else:
    logits, sown = forward(state.params, batch[:, :-1], rngs={"dropout": key})
    logz = np.mean(jax.nn.logsumexp(logits, -1))
  logit_max = max(float(s.logit_max) for s in core.per_layer(sown, core.AttentionStats))
  np.testing.assert_allclose(float(m["train_attn_logit_max"]), logit_max, rtol=1e-5)
  np.testing.assert_allclose(float(m["train_logz_mean"]), float(logz), rtol=1e-5)


@pytest.mark.slow
def test_z_loss_is_trained_but_logged_apart(compiled):
  """With `optim.z_loss`, the step's `train_loss` is still the cross-entropy, `z_loss` is
  z_loss · mean logZ² (both every step), and the gradient is that of their sum."""
  c = tiny(**{"optim.z_loss": 0.05})
  batch = jnp.asarray(np.random.default_rng(0).integers(0, 257, (8, 33)), jnp.int32)
  fns, off = compiled(c), compiled(tiny())
  state = jax.device_get(fns.init(0, c.optim.lr))
  run_metrics = lambda program: program.train_step(
      program.stack([state]), program.put_batches([batch]))[1]
  m, m_off = run_metrics(fns.program), run_metrics(off.program)
  key = jax.random.fold_in(state.rng, state.step)
  logits, _ = jax.jit(functools.partial(core.apply, fns.step.objective.model, train=True))(
      state.params, batch[:, :-1], rngs={"dropout": key})
  np.testing.assert_allclose(float(m["z_loss"]),
                             0.05 * float(np.mean(jax.nn.logsumexp(logits, -1) ** 2)), rtol=1e-5)
  np.testing.assert_allclose(float(m["train_loss"]), float(m_off["train_loss"]), rtol=1e-6)
  assert "z_loss" not in m_off
  assert abs(float(m["grad_norm"]) - float(m_off["grad_norm"])) > 1e-6 * float(m_off["grad_norm"])

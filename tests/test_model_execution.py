"""How the model executes, not what it computes: scan over layers, remat, bfloat16 compute and
the attention implementation (`Execution`, actlab/core/model.py) all give the same
function."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax.traverse_util import unflatten_dict

from actlab import config as config_lib
from actlab import core, tasks
from actlab.measure import evaluators, histogram
from actlab.core import kernels
from actlab.core import model as model_lib
from actlab.hf import mapping
from actlab.run import program
from conftest import DEEP, tiny, tiny_encoder


def relative_error(a, b):
  return float(optax.tree.norm(jax.tree.map(lambda x, y: x - y, a, b)) / optax.tree.norm(a))


def loss_and_grads(c, params, batch):
  step_fns = program.create_step(c, 257)
  f = lambda p: step_fns.objective(p, batch, jax.random.PRNGKey(0),
                                   train=True).loss_sum
  return jax.jit(jax.value_and_grad(f))(params)


def config_of(kind):
  """Two blocks: scan and remat over layers, statistics per layer."""
  return tiny(**DEEP) if kind == "decoder" else tiny_encoder(**{"model.dropout": 0.0, **DEEP})


@pytest.fixture(scope="module")
def references():
  """kind ("decoder", "encoder") → the initial parameters of its tiny config, a batch, and their
  loss and gradients by the per-layer model without remat: once for all the tests of a kind."""
  made = {}

  def get(kind):
    if kind not in made:
      c = config_of(kind)
      batch = jnp.asarray(np.random.default_rng(1).integers(0, 257, (8, 33)), jnp.int32)
      params = jax.jit(program.create_step(c, 257).init)(0).params
      made[kind] = params, batch, loss_and_grads(c, params, batch)
    return made[kind]
  return get


@pytest.mark.slow
@pytest.mark.parametrize("remat, kind", [("none", "decoder"), ("full", "decoder"),
                                         ("dots", "decoder"), ("full", "encoder")])
def test_scan_and_remat_compute_the_same_function(references, remat, kind):
  """Each remat policy, then scan over layers too, computes the reference's loss and gradients.
  The policies and the scan are the decoder's and the encoder's shared code
  (model.stack): every policy on the decoder; the encoder (no causal mask, a
  padding mask through remat and scan, BERT's names) under one."""
  c = config_of(kind)
  params, batch, ref = references(kind)
  c.model.remat = remat
  if remat != "none":  # Else this model is the reference's.
    got = loss_and_grads(c, params, batch)
    assert abs(float(got[0] - ref[0])) <= 1e-6 * float(ref[0])
    assert relative_error(ref[1], got[1]) <= 1e-6
  c.model.scan_layers = True
  scan_params = mapping.scanned_layout(params)
  like = jax.eval_shape(program.create_step(c, 257).init, 0).params
  assert jax.tree.structure(scan_params) == jax.tree.structure(like)
  if kind == "encoder":  # BERT's names hold for the scanned layout too, both ways.
    padded = core.pad_vocab(257)  # every row written
    state = mapping.to_hf("bert", params, padded)
    assert {k: v.tolist() for k, v in mapping.to_hf("bert", scan_params, padded).items()} == {
        k: v.tolist() for k, v in state.items()}
    back = unflatten_dict(mapping.gather("bert", state, params)[0])
    jax.tree.map(np.testing.assert_array_equal, mapping.scanned_layout(back), scan_params)
  got = loss_and_grads(c, scan_params, batch)
  assert abs(float(got[0] - ref[0])) <= 1e-5 * float(ref[0])
  assert relative_error(mapping.scanned_layout(ref[1]), got[1]) <= 1e-5


def hlo_size(c):
  step_fns = program.create_step(c, 257)
  state = jax.eval_shape(step_fns.init, 0)
  batch = jax.ShapeDtypeStruct((c.train.batch_size, c.data.seq_len + 1), jnp.int32)
  return len(jax.jit(step_fns.train_step).lower(state, batch).as_text())


@pytest.mark.slow
def test_scan_keeps_the_program_size_independent_of_depth(tiny_config):
  sizes = {}
  for scan in (False, True):
    for num_layers in (2, 8):
      tiny_config.model.update(scan_layers=scan, num_layers=num_layers)
      sizes[scan, num_layers] = hlo_size(tiny_config)
  assert sizes[False, 8] > 2.5 * sizes[False, 2]
  assert sizes[True, 8] < 1.1 * sizes[True, 2]


@pytest.mark.slow
def test_remat_marks_every_block_for_recomputation(tiny_config):
  """Remat shows in the traced program as one `remat` (jax.checkpoint) per block, or one in
  the scanned body. XLA:CPU compiles the recomputation away (it drops the optimization
  barriers), so on CPU memory does not change; on GPU/TPU it keeps XLA from saving the blocks'
  activations (not measured here)."""
  c = tiny_config
  c.model.num_layers = 3
  counts = {}
  for scan in (False, True):
    for remat in ("none", "full", "dots"):
      c.model.update(scan_layers=scan, remat=remat)
      step_fns = program.create_step(c, 257)
      state = jax.eval_shape(step_fns.init, 0)
      batch = jax.ShapeDtypeStruct((8, 33), jnp.int32)
      text = str(jax.make_jaxpr(step_fns.train_step)(state, batch))
      counts[scan, remat] = text.count("remat")
  assert counts[False, "none"] == counts[True, "none"] == 0
  assert counts[False, "full"] == counts[False, "dots"] == 3
  assert counts[True, "full"] == counts[True, "dots"] == 1


@pytest.mark.slow
def test_scanned_model_sows_statistics_per_layer(references):
  c = config_of("decoder")
  batch = jnp.asarray(np.random.default_rng(2).integers(0, 257, (8, 33)), jnp.int32)
  out = {}
  for scan in (False, True):
    c.model.scan_layers = scan
    step_fns = program.create_step(c, 257)
    params = mapping.scanned_layout(out[False][1]) if scan else references("decoder")[0]
    evals = evaluators.Evaluators.create(c.metrics, c.train.steps)
    stats = jax.jit(functools.partial(evals.validation_step, step_fns))(params, batch)
    out[scan] = (evals.pool([jax.device_get(stats)]), params)
  assert set(out[False][0]) == set(out[True][0])
  assert any(k.startswith("ffn_preact/layer_1") for k in out[True][0])  # histograms per layer
  for k, v in out[False][0].items():
    w = out[True][0][k]
    if isinstance(v, histogram.Histogram):  # the same entries, up to one rounding at a bin edge
      assert v.num == w.num and np.abs(v.counts - w.counts).sum() <= 2, k
      assert abs(v.sum - w.sum) <= 1e-4 * max(1.0, abs(v.sum)), k
    else:
      assert abs(v - w) <= 1e-5 * max(1.0, abs(v)), k


@pytest.mark.slow
def test_bfloat16_computes_in_bf16_and_keeps_float32_state(tiny_config):
  c = tiny_config
  batch = jnp.asarray(np.random.default_rng(3).integers(0, 257, (8, 33)), jnp.int32)
  ref_steps = program.create_step(c, 257)
  state = jax.jit(ref_steps.init)(0)
  _, ref_metrics = jax.jit(ref_steps.train_step)(state, batch)
  c.model.dtype = "bfloat16"
  step_fns = program.create_step(c, 257)
  hidden, logits = (jax.eval_shape(functools.partial(step_fns.objective.model.apply, method=method),
                                   {"params": state.params}, batch[:, :-1])
                    for method in ("hidden", None))
  assert hidden.dtype == jnp.bfloat16 and logits.dtype == jnp.float32
  new, metrics = jax.jit(step_fns.train_step)(state, batch)
  dtypes = {x.dtype for x in jax.tree.leaves((new.params, new.opt_state))}
  assert dtypes <= {jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)}, dtypes
  assert metrics["train_loss"].dtype == jnp.float32
  assert abs(float(metrics["train_loss"] - ref_metrics["train_loss"])) < 0.02 * float(
      ref_metrics["train_loss"])
  assert float(metrics["train_loss"]) != float(ref_metrics["train_loss"])  # really bf16 compute


def test_attention_auto_picks_cudnn_only_where_it_applies(monkeypatch):
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  assert kernels.attention_impl("auto", jnp.bfloat16, 64) == "xla"
  assert kernels.why_not_cudnn(jnp.bfloat16, 64) == "cuDNN needs a GPU (the backend is cpu)"
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert kernels.attention_impl("auto", jnp.bfloat16, 64) == "cudnn"
  assert kernels.attention_impl("auto", jnp.float16, 128) == "cudnn"
  assert kernels.attention_impl("auto", jnp.bfloat16, 64, (128, 128)) == "cudnn"
  assert kernels.attention_impl("auto", jnp.float32, 64) == "xla"
  assert kernels.attention_impl("auto", jnp.bfloat16, 256) == "xla"
  assert kernels.attention_impl("auto", jnp.bfloat16, 60) == "xla"
  assert kernels.attention_impl("auto", jnp.bfloat16, 64, (1, 128)) == "xla"  # a decode step


def test_attention_impl_is_decided_up_front_and_says_why(monkeypatch):
  """An explicit "cudnn" that cannot run is an error naming the cause, before any trace: on a
  CPU, through the model too. "auto" falling back to XLA on a GPU says why, once per cause."""
  monkeypatch.setattr(jax, "default_backend", lambda: "cpu")
  with pytest.raises(ValueError, match="'cudnn' cannot run: cuDNN needs a GPU"):
    kernels.attention_impl("cudnn", jnp.bfloat16, 64)
  c = tiny(**{"model.attention_impl": "cudnn", "model.dtype": "bfloat16"})
  with pytest.raises(ValueError, match="cuDNN needs a GPU"):
    jax.eval_shape(program.create_step(c, 257).init, 0)
  said = []
  monkeypatch.setattr(kernels.logging, "warning", said.append)
  kernels._warn_once.cache_clear()
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  with pytest.raises(ValueError, match="cuDNN needs bfloat16 or float16"):
    kernels.attention_impl("cudnn", jnp.float32, 64)
  for _ in range(2):
    assert kernels.attention_impl("auto", jnp.float32, 48) == "xla"
  assert said == ["model.attention_impl='auto' runs XLA attention: cuDNN needs bfloat16 or "
                  "float16 (the compute dtype is float32)"]


def test_cudnn_attention_sows_the_logit_max_only_in_evaluation(monkeypatch):
  """cuDNN flash attention never forms the logits: under it the training forward sows no
  `AttentionStats` (its log row has no `train_attn_logit_max`) and evaluation sows the XLA
  formulation's. (On a CPU, XLA attention stands in for cuDNN's.)"""
  c = tiny(**{"model.attention_impl": "auto"})  # cuDNN where it can run
  model = tasks.get(c).objective(config_lib.typed(c), 257).model
  tokens = jnp.asarray(np.random.default_rng(5).integers(0, 257, (2, 16)), jnp.int32)
  params = model.init(jax.random.PRNGKey(0), tokens)["params"]
  logit_maxes = lambda sown: [float(s.logit_max)
                              for s in core.per_layer(sown, core.AttentionStats)]
  xla = logit_maxes(core.apply(model, params, tokens, stats=True)[1])
  monkeypatch.setattr(kernels, "attention_impl", lambda *args: "cudnn")
  monkeypatch.setattr(kernels, "cudnn_attention",
                      lambda *args, causal: model_lib.xla_attention(*args, causal=causal)[0])
  assert logit_maxes(core.apply(model, params, tokens, stats=True)[1]) == xla
  assert len(xla) == c.model.num_layers
  _, sown = core.apply(model, params, tokens, train=True, rngs={"dropout": jax.random.PRNGKey(1)},
                         stats=True)
  assert logit_maxes(sown) == [] and core.per_layer(sown, core.FFNStats)
  assert set(core.step.stability(core.Sums(1.0, 2, 0.0, logz_sum=3.0, sown=sown))) == {
      "train_logz_mean"}

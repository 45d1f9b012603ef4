"""The benchmark harness: FLOP formula (hand counts and the real parameter tree), the peak table,
the fused LM-head loss against the plain one, and a short end-to-end `bench.run`."""

import importlib.util
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from actlab import bench, flops, kernels, models, train
from conftest import REPO, tiny


def model_cfg(**kw):
  c = tiny()
  c.model.update(**kw)
  return c


def test_flops_hand_count_plain_ffn():
  # D=8, F=32, 2 layers, V=64, L=4. Per block: q,k,v,out 4·8·8 = 256, up+down 2·8·32 = 512.
  c = model_cfg(num_layers=2, d_model=8, num_heads=2, d_ff=32, activation="gelu")
  f = flops.per_token(c.model, seq_len=4, vocab_size=64)
  assert f.matmul_params == 2 * (256 + 512) + 64 * 8          # blocks + tied head = 2048
  assert f.block_matmul == 6 * 2 * 768 and f.head_matmul == 6 * 512
  assert f.attention == 12 * 4 * 8 * 2                        # 12·L·D·layers = 768
  assert f.total == 6 * 2048 + 768 == 13056


def test_flops_gated_ffn_counts_three_matrices_at_its_width():
  # swiglu, d_ff 96 → F = round(2/3·96 / 64)·64 = 64; up, gate, down: 3·8·64 = 1536.
  c = model_cfg(num_layers=1, d_model=8, num_heads=2, d_ff=96, activation="swiglu")
  f = flops.per_token(c.model, seq_len=4, vocab_size=60)      # V padded to 64
  assert f.matmul_params == (4 * 64 + 3 * 8 * 64) + 64 * 8
  c.model.gated_match_params = False                          # then F = d_ff = 96
  assert flops.per_token(c.model, 4, 60).matmul_params == (4 * 64 + 3 * 8 * 96) + 64 * 8


def test_flops_encoder_mlm_head_runs_at_masked_positions_only():
  c = model_cfg(num_layers=1, d_model=8, num_heads=2, d_ff=32, activation="relu")
  c.model.kind = "encoder"
  f = flops.per_token(c.model, seq_len=20, vocab_size=64, mlm_prob=0.15)  # P = 3 of 20
  assert f.head_matmul == pytest.approx(6 * (8 * 8 + 64 * 8) * 3 / 20)
  assert f.block_matmul == 6 * (4 * 64 + 2 * 8 * 32)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_flops_matmul_params_match_the_model(activation):
  """N of 6·N = every 2-D kernel of the real parameter tree + the tied head (V·D)."""
  c = model_cfg(activation=activation, d_ff=96)
  task = train.Task.create(c, 257)
  params = jax.eval_shape(task.init, 0).params
  kernels_ = sum(int(np.prod(x.shape)) for path, x in jax.tree_util.tree_leaves_with_path(params)
                 if path[-1].key == "kernel")
  V, D = models.pad_vocab(257), c.model.d_model
  assert params["wte"]["embedding"].shape == (V, D)
  assert flops.for_config(c, 257).matmul_params == kernels_ + V * D


def test_flops_forward_agrees_with_xla_cost_analysis():
  """A third of the training matmul FLOPs is the forward pass; XLA counts the forward's dots
  (plus a little elementwise work) independently of our formula."""
  c = model_cfg(num_layers=2, d_model=64, num_heads=4, d_ff=256, activation="relu", max_len=64)
  c.data.seq_len = 64
  task = train.Task.create(c, 257)
  params = jax.eval_shape(task.init, 0).params
  tokens = jax.ShapeDtypeStruct((4, 64), jnp.int32)
  cost = jax.jit(lambda p, t: task.model.apply({"params": p}, t)).lower(params, tokens).compile()
  analysis = cost.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, list) else analysis
  xla = analysis["flops"]
  ours = flops.for_config(c, 257).total / 3 * 4 * 64
  assert ours <= xla <= 1.15 * ours, (ours, xla)


def test_peak_table():
  assert bench.peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16")[0] == 989
  assert bench.peak_tflops("NVIDIA H200", "bfloat16")[0] == 989
  assert bench.peak_tflops("NVIDIA H100 PCIe", "bfloat16")[0] == 756
  assert bench.peak_tflops("NVIDIA A100-SXM4-80GB", "bfloat16")[0] == 312
  assert bench.peak_tflops("TPU v4", "bfloat16")[0] == 275
  assert bench.peak_tflops("TPU v5 lite", "bfloat16")[0] == 197
  assert bench.peak_tflops("TPU v5p", "bfloat16")[0] == 459
  assert bench.peak_tflops("TPU v6 lite", "bfloat16")[0] == 918
  assert bench.peak_tflops("cpu", "float32") == (None, "unknown peak")


# --- The fused LM-head cross-entropy ----------------------------------------------------------

def _plain(h, E, t, w=None):
  logits = jnp.einsum("bld,vd->blv", h, E.astype(h.dtype), preferred_element_type=jnp.float32)
  losses = optax.softmax_cross_entropy_with_integer_labels(logits, t)
  return (losses if w is None else losses * w).sum()


def _inputs(B=4, L=8, D=16, V=96, seed=0, dtype=jnp.float32):
  r = np.random.default_rng(seed)
  return (jnp.asarray(r.normal(size=(B, L, D)), dtype), jnp.asarray(r.normal(size=(V, D)) * 0.3,
          jnp.float32), jnp.asarray(r.integers(0, V, (B, L)), jnp.int32),
          jnp.asarray(r.uniform(size=(B, L)) > 0.3, jnp.float32))


def _rel(a, b):
  return float(optax.tree.norm(jax.tree.map(lambda x, y: x - y, a, b)) / optax.tree.norm(a))


@pytest.mark.parametrize("chunk", [1, 2, 8])
@pytest.mark.parametrize("weighted", [False, True])
def test_fused_xent_equals_plain(chunk, weighted):
  h, E, t, w = _inputs()
  w = w if weighted else None
  ref, ref_g = jax.value_and_grad(_plain, argnums=(0, 1))(h, E, t, w)
  f = lambda h, E: kernels.xent_sum(h, E, t, w, chunk=chunk)
  val, g = jax.jit(jax.value_and_grad(f, argnums=(0, 1)))(h, E)
  assert abs(float(val - ref)) <= 1e-5 * abs(float(ref))
  assert _rel(ref_g, g) <= 1e-5
  assert abs(float(jax.jit(f)(h, E) - ref)) <= 1e-5 * abs(float(ref))  # forward-only path


def test_fused_xent_second_order_and_vmap():
  h, E, t, _ = _inputs()
  v = jax.tree.map(lambda x: jnp.ones_like(x) * 0.01, (h, E))
  hvp = lambda f: jax.jvp(jax.grad(lambda a: f(*a)), ((h, E),), (v,))[1]  # the sharpness HVP
  ref = hvp(lambda h, E: _plain(h, E, t))
  got = hvp(lambda h, E: kernels.xent_sum(h, E, t, chunk=2))
  assert _rel(ref, got) <= 1e-5
  hs = jnp.stack([h, 2 * h])
  per_run = jax.vmap(jax.grad(lambda h: kernels.xent_sum(h, E, t, chunk=4)))(hs)
  assert _rel(jax.grad(lambda h: _plain(h, E, t))(2 * h), per_run[1]) <= 1e-5


def test_fused_xent_bfloat16_keeps_float32_statistics():
  h, E, t, _ = _inputs(dtype=jnp.bfloat16)
  val = kernels.xent_sum(h, E, t, chunk=4)
  assert val.dtype == jnp.float32
  ref = _plain(h, E, t)  # the same bf16 operands, float32 logits
  assert abs(float(val - ref)) <= 1e-5 * abs(float(ref))
  g = jax.grad(lambda h, E: kernels.xent_sum(h, E, t), argnums=(0, 1))(h, E)
  assert g[0].dtype == jnp.bfloat16 and g[1].dtype == jnp.float32


def test_chunk_length_divides_and_fits():
  assert kernels.chunk_length(32, 128, 50304, budget=1 << 22) == 2
  assert kernels.chunk_length(32, 128, 50304, budget=1 << 25) == 16
  assert kernels.chunk_length(16, 128, 320, budget=1 << 22) == 128
  assert kernels.chunk_length(7, 100, 10**9, budget=10) == 1
  with pytest.raises(ValueError, match="divide"):
    kernels.xent_sum(*_inputs()[:3], chunk=3)


def test_decoder_loss_impls_agree(tiny_config):
  c = tiny_config
  batch = jnp.asarray(np.random.default_rng(0).integers(0, 257, (8, 33)), jnp.int32)
  out = {}
  for impl in ("plain", "fused"):
    c.model.loss_impl = impl
    task = train.Task.create(c, 257)
    params = jax.jit(task.init)(0).params
    f = lambda p: task.objective(task.model, p, batch, jax.random.PRNGKey(0), train=True)
    out[impl] = jax.jit(jax.value_and_grad(lambda p: f(p)["loss_sum"]))(params)
  assert abs(float(out["plain"][0] - out["fused"][0])) <= 1e-5 * float(out["plain"][0])
  assert _rel(out["plain"][1], out["fused"][1]) <= 1e-5


# --- The harness end to end -------------------------------------------------------------------

def test_bench_run_reports_every_field(tiny_config):
  rows = bench.run(tiny_config, steps=2, warmup=1, peak=1.0)
  (r,) = rows
  assert r["tokens_per_step"] == 8 * 32 and r["tokens_per_s"] > 0 and r["compile_s"] > 0
  assert r["flops_per_token"] == flops.for_config(tiny_config, 257).total
  assert r["mfu"] == pytest.approx(r["tflops"] / 1.0)
  assert r["env"]["versions"]["jax"] == jax.__version__
  assert "actlab.bench" in r["env"]["command"]
  row = bench.markdown_rows(rows)
  assert row.startswith("| CPU") and row.count("|") == 13
  # No peak for a CPU: no MFU claimed.
  assert bench.run(tiny_config, steps=1, warmup=1)[0]["mfu"] is None


def test_bench_vectorized_runs(tiny_config):
  (r,) = bench.run(tiny_config, steps=1, warmup=1, runs=3)
  assert r["runs"] == 3 and r["tokens_per_step"] == 3 * 8 * 32


def test_torch_reference_is_the_same_model(tiny_config):
  pytest.importorskip("torch")
  spec = importlib.util.spec_from_file_location("torch_ref", REPO / "benchmarks" / "torch_ref.py")
  torch_ref = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(torch_ref)
  for act in ("gelu", "swiglu"):
    c = tiny_config
    c.model.activation = act
    tb = bench.TorchBench(c)
    trainer = torch_ref.Trainer({**tb.spec, "threads": 1})
    task = train.Task.create(c, 257)
    assert trainer.params == models.count_params(task.init(0).params)["total"], act
    loss = trainer.step()
    assert abs(loss - math.log(tb.spec["vocab"])) < 0.5  # starts near uniform, like actlab


# --- Execution options: scan over layers, remat, bfloat16, attention implementation ----------

def _loss_and_grads(c, params, batch):
  task = train.Task.create(c, 257)
  f = lambda p: task.objective(task.model, p, batch, jax.random.PRNGKey(0), train=True)["loss_sum"]
  return jax.jit(jax.value_and_grad(f))(params)


def _to_scan(params, layers):
  blocks = [params[f"block_{i}"] for i in range(layers)]
  out = {k: v for k, v in params.items() if not k.startswith("block_")}
  out["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *blocks)
  return out


@pytest.mark.parametrize("remat", ["none", "full", "dots"])
def test_scan_and_remat_compute_the_same_function(tiny_config, remat):
  c = tiny_config
  batch = jnp.asarray(np.random.default_rng(1).integers(0, 257, (8, 33)), jnp.int32)
  params = jax.jit(train.Task.create(c, 257).init)(0).params
  ref = _loss_and_grads(c, params, batch)
  c.model.remat = remat
  got = _loss_and_grads(c, params, batch)
  assert abs(float(got[0] - ref[0])) <= 1e-6 * float(ref[0]) and _rel(ref[1], got[1]) <= 1e-6
  c.model.scan_layers = True
  scan_params = _to_scan(params, c.model.num_layers)
  assert jax.tree.structure(scan_params) == jax.tree.structure(
      jax.eval_shape(train.Task.create(c, 257).init, 0).params)
  got = _loss_and_grads(c, scan_params, batch)
  assert abs(float(got[0] - ref[0])) <= 1e-5 * float(ref[0])
  assert _rel(_to_scan(ref[1], c.model.num_layers), got[1]) <= 1e-5


def _hlo_size(c):
  task = train.Task.create(c, 257)
  state = jax.eval_shape(task.init, 0)
  batch = jax.ShapeDtypeStruct((c.train.batch_size, c.data.seq_len + 1), jnp.int32)
  return len(jax.jit(task.train_step).lower(state, batch).as_text())


def test_scan_keeps_the_program_size_independent_of_depth(tiny_config):
  sizes = {}
  for scan in (False, True):
    for layers in (2, 8):
      tiny_config.model.update(scan_layers=scan, num_layers=layers)
      sizes[scan, layers] = _hlo_size(tiny_config)
  assert sizes[False, 8] > 2.5 * sizes[False, 2]
  assert sizes[True, 8] < 1.1 * sizes[True, 2]


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
      task = train.Task.create(c, 257)
      state = jax.eval_shape(task.init, 0)
      batch = jax.ShapeDtypeStruct((8, 33), jnp.int32)
      text = str(jax.make_jaxpr(task.train_step)(state, batch))
      counts[scan, remat] = text.count("remat")
  assert counts[False, "none"] == counts[True, "none"] == 0
  assert counts[False, "full"] == counts[False, "dots"] == 3
  assert counts[True, "full"] == counts[True, "dots"] == 1


def test_scanned_model_sows_statistics_per_layer(tiny_config):
  c = tiny_config
  batch = jnp.asarray(np.random.default_rng(2).integers(0, 257, (8, 33)), jnp.int32)
  out = {}
  for scan in (False, True):
    c.model.scan_layers = scan
    task = train.Task.create(c, 257)
    params = jax.jit(task.init)(0).params
    if scan:
      params = _to_scan(out[False][1], c.model.num_layers)
    stats = jax.jit(lambda p, b: task.eval_step(p, b, stats=True))(params, batch)
    out[scan] = (train.evaluate_metrics(lambda p, b: stats, None, [batch]), params)
  assert set(out[False][0]) == set(out[True][0])
  for k, v in out[False][0].items():
    assert abs(v - out[True][0][k]) <= 1e-5 * max(1.0, abs(v)), k


def test_bfloat16_computes_in_bf16_and_keeps_float32_state(tiny_config):
  c = tiny_config
  batch = jnp.asarray(np.random.default_rng(3).integers(0, 257, (8, 33)), jnp.int32)
  ref_task = train.Task.create(c, 257)
  state = jax.jit(ref_task.init)(0)
  _, ref_metrics = jax.jit(ref_task.train_step)(state, batch)
  c.model.dtype = "bfloat16"
  task = train.Task.create(c, 257)
  hidden = task.model.apply({"params": state.params}, batch[:, :-1], head=False)
  logits = task.model.apply({"params": state.params}, batch[:, :-1])
  assert hidden.dtype == jnp.bfloat16 and logits.dtype == jnp.float32
  new, metrics = jax.jit(task.train_step)(state, batch)
  dtypes = {x.dtype for x in jax.tree.leaves((new.params, new.opt_state))}
  assert dtypes <= {jnp.dtype(jnp.float32), jnp.dtype(jnp.int32)}, dtypes
  assert metrics["train_loss"].dtype == jnp.float32
  assert abs(float(metrics["train_loss"] - ref_metrics["train_loss"])) < 0.02 * float(
      ref_metrics["train_loss"])
  assert float(metrics["train_loss"]) != float(ref_metrics["train_loss"])  # really bf16 compute


def test_attention_auto_picks_cudnn_only_where_it_applies(monkeypatch):
  from actlab.models import layers
  assert layers.attention_impl("auto", jnp.bfloat16, 64) == "xla"  # CPU
  assert layers.attention_impl("cudnn", jnp.float32, 64) == "cudnn"  # explicit wins
  monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
  assert layers.attention_impl("auto", jnp.bfloat16, 64) == "cudnn"
  assert layers.attention_impl("auto", jnp.float16, 128) == "cudnn"
  assert layers.attention_impl("auto", jnp.float32, 64) == "xla"
  assert layers.attention_impl("auto", jnp.bfloat16, 256) == "xla"
  assert layers.attention_impl("auto", jnp.bfloat16, 60) == "xla"


def test_attention_auto_falls_back_to_xla_when_cudnn_refuses(monkeypatch):
  """On this CPU a forced "cudnn" choice fails at trace time; "auto" must then use XLA."""
  from actlab.models import layers
  r = np.random.default_rng(4)
  q, k, v = (jnp.asarray(r.normal(size=(2, 8, 2, 16)), jnp.bfloat16) for _ in range(3))
  ref = layers.attend(q, k, v, None, True, "xla")
  monkeypatch.setattr(layers, "attention_impl", lambda *a: "cudnn")
  with pytest.raises(Exception):
    layers.attend(q, k, v, None, True, "cudnn")
  assert jnp.array_equal(layers.attend(q, k, v, None, True, "auto"), ref)

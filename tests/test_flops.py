"""FLOPs per token (actlab/measure/flops.py): hand counts, the real parameter tree, and XLA's own count."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actlab import core
from actlab import config as config_lib
from actlab.measure import flops
from actlab.run import program
from conftest import tiny


def model_cfg(seq_len=32, **kw):
  c = tiny()
  c.model.update(**kw)
  c.data.seq_len = seq_len
  return c


def test_flops_hand_count_plain_ffn():
  # D=8, F=32, 2 layers, V=64, L=4. Per block: q,k,v,out 4·8·8 = 256, up+down 2·8·32 = 512.
  c = model_cfg(seq_len=4, num_layers=2, d_model=8, num_heads=2, d_ff=32, activation="gelu")
  f = flops.for_config(c, vocab_size=64)
  assert f.matmul_params == 2 * (256 + 512) + 64 * 8          # blocks + tied head = 2048
  assert f.block_matmul == 6 * 2 * 768 and f.head_matmul == 6 * 512
  assert f.attention == 12 * 4 * 8 * 2                        # 12·L·D·layers = 768
  assert f.total == 6 * 2048 + 768 == 13056


def test_flops_gated_ffn_counts_three_matrices_at_its_width():
  # swiglu, d_ff 96 → F = round(2/3·96 / 64)·64 = 64; up, gate, down: 3·8·64 = 1536.
  c = model_cfg(seq_len=4, num_layers=1, d_model=8, num_heads=2, d_ff=96, activation="swiglu")
  f = flops.for_config(c, vocab_size=60)                      # V padded to 64
  assert f.matmul_params == (4 * 64 + 3 * 8 * 64) + 64 * 8
  c.model.gated_match_params = False                          # then F = d_ff = 96
  assert flops.for_config(c, 60).matmul_params == (4 * 64 + 3 * 8 * 96) + 64 * 8


def test_flops_encoder_mlm_head_runs_at_masked_positions_only():
  c = config_lib.encoder("relu")
  c.model.update(num_layers=1, d_model=8, num_heads=2, d_ff=32)
  c.data.update(seq_len=20, mlm_prob=0.15)
  f = flops.for_config(c, vocab_size=64)                      # P = 3 of 20
  assert f.head_matmul == pytest.approx(6 * (8 * 8 + 64 * 8) * 3 / 20)
  assert f.block_matmul == 6 * (4 * 64 + 2 * 8 * 32)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
def test_flops_matmul_params_match_the_model(activation):
  """N of 6·N = every 2-D kernel of the real parameter tree + the tied head (V·D)."""
  c = model_cfg(activation=activation, d_ff=96)
  step_fns = program.create_step(c, 257)
  params = jax.eval_shape(step_fns.init, 0).params
  kernels_ = sum(int(np.prod(x.shape)) for path, x in jax.tree_util.tree_leaves_with_path(params)
                 if path[-1].key == "kernel")
  V, D = core.pad_vocab(257), c.model.d_model
  assert params["wte"]["embedding"].shape == (V, D)
  assert flops.for_config(c, 257).matmul_params == kernels_ + V * D


def test_flops_forward_agrees_with_xla_cost_analysis():
  """A third of the training matmul FLOPs is the forward pass; XLA counts the forward's dots
  (plus a little elementwise work) independently of our formula. Compiled for the CPU on any
  host: XLA:GPU hands the dots to cuBLAS, whose calls its cost analysis leaves out (1.9 of 69
  MFLOP counted on an H200)."""
  c = model_cfg(seq_len=64, num_layers=2, d_model=64, num_heads=4, d_ff=256, activation="relu",
                max_len=64)
  step_fns = program.create_step(c, 257)
  cpu = jax.sharding.SingleDeviceSharding(jax.devices("cpu")[0])
  on_cpu = lambda s: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=cpu)  # noqa: E731
  params = jax.tree.map(on_cpu, jax.eval_shape(step_fns.init, 0).params)
  tokens = on_cpu(jax.ShapeDtypeStruct((4, 64), jnp.int32))
  cost = jax.jit(lambda p, t: step_fns.objective.model.apply({"params": p}, t)).lower(params,
                                                                           tokens).compile()
  analysis = cost.cost_analysis()
  analysis = analysis[0] if isinstance(analysis, list) else analysis
  xla = analysis["flops"]
  ours = flops.for_config(c, 257).total / 3 * 4 * 64
  assert ours <= xla <= 1.15 * ours, (ours, xla)

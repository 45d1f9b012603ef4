"""How the model runs, not what it computes: `Execution` (compute dtype, attention implementation,
scan over layers, rematerialisation) and the implementations it chooses. Every choice computes the
same function up to rounding (tests/test_model_execution.py); a reader of the architecture
(transformer.py) can skip this file.
"""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections


def config_fields(cls, model: ml_collections.ConfigDict) -> dict:
  """The fields of dataclass `cls` that `config.model` sets."""
  names = {f.name for f in dataclasses.fields(cls)}
  return {k: v for k, v in model.to_dict().items() if k in names}


@dataclasses.dataclass(frozen=True)
class Execution:
  """The execution settings of `config.model`. The decoder's loss implementation
  (`model.loss_impl`) is its task's choice: tasks/causal_lm.py."""
  dtype: str = "float32"        # compute dtype; parameters stay float32
  attention_impl: str = "xla"   # "xla", "cudnn" or "auto" (`attention_impl`)
  scan_layers: bool = False     # one nn.scan over the blocks (`transformed_stack`)
  remat: str = "none"           # recompute in the backward pass: "none", "full", "dots"

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict) -> "Execution":
    return cls(**config_fields(cls, model))

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)


# --- Attention ----------------------------------------------------------------------------------


def attention_impl(requested: str, dtype, head_dim: int) -> str:
  """"auto" takes cuDNN flash attention on an NVIDIA GPU where it applies (bfloat16/float16,
  head dim a multiple of 8 up to 128) and XLA's otherwise (float32, CPU, TPU)."""
  if requested != "auto":
    return requested
  ok = (jax.default_backend() == "gpu" and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16)
        and head_dim % 8 == 0 and head_dim <= 128)
  return "cudnn" if ok else "xla"


def attend(xla, q_BHLK, k_BHTK, v_BHTK, mask, *, causal: bool, impl: str):
  """Attention by `impl`: "xla" is `xla(q, k, v, mask, causal=causal)` (the formulation written
  out in transformer.py); "cudnn" is `jax.nn.dot_product_attention`'s cuDNN flash attention
  (sequence-major inputs); "auto" falls back to XLA when cuDNN refuses the call (it checks
  shapes, masks and the GPU at trace time)."""
  if attention_impl(impl, q_BHLK.dtype, q_BHLK.shape[-1]) == "xla":
    return xla(q_BHLK, k_BHTK, v_BHTK, mask, causal=causal)
  to_BLHK = lambda x: x.transpose(0, 2, 1, 3)
  cudnn = lambda: to_BLHK(jax.nn.dot_product_attention(
      to_BLHK(q_BHLK), to_BLHK(k_BHTK), to_BLHK(v_BHTK), mask=mask, is_causal=causal,
      implementation="cudnn"))
  if impl == "auto":
    try:
      return cudnn()
    except Exception:  # noqa: BLE001 -- any refusal means: not this shape/GPU; use XLA.
      return xla(q_BHLK, k_BHTK, v_BHTK, mask, causal=causal)
  return cudnn()


# --- The stack under scan and remat -------------------------------------------------------------


REMAT_POLICIES = {
    "full": None,  # keep only each block's input; recompute everything else
    "dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,  # keep matmul outputs
}


def transformed_stack(block_call, spec, ex: Execution, x_BLD, mask_BL=None, *, causal: bool,
                      train: bool = False, decode: bool = False):
  """The blocks under `ex.remat` (`nn.remat` around each: "full" keeps only the block's input for
  the backward pass, "dots" also its matmul outputs) and/or `ex.scan_layers` (one `nn.scan` over
  a single traced block: parameters, sown statistics and the decoding cache under `blocks` with a
  leading layer axis; compile time no longer grows with depth; the same function, but another
  random initialisation for a given seed, as per-layer keys are split differently).

  `block_call` is a block class called as `(x, mask)`, with `train`, `decode` and `scanned` as
  attributes (transformer.BlockCall): `nn.scan` and `nn.remat` trace their arguments, and those
  flags must stay Python values."""
  cls = block_call
  if ex.remat != "none":
    cls = nn.remat(cls, policy=REMAT_POLICIES[ex.remat], prevent_cse=not ex.scan_layers)
  if not ex.scan_layers:
    for i in range(spec.num_layers):
      block = cls(spec, causal=causal, execution=ex, layer=i, train=train, decode=decode,
                  name=f"block_{i}")
      x_BLD = block(x_BLD, mask_BL)
    return x_BLD
  scanned = nn.scan(cls, variable_axes={"params": 0, "stats": 0, "cache": 0},
                    split_rngs={"params": True, "dropout": True}, in_axes=(nn.broadcast,),
                    length=spec.num_layers)
  block = scanned(spec, causal=causal, execution=ex, train=train, decode=decode, scanned=True,
                  name="blocks")
  return block(x_BLD, mask_BL)[0]


def scanned_layout(params) -> dict:
  """Per-layer `block_0` … `block_{n-1}` parameters (or any tree of that layout, e.g. gradients)
  → the scanned model's `blocks`, stacked on a leading layer axis."""
  n = sum(k.startswith("block_") for k in params)
  out = {k: v for k, v in params.items() if not k.startswith("block_")}
  out["blocks"] = jax.tree.map(lambda *xs: jnp.stack(xs), *[params[f"block_{i}"] for i in range(n)])
  return out


def per_layer_layout(params) -> dict:
  """The inverse of `scanned_layout` (a tree without `blocks` is returned as it is)."""
  if "blocks" not in params:
    return params
  out = {k: v for k, v in params.items() if k != "blocks"}
  n = jax.tree.leaves(params["blocks"])[0].shape[0]
  out.update({f"block_{i}": jax.tree.map(lambda x: x[i], params["blocks"]) for i in range(n)})
  return out

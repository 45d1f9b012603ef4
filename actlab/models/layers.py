"""Transformer layers shared by the decoder and the encoder: attention, FFN, block.

Shape suffixes: B batch, L sequence, D d_model, H heads, K head dim, F FFN hidden width.
"""

import dataclasses
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import ml_collections

from actlab import activations


@dataclasses.dataclass(frozen=True)
class Spec:
  """The model's hyperparameters: `config.model` resolved, hashable for Flax."""
  activation: str
  num_layers: int
  d_model: int
  num_heads: int
  d_ff: int
  max_len: int
  vocab_size: int               # padded to a multiple of 64
  dropout: float = 0.0
  norm: str = "pre"
  norm_eps: float = 1e-5
  gated_match_params: bool = True
  dtype: str = "float32"
  attention_impl: str = "xla"

  @classmethod
  def from_config(cls, model: ml_collections.ConfigDict, vocab_size: int) -> "Spec":
    fields = {f.name for f in dataclasses.fields(cls)}
    kwargs = {k: v for k, v in model.to_dict().items() if k in fields}
    kwargs["vocab_size"] = pad_vocab(model.vocab_size or vocab_size)
    return cls(**kwargs)

  @property
  def ffn_width(self) -> int:
    """Hidden width F: d_ff, or for gated FFNs round(2/3·d_ff) to a multiple of 64."""
    if activations.get(self.activation).gated and self.gated_match_params:
      return max(64, round(2 * self.d_ff / 3 / 64) * 64)
    return self.d_ff

  @property
  def compute_dtype(self) -> jnp.dtype:
    return jnp.dtype(self.dtype)


def pad_vocab(vocab_size: int, multiple: int = 64) -> int:
  return -(-vocab_size // multiple) * multiple


def normal(std: float) -> nn.initializers.Initializer:
  return nn.initializers.normal(stddev=std)


def dense(features: int, spec: Spec, std: float = 0.02, name: str | None = None) -> nn.Dense:
  return nn.Dense(features, dtype=spec.compute_dtype, kernel_init=normal(std), name=name)


def layer_norm(spec: Spec, name: str) -> nn.LayerNorm:
  return nn.LayerNorm(epsilon=spec.norm_eps, dtype=spec.compute_dtype, name=name)


def residual_std(spec: Spec) -> float:
  """GPT-2: residual output projections start at 0.02/√(2·layers)."""
  return 0.02 / math.sqrt(2 * spec.num_layers)


class Attention(nn.Module):
  """Multi-head self-attention through `jax.nn.dot_product_attention`."""
  spec: Spec
  causal: bool

  @nn.compact
  def __call__(self, x_BLD, mask_BL=None, *, train: bool = False):
    s = self.spec
    B, L, D = x_BLD.shape
    H, K = s.num_heads, D // s.num_heads
    q_BLHK, k_BLHK, v_BLHK = (
        dense(D, s, name=name)(x_BLD).reshape(B, L, H, K) for name in ("query", "key", "value"))
    mask = None if mask_BL is None else mask_BL[:, None, None, :]
    impl = None if s.attention_impl == "auto" else s.attention_impl
    out_BLHK = jax.nn.dot_product_attention(
        q_BLHK, k_BLHK, v_BLHK, mask=mask, is_causal=self.causal, implementation=impl)
    out_BLD = dense(D, s, residual_std(s), name="out")(out_BLHK.reshape(B, L, D))
    return nn.Dropout(s.dropout)(out_BLD, deterministic=not train)


class FeedForward(nn.Module):
  """W₂·act(W₁x) or, for the GLU family, W₂·(act(W_gate x) ⊙ W₁x) (Shazeer 2020).

  `z` is the pre-activation the statistics are taken on: W₁x, or the gate's W_gate x.
  """
  spec: Spec

  @nn.compact
  def __call__(self, x_BLD, *, train: bool = False):
    s = self.spec
    act = activations.get(s.activation)
    F = s.ffn_width
    up_BLF = dense(F, s, name="up")(x_BLD)
    if act.gated:
      z_BLF = dense(F, s, name="gate")(x_BLD)
      h_BLF = act.fn(z_BLF) * up_BLF
    else:
      z_BLF = up_BLF
      h_BLF = act.fn(z_BLF)
    out_BLD = dense(x_BLD.shape[-1], s, residual_std(s), name="down")(h_BLF)
    return nn.Dropout(s.dropout)(out_BLD, deterministic=not train)


class Block(nn.Module):
  """Pre-LN (GPT-2: x + f(LN(x))) or post-LN (BERT: LN(x + f(x))) transformer block."""
  spec: Spec
  causal: bool

  @nn.compact
  def __call__(self, x_BLD, mask_BL=None, *, train: bool = False):
    s = self.spec
    attn = Attention(s, self.causal, name="attn")
    ffn = FeedForward(s, name="ffn")
    ln_attn, ln_ffn = layer_norm(s, "ln_attn"), layer_norm(s, "ln_ffn")
    if s.norm == "pre":
      x_BLD = x_BLD + attn(ln_attn(x_BLD), mask_BL, train=train)
      return x_BLD + ffn(ln_ffn(x_BLD), train=train)
    x_BLD = ln_attn(x_BLD + attn(x_BLD, mask_BL, train=train))
    return ln_ffn(x_BLD + ffn(x_BLD, train=train))

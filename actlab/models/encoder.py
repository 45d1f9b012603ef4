"""BERT-style bidirectional encoder (Devlin et al. 2019): MLM head, pooler, sequence classifier.

The definition, in order:

1. embeddings: word (`wte`) + position (`wpe`) + segment / token type (`wtt`), summed, then
   LayerNorm (`ln_emb`, eps `model.norm_eps`: 1e-12 in the encoder configs) and dropout;
2. `num_layers` shared `layers.Block`s with `causal=False` and the padding mask — BERT's post-LN
   order `x = LN(x + Attn(x)); x = LN(x + FFN(x))` with `model.norm="post"`, or pre-LN with
   `model.norm="pre"`, which then also needs a final LayerNorm `ln_f` (post-LN has none); the FFN
   uses `model.activation`, plain or gated, exactly as in the decoder;
3. heads, chosen by `head` (from `train.task`):
   - `"mlm"`: dense → activation → LayerNorm → logits against the word embeddings (tied) + bias.
     The transform's activation is the FFN's (its gate's for the GLU family: swiglu → silu), as
     BERT uses `hidden_act` in both places;
   - `"classify"`: pooler = dense over the first ([CLS]) token → `pooler_activation` (BERT: tanh),
     then dropout and a dense classifier to `num_classes` logits;
   - `"all"`: both (a dict), to build or count a full checkpoint.

Deviations from BERT, kept on purpose so that the encoder and the decoder are one code path: the
shared layers initialise from N(0, 0.02) with GPT-2's residual scaling (0.02/√(2·layers) for
`attn/out` and `ffn/down`) rather than BERT's truncated normal, and attention has no dropout on
its probabilities (`jax.nn.dot_product_attention` has none); dropout acts on the embeddings and on
each sub-layer's output, as in BERT's hidden dropout.

Parameter names map one-to-one onto a standard BERT checkpoint (Hugging Face `bert-base-uncased`;
its task models prefix the trunk with `bert.`). Flax kernels are stored (in, out), the transpose
of PyTorch's `weight`; LayerNorm `scale`/`bias` are `weight`/`bias` (`gamma`/`beta` in old files).
`hf_names` gives the table for a parameter tree; `to_hf` / `from_hf` convert.

| actlab (Flax)                         | BERT (PyTorch)                                   | shape (Flax)   |
|---------------------------------------|--------------------------------------------------|----------------|
| `wte/embedding`                       | `embeddings.word_embeddings.weight`              | (V, D)         |
| `wpe/embedding`                       | `embeddings.position_embeddings.weight`          | (P, D)         |
| `wtt/embedding`                       | `embeddings.token_type_embeddings.weight`        | (2, D)         |
| `ln_emb/{scale,bias}`                 | `embeddings.LayerNorm.{weight,bias}`             | (D,)           |
| `block_i/attn/{query,key,value}/kernel` | `encoder.layer.i.attention.self.{query,key,value}.weight`ᵀ | (D, D) |
| `block_i/attn/out/kernel`             | `encoder.layer.i.attention.output.dense.weight`ᵀ | (D, D)         |
| `block_i/ln_attn/{scale,bias}`        | `encoder.layer.i.attention.output.LayerNorm.*`   | (D,)           |
| `block_i/ffn/up/kernel`               | `encoder.layer.i.intermediate.dense.weight`ᵀ     | (D, F)         |
| `block_i/ffn/gate/kernel` (GLU only)  | `encoder.layer.i.intermediate.gate.weight`ᵀ (no BERT equivalent) | (D, F) |
| `block_i/ffn/down/kernel`             | `encoder.layer.i.output.dense.weight`ᵀ           | (F, D)         |
| `block_i/ln_ffn/{scale,bias}`         | `encoder.layer.i.output.LayerNorm.*`             | (D,)           |
| `ln_f/{scale,bias}` (pre-LN only)     | `encoder.LayerNorm.*` (no BERT equivalent)       | (D,)           |
| `pooler/kernel`                       | `pooler.dense.weight`ᵀ                           | (D, D)         |
| `mlm/dense/kernel`                    | `cls.predictions.transform.dense.weight`ᵀ        | (D, D)         |
| `mlm/ln/{scale,bias}`                 | `cls.predictions.transform.LayerNorm.*`          | (D,)           |
| `mlm/bias`                            | `cls.predictions.bias` (= `decoder.bias`; `decoder.weight` is tied to the word embeddings) | (V,) |
| `classifier/kernel`                   | `classifier.weight`ᵀ                             | (D, C)         |

Every `…/kernel` has a `…/bias` beside it (`….bias` in BERT, not transposed). The vocabulary V
is the tokenizer's padded to a multiple of 64 (BERT's 30,522 → 30,528): `from_hf` pads with
zeros. BERT-base (12 layers, 768, 12 heads, d_ff 3072, 512 positions) has 109,482,240
parameters with the pooler at V = 30,522 — the "110M" — and 109,486,848 at V = 30,528
(tests/test_encoder.py derives both from the closed form `param_count`).
"""

from __future__ import annotations

from typing import Mapping

import flax.linen as nn
from flax.traverse_util import flatten_dict, unflatten_dict
import jax.numpy as jnp
import numpy as np

from actlab import activations
from actlab.models.layers import Block, Spec, dense, layer_norm, normal

HEADS = ("mlm", "classify", "all")


class MLMHead(nn.Module):
  """BERT's `cls.predictions`: dense → activation → LayerNorm → tied output projection + bias."""
  spec: Spec

  @nn.compact
  def __call__(self, x_BLD, wte: nn.Embed):
    s = self.spec
    h_BLD = dense(s.d_model, s, name="dense")(x_BLD)
    h_BLD = layer_norm(s, "ln")(activations.get(s.activation).fn(h_BLD))
    bias_V = self.param("bias", nn.initializers.zeros, (s.vocab_size,), jnp.float32)
    # = wte.attend(h_BLD), with float32 logits also when computing in bfloat16.
    return jnp.einsum("bld,vd->blv", h_BLD, wte.embedding.astype(h_BLD.dtype),
                      preferred_element_type=jnp.float32) + bias_V


class Encoder(nn.Module):
  spec: Spec
  head: str = "mlm"               # "mlm", "classify" or "all" (see the module docstring)
  pooler_activation: str = "tanh"
  type_vocab_size: int = 2
  num_classes: int = 2

  @nn.compact
  def __call__(self, tokens_BL, mask_BL=None, segments_BL=None, *,
               masked_positions_BP=None, train: bool = False):
    """MLM logits [B, L, V] (float32), class logits [B, C], or both in a dict (`head="all"`).

    `mask_BL` is True at real tokens and False at padding; attention never reads a padded
    position, so padding leaves every real position's output unchanged. `segments_BL` (token
    types) default to 0. With `masked_positions_BP` the MLM head runs only at those P positions
    per sequence (BERT's `masked_lm_positions`) and returns [B, P, V]: the vocabulary projection
    is the costliest matrix product of a small encoder.
    """
    s = self.spec
    if self.head not in HEADS:
      raise ValueError(f"Encoder.head={self.head!r}: choose one of {HEADS}")
    L = tokens_BL.shape[1]
    if segments_BL is None:
      segments_BL = jnp.zeros_like(tokens_BL)
    embed = lambda n, name: nn.Embed(n, s.d_model, embedding_init=normal(0.02),
                                     dtype=s.compute_dtype, name=name)
    wte = embed(s.vocab_size, "wte")
    x_BLD = (wte(tokens_BL) + embed(s.max_len, "wpe")(jnp.arange(L))[None]
             + embed(self.type_vocab_size, "wtt")(segments_BL))
    x_BLD = layer_norm(s, "ln_emb")(x_BLD)
    x_BLD = nn.Dropout(s.dropout)(x_BLD, deterministic=not train)
    for i in range(s.num_layers):
      x_BLD = Block(s, causal=False, name=f"block_{i}")(x_BLD, mask_BL, train=train)
    if s.norm == "pre":
      x_BLD = layer_norm(s, "ln_f")(x_BLD)

    out = {}
    if self.head in ("mlm", "all"):
      h = x_BLD if masked_positions_BP is None else jnp.take_along_axis(
          x_BLD, masked_positions_BP[..., None], axis=1)
      out["mlm"] = MLMHead(s, name="mlm")(h, wte)
    if self.head in ("classify", "all"):
      pooled_BD = dense(s.d_model, s, name="pooler")(x_BLD[:, 0])
      pooled_BD = activations.get(self.pooler_activation).fn(pooled_BD)
      out["pooled"] = pooled_BD
      pooled_BD = nn.Dropout(s.dropout)(pooled_BD, deterministic=not train)
      out["classify"] = dense(self.num_classes, s, name="classifier")(pooled_BD).astype(
          jnp.float32)
    return out if self.head == "all" else out[self.head]


# --- Parameter counts and the BERT name mapping ----------------------------------------------


def param_count(spec: Spec, head: str = "mlm", type_vocab_size: int = 2,
                num_classes: int = 2) -> int:
  """The closed form of the encoder's parameter count (checked against `init` by the tests)."""
  D, V, P, F = spec.d_model, spec.vocab_size, spec.max_len, spec.ffn_width
  gated = activations.get(spec.activation).gated
  ln = 2 * D
  embeddings = (V + P + type_vocab_size) * D + ln
  attention = 4 * (D * D + D)
  ffn = (3 if gated else 2) * D * F + (2 if gated else 1) * F + D
  layer = attention + ffn + 2 * ln
  total = embeddings + spec.num_layers * layer + (ln if spec.norm == "pre" else 0)
  if head in ("mlm", "all"):
    total += D * D + D + ln + V
  if head in ("classify", "all"):
    total += D * D + D + D * num_classes + num_classes
  return total


_LEAF = {"kernel": "weight", "bias": "bias", "scale": "weight", "embedding": "weight"}
_TOP = {
    "wte": "embeddings.word_embeddings", "wpe": "embeddings.position_embeddings",
    "wtt": "embeddings.token_type_embeddings", "ln_emb": "embeddings.LayerNorm",
    "ln_f": "encoder.LayerNorm", "pooler": "pooler.dense", "classifier": "classifier",
}
_BLOCK = {
    ("attn", "query"): "attention.self.query", ("attn", "key"): "attention.self.key",
    ("attn", "value"): "attention.self.value", ("attn", "out"): "attention.output.dense",
    ("ln_attn",): "attention.output.LayerNorm", ("ffn", "up"): "intermediate.dense",
    ("ffn", "gate"): "intermediate.gate", ("ffn", "down"): "output.dense",
    ("ln_ffn",): "output.LayerNorm",
}
_MLM = {("dense",): "cls.predictions.transform.dense",
        ("ln",): "cls.predictions.transform.LayerNorm"}


def hf_name(path: tuple[str, ...]) -> str:
  """The BERT (Hugging Face) name of one Flax parameter path, e.g.
  ("block_3", "ffn", "up", "kernel") → "encoder.layer.3.intermediate.dense.weight"."""
  head, *rest = path
  if head == "mlm" and rest == ["bias"]:
    return "cls.predictions.bias"
  *module, leaf = rest
  if head in _TOP and len(module) == 0:
    return f"{_TOP[head]}.{_LEAF[leaf]}"
  if head.startswith("block_") and tuple(module) in _BLOCK:
    return f"encoder.layer.{int(head[6:])}.{_BLOCK[tuple(module)]}.{_LEAF[leaf]}"
  if head == "mlm" and tuple(module) in _MLM:
    return f"{_MLM[tuple(module)]}.{_LEAF[leaf]}"
  raise KeyError(f"no BERT name for encoder parameter {'/'.join(path)}")


def hf_names(params: Mapping) -> dict[str, str]:
  """{"block_0/attn/query/kernel": "encoder.layer.0.attention.self.query.weight", ...}."""
  return {"/".join(p): hf_name(p) for p in flatten_dict(params)}


def to_hf(params: Mapping) -> dict[str, np.ndarray]:
  """A BERT state dict (numpy, PyTorch layout: kernels transposed) from encoder parameters."""
  out = {}
  for path, value in flatten_dict(params).items():
    value = np.asarray(value)
    out[hf_name(path)] = value.T if path[-1] == "kernel" else value
  return out


def from_hf(state: Mapping[str, np.ndarray], like: Mapping) -> dict:
  """Encoder parameters shaped like `like` (e.g. from `init` or `jax.eval_shape`) from a BERT
  state dict. Names may carry the `bert.` prefix of Hugging Face task models; LayerNorm
  `gamma`/`beta` (old checkpoints) are accepted; a smaller vocabulary is padded with zeros.
  Raises KeyError naming any parameter the state dict lacks."""
  state = {k.removeprefix("bert."): v for k, v in state.items()}
  for k in list(state):
    if k.endswith(".gamma") or k.endswith(".beta"):
      state[k.rsplit(".", 1)[0] + (".weight" if k.endswith(".gamma") else ".bias")] = state.pop(k)
  missing = []

  def convert(path, target):
    name = hf_name(path)
    if name not in state:
      missing.append(name)
      return None
    value = np.asarray(state[name], np.float32)
    if path[-1] == "kernel":
      value = value.T
    if value.shape != tuple(target.shape):
      pad = [(0, t - v) for t, v in zip(target.shape, value.shape)]
      if len(value.shape) != len(target.shape) or any(p < 0 for _, p in pad) or path[0] not in (
          "wte", "mlm"):
        raise ValueError(f"{name}: shape {value.shape}, the encoder wants {tuple(target.shape)}")
      value = np.pad(value, pad)  # vocabulary padding
    return value

  flat = {p: convert(p, t) for p, t in flatten_dict(like).items()}
  if missing:
    raise KeyError(f"the state dict lacks {len(missing)} encoder parameters: {missing[:5]}")
  return unflatten_dict(flat)

"""The BERT-style encoder: the transformer's blocks (transformer.py), bidirectional with a padding
mask, under BERT's embeddings and heads. BERT's parameter names: hf.py; its losses: the mlm and
classify tasks (actlab/tasks/).
"""

import flax.linen as nn
import jax.numpy as jnp

from actlab.models import activations
from actlab.models.execution import Execution
from actlab.models.spec import Spec
from actlab.models.layers import dense, embed, norm
from actlab.models.transformer import stack, tied_logits

HEADS = ("mlm", "classify", "all")


class MLMHead(nn.Module):
  """BERT's `cls.predictions`: dense → activation (the FFN's; its gate's for the GLU family) →
  LayerNorm → the projection tied to the word embeddings, + bias."""
  spec: Spec
  execution: Execution = Execution()

  @nn.compact
  def __call__(self, x_BPD, embedding_VD):
    s, ex = self.spec, self.execution
    h_BPD = dense(s.d_model, ex, name="dense")(x_BPD)
    h_BPD = norm(s, ex, "ln")(activations.get(s.activation).fn(h_BPD))
    bias_V = self.param("bias", nn.initializers.zeros, (s.vocab_size,), jnp.float32)
    return tied_logits(h_BPD, embedding_VD) + bias_V


class Encoder(nn.Module):
  """BERT (Devlin et al. 2019): word (`wte`), position (`wpe`) and segment (`wtt`) embeddings,
  LayerNorm (`ln_emb`), dropout; bidirectional blocks (post-LN, or pre-LN with a final `ln_f`);
  the `head` "mlm" (`MLMHead`), "classify" (dense `pooler` over [CLS], `pooler_activation`,
  dropout, dense `classifier`) or "all" (both, to build a full checkpoint). Unlike BERT, layers
  are initialised as GPT-2's and attention probabilities have no dropout."""
  spec: Spec
  head: str = "mlm"
  pooler_activation: str = "tanh"
  type_vocab_size: int = 2
  num_classes: int = 2
  execution: Execution = Execution()

  @nn.compact
  def __call__(self, tokens_BL, mask_BL=None, segments_BL=None, *,
               masked_positions_BP=None, train: bool = False):
    """MLM logits [B, L, V] (float32), class logits [B, C], or both in a dict (`head="all"`).
    `mask_BL` is True at real tokens (attention never reads padding); `segments_BL` default to 0.
    With `masked_positions_BP` the MLM head runs at those P positions only: [B, P, V]."""
    s, ex = self.spec, self.execution
    if self.head not in HEADS:
      raise ValueError(f"Encoder.head={self.head!r}: choose one of {HEADS}")
    L = tokens_BL.shape[1]
    if segments_BL is None:
      segments_BL = jnp.zeros_like(tokens_BL)
    wte = embed(s.vocab_size, s, ex, "wte")
    x_BLD = (wte(tokens_BL) + embed(s.max_len, s, ex, "wpe")(jnp.arange(L))[None]
             + embed(self.type_vocab_size, s, ex, "wtt")(segments_BL))
    x_BLD = norm(s, ex, "ln_emb")(x_BLD)
    x_BLD = nn.Dropout(s.dropout)(x_BLD, deterministic=not train)
    x_BLD = stack(s, ex, x_BLD, mask_BL, causal=False, train=train)
    if s.norm == "pre":
      x_BLD = norm(s, ex, "ln_f")(x_BLD)

    out = {}
    if self.head in ("mlm", "all"):
      h = x_BLD if masked_positions_BP is None else jnp.take_along_axis(
          x_BLD, masked_positions_BP[..., None], axis=1)
      out["mlm"] = MLMHead(s, ex, name="mlm")(h, wte.embedding)
    if self.head in ("classify", "all"):
      pooled_BD = dense(s.d_model, ex, name="pooler")(x_BLD[:, 0])
      out["pooled"] = pooled_BD = activations.get(self.pooler_activation).fn(pooled_BD)
      pooled_BD = nn.Dropout(s.dropout)(pooled_BD, deterministic=not train)
      out["classify"] = dense(self.num_classes, ex, name="classifier")(pooled_BD).astype(
          jnp.float32)
    return out if self.head == "all" else out[self.head]

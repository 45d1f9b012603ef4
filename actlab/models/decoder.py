"""GPT-2 style causal language model: token + position embeddings, pre-LN blocks, tied LM head."""

import flax.linen as nn
import jax.numpy as jnp

from actlab.models.layers import Spec, layer_norm, normal, stack_blocks


class Decoder(nn.Module):
  spec: Spec

  @nn.compact
  def __call__(self, tokens_BL, *, train: bool = False, decode: bool = False, head: bool = True):
    """Next-token logits (float32) for every position; position t sees tokens ≤ t only.

    With `head=False` it returns the final LayerNorm's output [B, L, D] instead: the loss then
    applies the tied head itself (`kernels.xent_sum`, without materialising the logits).

    With `decode`, keys and values persist in the "cache" collection and `tokens_BL`
    continues the sequence cached so far (prompt first, then one token per call).
    """
    s = self.spec
    L = tokens_BL.shape[1]
    wte = nn.Embed(s.vocab_size, s.d_model, embedding_init=normal(0.02),
                   dtype=s.compute_dtype, name="wte")
    wpe = nn.Embed(s.max_len, s.d_model, embedding_init=normal(0.02),
                   dtype=s.compute_dtype, name="wpe")
    start = 0
    if decode:
      position = self.variable("cache", "position", lambda: jnp.zeros((), jnp.int32))
      start, position.value = position.value, position.value + L
    x_BLD = wte(tokens_BL) + wpe(start + jnp.arange(L))[None]
    x_BLD = nn.Dropout(s.dropout)(x_BLD, deterministic=not train)
    x_BLD = stack_blocks(s, True, x_BLD, train=train, decode=decode)  # block_i, or scanned
    x_BLD = layer_norm(s, "ln_f")(x_BLD)
    if not head:
      return x_BLD
    # = wte.attend(x_BLD), with float32 logits also when computing in bfloat16.
    return jnp.einsum("bld,vd->blv", x_BLD, wte.embedding.astype(x_BLD.dtype),
                      preferred_element_type=jnp.float32)

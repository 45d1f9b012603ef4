"""GPT-2 style causal language model: token + position embeddings, pre-LN blocks, tied LM head."""

import flax.linen as nn
import jax.numpy as jnp

from actlab.models.layers import Block, Spec, layer_norm, normal


class Decoder(nn.Module):
  spec: Spec

  @nn.compact
  def __call__(self, tokens_BL, *, train: bool = False, decode: bool = False):
    """Next-token logits (float32) for every position; position t sees tokens ≤ t only.

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
    for i in range(s.num_layers):
      x_BLD = Block(s, causal=True, name=f"block_{i}")(x_BLD, train=train, decode=decode)
    x_BLD = layer_norm(s, "ln_f")(x_BLD)
    return wte.attend(x_BLD).astype(jnp.float32)

"""The parameter layouts of scanned and per-layer blocks, converted both ways: a scanned model's
`blocks` (stacked on a leading layer axis, `model.scan_layers`) and `block_0` … `block_{n-1}`,
the per-layer layout every mapping here and a checkpoint from another run are read in."""

import jax
import jax.numpy as jnp


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

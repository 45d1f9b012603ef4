"""Training objectives: `(model, params, batch, rng, train) -> {"loss_sum", "count", ...}`.

Sums (not means) so that evaluation can pool exactly over many batches.
"""

import optax


def causal_lm(model, params, batch_BL1, rng, train: bool) -> dict:
  """Next-token cross-entropy (nats) over every position of windows of L+1 tokens."""
  inputs_BL, targets_BL = batch_BL1[:, :-1], batch_BL1[:, 1:]
  logits_BLV = model.apply({"params": params}, inputs_BL, train=train, rngs={"dropout": rng})
  losses_BL = optax.softmax_cross_entropy_with_integer_labels(logits_BLV, targets_BL)
  return {"loss_sum": losses_BL.sum(), "count": losses_BL.size}


def get(kind: str):
  return {"decoder": causal_lm}[kind]

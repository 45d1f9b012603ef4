"""`Task`: what a run learns, as the harness needs it; each task module ends with its `TASK`."""

import dataclasses
from typing import Callable


@dataclasses.dataclass(frozen=True)
class Task:
  """What a run learns; every function takes the config first."""
  name: str
  objective: Callable         # (config, vocab_size) -> core.Objective: the model with its loss
  dataset: Callable           # (config) -> data.Dataset: `train_batch(step)`, `val_batches()`
  random_batch: Callable      # (config, vocab_size, seed) -> a batch of the right form (benchmarks)
  chance_loss: Callable       # (config, vocab_size) -> the loss of a uniform prediction (nats)
  baselines: Callable         # (config, dataset) -> {"unigram_loss", …}: context-free predictors'
  #                             val losses, where comparable (the report's "not learned" bar)
  head_matmul_params: Callable  # (config, vocab_size) -> the head's matrix entries per token
  causal: bool                # predicts the next token (`actlab.sample` continues text)

"""What a run learns: `causal_lm` (the decoder), `mlm` and `classify` (the encoder). A task owns
the model it trains (the trunk with its head), its loss, its batches, its chance level and its
head's FLOPs; `get(config)` is the task of a config, and no module outside this package asks what
kind of model or task a config is. A task is a `Task`: its module's functions and constants,
gathered and typed once at import. Adding a task is one module here and one entry in `TASKS`.
"""

import dataclasses
from types import ModuleType
from typing import Callable

import ml_collections

from actlab.models.hf_checkpoint import Architecture
from actlab.tasks import causal_lm, classify, mlm


@dataclasses.dataclass(frozen=True)
class Task:
  """What a run learns; every function takes the config first."""
  name: str
  model: Callable             # (config, vocab_size) -> nn.Module: the trunk with the task's head
  objective: Callable         # (config, vocab_size) -> (model, params, batch, rng, train,
  #                             stats=False) -> models.Sums
  dataset: Callable           # (config) -> data.Dataset: `train_batch(step)`, `val_batches()`
  random_batch: Callable      # (config, vocab_size, seed) -> a batch of the right form (benchmarks)
  chance_loss: Callable       # (config, vocab_size) -> the loss of a uniform prediction (nats)
  baselines: Callable         # (config, dataset) -> {"unigram_loss", …}: context-free predictors'
  #                             val losses, where comparable (the report's "not learned" bar)
  head_matmul_params: Callable  # (config, vocab_size) -> the head's matrix entries per token
  causal: bool                # predicts the next token (`actlab.sample` continues text)
  hf: Architecture            # the transformers model it is (actlab.export, init_from=hf:DIR)

  @classmethod
  def of(cls, module: ModuleType) -> "Task":
    """The task a module defines (`CAUSAL` and `HF` are its constants)."""
    fields = {f.name: getattr(module, f.name.upper() if f.name in ("causal", "hf") else f.name)
              for f in dataclasses.fields(cls) if f.name != "name"}
    return cls(module.__name__.rsplit(".", 1)[-1], **fields)


TASKS: dict[str, Task] = {t.name: t for t in map(Task.of, (causal_lm, mlm, classify))}


def name(config: ml_collections.ConfigDict) -> str:
  """The task of `config`: the decoder's is `causal_lm`; the encoder's is `model.task`."""
  m = config.model
  return "causal_lm" if m.kind == "decoder" else m.task


def get(config: ml_collections.ConfigDict) -> Task:
  return TASKS[name(config)]

"""What a run learns: `causal_lm` (the decoder), `mlm` and `classify` (the encoder). A task owns
its objective (the model with its loss, from the core), its batches, its chance level and its
head's FLOPs; `get(config)` is the task of a config, and no module outside this package asks what
kind of model or task a config is. Each task module ends with its `Task`, `TASK`; adding a task
is one module here and one entry in `TASKS`.
"""

import ml_collections

from actlab.tasks import causal_lm, classify, mlm
from actlab.tasks.task import Task

TASKS: dict[str, Task] = {t.name: t for t in (causal_lm.TASK, mlm.TASK, classify.TASK)}


def name(config: ml_collections.ConfigDict) -> str:
  """The task of `config`: the decoder's is `causal_lm`; the encoder's is `model.task`."""
  m = config.model
  return "causal_lm" if m.kind == "decoder" else m.task


def get(config: ml_collections.ConfigDict) -> Task:
  return TASKS[name(config)]

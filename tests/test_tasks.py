"""The task registry (actlab/tasks.py): every task is a whole `Task`, its random batch is what
its objective reads, and configs name their task in one place."""

import dataclasses
import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actlab import config as config_lib
from actlab import core, tasks
from conftest import tiny, tiny_encoder

CONFIGS = {"causal_lm": lambda: tiny(), "mlm": lambda: tiny_encoder(**{"train.batch_size": 4}),
           "classify": lambda: tiny_encoder("classify", **{"train.batch_size": 4})}


def test_every_task_is_a_whole_task():
  """Each task gives every field of `tasks.Task`: its functions and `causal`."""
  assert sorted(tasks.TASKS) == ["causal_lm", "classify", "mlm"]
  functions = [f.name for f in dataclasses.fields(tasks.Task) if f.type is Callable]
  for name, task in tasks.TASKS.items():
    assert isinstance(task, tasks.Task) and task.name == name
    assert all(callable(getattr(task, f)) for f in functions), name
    assert isinstance(task.causal, bool)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_objective_reads_the_random_batch(name):
  c = config_lib.typed(CONFIGS[name]())
  assert tasks.name(c) == name
  task, vocab = tasks.get(c), 300
  objective = task.objective(c, vocab)
  batch = task.random_batch(c, vocab, seed=1)
  inputs = batch["tokens"] if isinstance(batch, dict) else batch[:, :-1]
  params = objective.model.init(jax.random.PRNGKey(0), jnp.asarray(inputs))["params"]
  out = jax.jit(lambda p, b: objective(p, b, jax.random.PRNGKey(2), train=False))(params, batch)
  loss = float(out.loss_sum / out.count)
  assert int(out.count) > 0 and math.isfinite(loss)
  # At initialisation the loss is near chance (ln of the outputs), as it should be for any task.
  assert abs(loss - task.chance_loss(c, vocab)) < 0.5, (loss, task.chance_loss(c, vocab))
  assert task.causal == (name == "causal_lm")


def test_a_batch_differs_by_seed_and_keeps_special_ids_out():
  c = tiny_encoder()
  a, b = (tasks.MLM.random_batch(c, 300, s) for s in (0, 1))
  assert not np.array_equal(a, b) and a.min() >= len(core.Specials._fields)


@pytest.mark.parametrize("change, message", [
    ({"model.kind": "vit"}, "model.kind='vit': choose 'decoder' or 'encoder'"),
    ({"model.task": "span"}, "model.task='span': choose 'mlm' or 'classify'"),
    ({"data.classify": "imdb"}, "data.classify='imdb': choose one of"),
])
def test_validation_names_the_task_field(change, message):
  c = tiny_encoder("classify")
  for key, value in change.items():
    section, field = key.split(".")
    c[section][field] = value
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.validate(c)

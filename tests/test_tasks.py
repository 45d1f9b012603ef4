"""The task registry (actlab/tasks/): every task has the whole interface, its random batch is what
its objective reads, and configs name their task in one place."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actlab import config as config_lib
from actlab import tasks
from conftest import tiny, tiny_encoder

INTERFACE = ("model", "objective", "dataset", "random_batch", "chance_loss",
             "head_matmul_params", "CAUSAL")


CONFIGS = {"causal_lm": lambda: tiny(), "mlm": lambda: tiny_encoder(**{"train.batch_size": 4}),
           "classify": lambda: tiny_encoder("classify", **{"train.batch_size": 4})}


def test_every_task_has_the_whole_interface():
  for name, module in tasks.TASKS.items():
    missing = [f for f in INTERFACE if not hasattr(module, f)]
    assert not missing, (name, missing)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_objective_reads_the_random_batch(name):
  c = CONFIGS[name]()
  assert tasks.name(c) == name
  task, vocab = tasks.get(c), 300
  model = task.model(c, vocab)
  batch = task.random_batch(c, vocab, seed=1)
  inputs = batch["tokens"] if isinstance(batch, dict) else batch[:, :-1]
  params = model.init(jax.random.PRNGKey(0), jnp.asarray(inputs))["params"]
  out = jax.jit(lambda p, b: task.objective(c, vocab)(model, p, b, jax.random.PRNGKey(2),
                                                      train=False))(params, batch)
  loss = float(out["loss_sum"] / out["count"])
  assert int(out["count"]) > 0 and math.isfinite(loss)
  # At initialisation the loss is near chance (ln of the outputs), as it should be for any task.
  assert abs(loss - task.chance_loss(c, vocab)) < 0.5, (loss, task.chance_loss(c, vocab))
  assert task.CAUSAL == (name == "causal_lm")


def test_a_batch_differs_by_seed_and_keeps_special_ids_out():
  c = tiny_encoder()
  a, b = (tasks.mlm.random_batch(c, 300, s) for s in (0, 1))
  assert not np.array_equal(a, b) and a.min() >= len(tasks.mlm.Specials._fields)


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

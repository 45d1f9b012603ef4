"""The core without the harness: docs/notebook.md's snippet trains the decoder from typed specs
alone, and the config's `model` and `optim` sections are those specs' fields (actlab/config/
schema.py), built by the tasks and `program.create_step`, where a field that matches nothing is an
error. (That the core imports nothing of the harness: tests/test_layers.py.)"""

import code
import dataclasses
import functools
import math
import re

import jax
import numpy as np
import pytest

from actlab import config as config_lib, core, tasks
from actlab.config import schema
from actlab.run import program as program_lib
from conftest import REPO, tiny, tiny_encoder


def notebook_snippet() -> str:
  text = (REPO / "docs" / "notebook.md").read_text()
  return re.search(r"```python\n(.*?)```", text, re.S).group(1)


class Prompt(code.InteractiveConsole):
  """The `python` prompt, line by line (a compound statement ends at a blank line), raising what
  it would print: a syntax error or a traceback."""

  def showsyntaxerror(self, filename=None, **kwargs):
    raise  # Called while the error is handled: raises it.

  def showtraceback(self):
    raise


@pytest.mark.slow
def test_the_notebook_snippet_trains_the_decoder_in_about_15_lines(capsys):
  """As pasted into the `python` prompt."""
  source = notebook_snippet()
  assert len([line for line in source.splitlines() if line.strip()]) <= 15
  names = {}
  prompt = Prompt(names, "docs/notebook.md")
  for line in source.splitlines() + [""]:
    prompt.push(line)
  assert int(names["state"].step) == 20
  # From chance (ln 256 = 5.55 nats) to well below it on a repeated sentence.
  assert float(names["metrics"]["train_loss"]) < math.log(256) - 2
  assert "step 20: train loss" in capsys.readouterr().out


def test_the_config_becomes_the_cores_specs():
  c = tiny(**{"model.norm_type": "rms", "model.position": "rope", "model.bias": False})
  step = program_lib.create_step(c, 257)
  spec, execution, optim = step.objective.model.spec, step.objective.model.execution, step.optim
  assert (spec.norm_type, spec.position, spec.bias) == ("rms", "rope", False)
  assert spec.vocab_size == 320 and spec.activation == c.model.activation  # 257 padded to 64s
  assert execution == core.Execution(dtype=c.model.dtype, scan_layers=c.model.scan_layers,
                                    remat=c.model.remat, attention_impl=c.model.attention_impl,
                                    loss_impl=c.model.loss_impl)
  assert optim.total_steps == c.train.steps and optim.lr == c.optim.lr
  encoder = tiny_encoder("classify")
  assert tasks.get(encoder).objective(config_lib.typed(encoder), 300).model.spec.norm == encoder.model.norm


@pytest.mark.parametrize("section, field", [("model", "norm_kind"), ("optim", "beta1")])
def test_a_field_that_matches_nothing_is_an_error_not_ignored(section, field):
  """The sections are the core's fields (and the task's): any other is refused before a spec is
  built from them."""
  c = tiny()
  with c.unlocked():
    c[section][field] = 1
  with pytest.raises(ValueError, match=f"^{section}.{field}: no such field"):
    config_lib.validate(c)


def test_an_optimizer_whose_warmup_outlasts_its_steps_is_refused_in_one_line():
  """The one message of each relation of its fields, in the config's terms, which `validate` gives
  by building it (tests/test_config.py)."""
  with pytest.raises(ValueError, match=r"^optim.warmup_steps=100 must be >= 0 and < "
                                       r"train.steps=20: set --config.optim.warmup_steps=2 "):
    core.OptimSpec(total_steps=20)


def test_the_models_choices_are_written_once_on_the_core():
  """The config's check of a model field's values reads them from the core's field (`choice`);
  the attention's and the loss's are `core.Execution`'s."""
  fields = {f.name: f for cls in (core.Spec, core.Execution) for f in dataclasses.fields(cls)}
  chosen = {f.name: f for f in dataclasses.fields(schema.Model) if "choices" in fields.get(
      f.name, dataclasses.field()).metadata}
  assert set(chosen) == {n for n, f in fields.items() if "choices" in f.metadata}
  for name, f in chosen.items():
    assert f.metadata["core"] in (core.Spec, core.Execution)
    assert f.default == fields[name].default
    for value in fields[name].metadata["choices"]:
      f.metadata["rule"](f"model.{name}", value)  # each of the core's choices passes
    with pytest.raises(ValueError, match=f"model.{name}='other': choose "):
      f.metadata["rule"](f"model.{name}", "other")
  with pytest.raises(config_lib.ConfigError, match="model.position='alibi': choose 'learned' or "
                                                    "'rope'"):
    config_lib.validate(tiny(**{"model.position": "alibi"}))


@pytest.mark.parametrize("cls, section", [(core.OptimSpec, "optim"), (core.Spec, "model"),
                                          (core.Execution, "model")])
def test_the_cores_defaults_are_the_configs(cls, section):
  """A notebook's `OptimSpec`, `Spec` and `Execution` defaults are the default config's values."""
  values = config_lib.base()[section]
  defaults = {f.name: f.default for f in dataclasses.fields(cls)
              if f.default is not dataclasses.MISSING}
  assert defaults and all(values[name] == value for name, value in defaults.items()), {
      name: (values[name], value) for name, value in defaults.items() if values[name] != value}


@pytest.mark.slow
def test_the_harness_trains_the_cores_step_bitwise():
  """The program a run trains (`program.Program`, R = 1) and the core's `Step` jitted alone give
  the same parameters after 3 steps, to the bit."""
  c = tiny()
  program = program_lib.Program.create(c, 257)
  typed = config_lib.typed(c)
  step = core.Step(core.CausalLM(core.Decoder(typed.spec(257), typed.execution)),
                   typed.optim_spec, c.data.seq_len)
  state, alone = program.start([c]), jax.jit(step.init)(c.train.seed, np.float32(c.optim.lr))
  train_step = jax.jit(functools.partial(step.train_step, diagnostics=False))
  for k in range(3):
    batch = np.random.default_rng([0, k]).integers(0, 257, (c.train.batch_size,
                                                             c.data.seq_len + 1)).astype(np.int32)
    state, _ = program.train_step(state, program.put_batches([batch]))
    alone, _ = train_step(alone, batch)
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(alone)):
    np.testing.assert_array_equal(a, b)

"""Configs: every shipped file loads and validates; bad values give one readable line."""

import pytest
from absl import flags
from ml_collections import config_flags

from actlab import config as config_lib
from conftest import REPO, tiny

CONFIG_FILES = sorted((REPO / "configs").glob("*.py"))


def load(*argv):
  """Parses `--config=...` and overrides exactly as actlab.main does."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=fv, sys_argv=["prog", *argv])
  fv(["prog", *argv])
  return fv.config


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("variant", [None, "smoke"])
def test_every_config_file_validates(path, variant):
  c = load(f"--config={path}:{variant}" if variant else f"--config={path}")
  config_lib.validate(c)


def test_decoder_configs_differ_only_in_activation():
  a = load(f"--config={REPO}/configs/tinystories_relu.py")
  b = load(f"--config={REPO}/configs/tinystories_gelu.py")
  assert (a.model.activation, b.model.activation) == ("relu", "gelu")
  b.model.activation = "relu"
  assert a.to_dict() == b.to_dict()


def test_reference_setup():
  c = config_lib.decoder("gelu")
  assert (c.model.num_layers, c.model.d_model, c.model.num_heads, c.model.max_len) == (6, 384, 6, 128)
  assert (c.optim.b1, c.optim.b2, c.train.steps, c.train.seed) == (0.9, 0.95, 5000, 1337)
  assert (c.data.source, c.data.tokenizer, c.model.dtype) == ("tinystories", "gpt2", "float32")


def test_command_line_overrides():
  c = load(f"--config={REPO}/configs/tinystories_gelu.py:smoke", "--config.optim.lr=3e-3",
           "--config.model.activation=swiglu")
  assert c.optim.lr == 3e-3 and c.model.activation == "swiglu"
  assert c.data.source == "synthetic"


@pytest.mark.parametrize("field, value, message", [
    ("model.activation", "gelu2", "model.activation: unknown activation 'gelu2'; valid names: "),
    ("model.num_heads", 5, "model.d_model=32 is not divisible by model.num_heads=5"),
    ("optim.lr", 0.0, "optim.lr=0.0 must be positive"),
    ("optim.lr", -1e-3, "optim.lr=-0.001 must be positive"),
    ("train.steps", 0, "train.steps=0 must be positive"),
    ("train.batch_size", -2, "train.batch_size=-2 must be positive"),
    ("data.seq_len", 64, "data.seq_len=64 is longer than model.max_len=32"),
    ("model.norm", "sandwich", "model.norm='sandwich': choose 'pre' or 'post'"),
    ("data.tokenizer", "bpe:abc", "data.tokenizer='bpe:abc': choose"),
    ("optim.warmup_steps", 50, "optim.warmup_steps=50 must be >= 0 and < train.steps=50"),
])
def test_validate_gives_one_readable_line(field, value, message):
  c = tiny(**{field: value})
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(c)
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


def test_unknown_variant():
  with pytest.raises(config_lib.ConfigError, match="unknown config variant 'big'; choose one of: 'smoke'"):
    config_lib.decoder("gelu", "big")

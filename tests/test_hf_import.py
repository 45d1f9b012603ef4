"""`train.init_from=hf:DIR`: a local GPT-2 or BERT directory (tiny random models, no network: a
GPT-2 exported without torch, a BERT written by `transformers`) initialises the actlab model: the
same logits as transformers' when the activation is the checkpoint's, a run that trains, and one
line for what cannot map. Only the comparisons with transformers' logits need torch."""

import json
import subprocess
import sys

import numpy as np
import pytest

from actlab import config as config_lib
from actlab import tasks
from actlab.hf import checkpoint as hf_checkpoint
from actlab.infra import errors
from actlab.run import pretrained, program, train
import conftest
import test_classify
from conftest import DEEP, REPO
from test_export import RUN, perturbed_params, torch  # noqa: F401 -- torch: the fixture

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("safetensors", reason="the hf extra is not installed")

V = 257  # the byte tokenizer's (the tiny decoder's); padded to 320


# Two blocks: an import maps transformers' layers to the model's by their index.
def tiny(activation="gelu", **overrides):
  return conftest.tiny(activation, **{**DEEP, **overrides})


def tiny_encoder(task="mlm", **overrides):
  return test_classify.tiny_encoder(task, **{**DEEP, **overrides})


@pytest.fixture(scope="module")
def gpt2_dir(tmp_path_factory):
  """A tiny GPT-2 (2 layers, d_model 32, 48 positions, "gelu_new") with noise on every weight,
  exported without torch."""
  directory = tmp_path_factory.mktemp("gpt2")
  c = tiny("gelu_tanh", **{"model.max_len": 48})
  hf_checkpoint.write(directory, c, "gpt2", "causal_lm", perturbed_params(c, V), V, 256, RUN)
  return directory


def imported(config, vocab_size):
  """The config's model with parameters from its `train.init_from`."""
  params = program.create_step(config, vocab_size).init(0).params
  source = pretrained.init_from_config(config, vocab_size)
  return tasks.get(config).objective(config_lib.typed(config), vocab_size).model, pretrained.params_from(
      config, source, params, vocab_size)


@pytest.mark.slow
@pytest.mark.parametrize("scan", [False, True])
def test_gpt2_logits_equal_after_import(gpt2_dir, torch, scan):
  c = tiny("gelu_tanh", **{"model.scan_layers": scan})
  c.train.init_from = f"hf:{gpt2_dir}"
  model, params = imported(c, V)
  tokens = np.random.default_rng(0).integers(0, V, (2, 32))
  ours = np.asarray(model.apply({"params": params}, tokens))
  hf_model = transformers.GPT2LMHeadModel.from_pretrained(gpt2_dir).eval()
  with torch.no_grad():
    theirs = hf_model(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(ours[..., :V], theirs, atol=1e-4, rtol=0)


@pytest.mark.slow
def test_bert_logits_equal_after_import_from_pytorch_bin(tmp_path, torch):
  """BertForMaskedLM with noise on every weight, saved as pytorch_model.bin, with a smaller
  vocabulary (padded) and more positions (cut) than the model."""
  config = transformers.BertConfig(vocab_size=300, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, intermediate_size=64,
                                   max_position_embeddings=64, layer_norm_eps=1e-12)
  hf_model = transformers.BertForMaskedLM(config).eval()
  torch.manual_seed(0)
  with torch.no_grad():
    for p in hf_model.parameters():
      p.add_(0.1 * torch.randn_like(p))
  config.save_pretrained(tmp_path)
  torch.save(hf_model.state_dict(), tmp_path / "pytorch_model.bin")
  c = tiny_encoder("mlm", **{"train.init_from": f"hf:{tmp_path}"})
  model, params = imported(c, 2048)
  tokens = np.random.default_rng(0).integers(5, 300, (2, 32))
  mask = np.ones_like(tokens, bool)
  ours = np.asarray(model.apply({"params": params}, tokens, mask))
  with torch.no_grad():
    theirs = hf_model(torch.tensor(tokens)).logits.numpy()
  np.testing.assert_allclose(ours[..., :300], theirs, atol=1e-4, rtol=0)
  embedding = np.asarray(params["wte"]["embedding"])  # padded rows: the mean of the real ones
  np.testing.assert_allclose(embedding[300:], np.broadcast_to(embedding[:300].mean(0), (1748, 32)),
                             atol=1e-6)


@pytest.mark.parametrize("overrides, match", [
    ({"model.num_layers": 3, "model.d_ff": 128},
     "sizes differ from the model's; set --config.model.num_layers=2 --config.model.d_ff=64$"),
    ({"model.max_len": 64, "data.seq_len": 64}, "--config.model.max_len=48"),
    ({"model.activation": "swiglu"}, "gated FFN"),
    ({"model.norm": "post"}, "GPT2LMHeadModel is pre-LN"),
])
def test_what_cannot_map_is_one_line(gpt2_dir, overrides, match):
  c = tiny(**overrides)
  c.train.init_from = f"hf:{gpt2_dir}"
  with pytest.raises(errors.UserError, match=match):
    pretrained.init_from_config(c, V)


def test_wrong_architecture_vocabulary_or_directory_is_one_line(gpt2_dir, tmp_path):
  c = tiny_encoder("mlm", **{"train.init_from": f"hf:{gpt2_dir}"})
  with pytest.raises(errors.UserError,
                     match=r"is a 'gpt2' model; this run starts from bert \(BertForMaskedLM\)"):
    pretrained.init_from_config(c, 2048)
  big = json.loads((gpt2_dir / "config.json").read_text()) | {"vocab_size": 50257}
  (tmp_path / "config.json").write_text(json.dumps(big))
  c = tiny()
  c.train.init_from = f"hf:{tmp_path}"
  with pytest.raises(errors.UserError, match=r"vocabulary \(50257\) is larger than the model's"):
    pretrained.init_from_config(c, V)
  c.train.init_from = f"hf:{tmp_path / 'nowhere'}"
  with pytest.raises(errors.UserError, match="no readable config.json"):
    pretrained.init_from_config(c, V)


@pytest.mark.slow
def test_a_run_from_gpt2_trains_with_another_activation(gpt2_dir, tmp_path, capsys):
  c = tiny("relu", **{"train.steps": 8, "optim.warmup_steps": 2, "train.log_every": 1})
  c.train.init_from = f"hf:{gpt2_dir}"
  summary = train.run(c, tmp_path)
  out = capsys.readouterr().out
  assert out.startswith(f"actlab: train.init_from=hf:{gpt2_dir}: the FFN activation: 'gelu_new' "
                        "there, the config's 'relu' here (allowed: the parameters carry over)\n")
  assert "initialised 36 of 36 parameter arrays" in out
  rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
  losses = [r["train_loss"] for r in rows if "train_loss" in r]
  assert len(losses) == 8 and np.isfinite(losses).all() and losses[-1] < losses[0]
  assert summary


@pytest.mark.slow
def test_cli_size_mismatch_is_one_line(gpt2_dir, tmp_path):
  result = subprocess.run(
      [sys.executable, "-m", "actlab.main", "--config=configs/encoder.py:smoke",
       f"--workdir={tmp_path / 'run'}", f"--config.train.init_from=hf:{gpt2_dir}"],
      cwd=REPO, capture_output=True, text=True, timeout=300)
  assert result.returncode == 2, result.stderr
  assert result.stderr.strip().splitlines()[-1].startswith("error: train.init_from=hf:")
  assert "Traceback" not in result.stderr and not (tmp_path / "run" / "config.json").exists()

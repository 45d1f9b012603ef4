"""Decoding with the key/value cache equals the full forward pass; the sampling CLI's main samples
a run directory alone."""

import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from absl import flags

from actlab import config as config_lib
from actlab import data, sample, tasks
from actlab import data
from actlab.data import synthetic
from actlab.infra import workdir as workdir_lib
from actlab.run import train
from conftest import SHARED_DATA, tiny

TEXT = "Once upon a time, Lily said: \"Don't!\" — naïve café 123 <|endoftext|> end."


def tiny_model(seed=0):
  c = tiny("swiglu")
  model = tasks.get(c).objective(config_lib.typed(c), 257).model
  params = jax.jit(model.init)(jax.random.PRNGKey(seed), jnp.zeros((1, 32), jnp.int32))["params"]
  return model, params


@pytest.mark.slow
def test_cached_decoding_equals_full_forward():
  model, params = tiny_model()
  tokens = np.random.default_rng(0).integers(0, 257, (2, 20))
  full = model.apply({"params": params}, tokens)
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), tokens[:, :5], decode=True))
  cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes["cache"])
  step = jax.jit(lambda cache, t: model.apply({"params": params, "cache": cache}, t, decode=True,
                                              mutable=["cache"]))
  logits, v = step(cache, tokens[:, :5])  # prefill five tokens, then one at a time
  outs = [logits]
  for t in range(5, 20):
    logits, v = step(v["cache"], tokens[:, t:t + 1])
    outs.append(logits)
  np.testing.assert_allclose(np.concatenate(outs, axis=1), full, rtol=1e-5, atol=1e-5)


@pytest.mark.slow
def test_greedy_generation_matches_recomputing_every_prefix():
  model, params = tiny_model(1)
  prompt = np.array([[256, 72, 105]])
  generate = sample.make_generate(model, 257, 10, temperature=0.0, top_k=0)
  got = np.asarray(generate(params, jnp.asarray(prompt), jax.random.PRNGKey(0)))
  # Reference: recompute the whole prefix for every token. Causality lets one fixed-length
  # buffer (one compilation) stand in for every prefix: position t never sees what follows it.
  forward = jax.jit(lambda seq: model.apply({"params": params}, seq))
  seq = np.zeros((1, 13), np.int64)
  seq[:, :3] = prompt
  for t in range(3, 13):
    seq[0, t] = np.argmax(forward(seq)[0, t - 1, :257])
  np.testing.assert_array_equal(got, seq[:, 3:])


def test_top_k_and_padding_are_respected():
  logits = jnp.array([[5.0, 4.0, 3.0, 2.0, 9.0, 9.0]])  # the last two ids are padding
  draws = {int(sample.sample_token(logits, jax.random.PRNGKey(k), 1.0, 2, 4)[0])
           for k in range(200)}
  assert draws == {0, 1}


def saved_tokenizers(tmp_path):
  texts = lambda: list(synthetic.texts("train"))[:400]
  toks = [data.tokenizer_of("byte", directory=tmp_path),
          data.tokenizer_of("bpe:300", directory=tmp_path, train_texts=texts),
          data.tokenizer_of("wordpiece:300", directory=tmp_path, train_texts=texts)]
  if (SHARED_DATA / "gpt2" / "encoder.json").is_file():
    toks.append(data.tokenizer_of("gpt2", directory=tmp_path, gpt2_dir=SHARED_DATA / "gpt2"))
  return toks


def test_saved_tokenizer_gives_the_same_ids(tmp_path):
  """The run directory's copy of each tokenizer (gpt2 when ../shared/data has its files)
  encodes and decodes like the original; a changed file is one DataError."""
  sample_text = TEXT + " " + " ".join(list(synthetic.texts("validation"))[:20])
  for tok in saved_tokenizers(tmp_path):
    directory = tmp_path / "run" / tok.name.replace(":", "")
    assert data.saved_tokenizer(directory) is None
    data.save_tokenizer(tok, directory)
    again = data.saved_tokenizer(directory)
    assert (again.name, again.fingerprint, again.vocab_size, again.eot_id) == (
        tok.name, tok.fingerprint, tok.vocab_size, tok.eot_id)
    ids = tok.encode(sample_text)
    assert again.encode(sample_text) == ids and again.decode(ids) == tok.decode(ids)
  (directory / next(iter(tok.files()))).write_bytes(b"x")
  with pytest.raises(data.DataError, match="differs from the tokenizer saved"):
    data.saved_tokenizer(directory)


@pytest.mark.slow
def test_sampling_needs_only_the_run_directory(tmp_path, monkeypatch, capsys):
  """A run copied elsewhere samples with an empty data dir (the CLI's main, with its flags): its
  tokenizer is in tokenizer/. An older run without that copy still samples when the data dir has
  its tokenizer, and is refused without it. (The CLI's refusals, in one line and a non-zero exit
  from a process of its own: tests/test_user_errors.py.)"""
  c = tiny(**{"data.tokenizer": "bpe:300", "train.steps": 10})
  train.run(c, tmp_path / "run")
  copy = tmp_path / "copy"
  shutil.copytree(tmp_path / "run", copy)
  assert (workdir_lib.RunDir.open(copy).tokenizer / data.MANIFEST).is_file()
  empty = tmp_path / "empty_data"
  empty.mkdir()
  capsys.readouterr()
  with monkeypatch.context() as patched:  # The CLI's main, with its flags, in this process.
    patched.setenv("ACTLAB_DATA_DIR", str(empty))
    flags.FLAGS(["sample", f"--workdir={copy}", "--prompt=Once upon", "--max_tokens=10"])
    try:
      sample.main([])
    finally:
      flags.FLAGS.unparse_flags()
  text = capsys.readouterr().out
  assert text.startswith("Once upon") and len(text) > len("Once upon\n")
  assert list(empty.iterdir()) == []
  shutil.rmtree(workdir_lib.RunDir.open(copy).tokenizer)  # An older run: the data dir's.
  continue_copy = lambda: sample.continue_prompt(copy, "Once upon", 10, 0.8, 40, 0)
  assert continue_copy().startswith("Once upon")
  monkeypatch.setenv("ACTLAB_DATA_DIR", str(empty))
  with pytest.raises(data.DataError, match="neither saved in"):
    continue_copy()

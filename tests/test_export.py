"""`actlab.run.export`: a run as a Hugging Face directory whose logits (through `transformers`) and
tokenizer ids (through `AutoTokenizer`) are actlab's; what GPT-2 or BERT cannot express is one
line; `--out` never in a run or over another's files; export and import without torch."""

import json
import os
import re
import shutil
import subprocess
import sys

import jax
import ml_collections
import numpy as np
import pytest

from actlab import config as config_lib, tasks
from actlab import data
from actlab.data import hf_tokenizer, synthetic
from actlab.hf import checkpoint as hf_checkpoint
from actlab.hf import mapping
from actlab.infra import errors
from actlab.run import export, pretrained, program, train
from conftest import DEEP, REPO, SHARED_DATA, tiny
from test_classify import tiny_encoder
from test_resume import files
from test_user_errors import written_run

transformers = pytest.importorskip("transformers", reason="the hf extra is not installed")
pytest.importorskip("safetensors", reason="the hf extra is not installed")

TEXT = "Once upon a time, Lily said: \"Don't go!\" — naïve café, 123 times.\n\nThe end."
V = 257  # the byte tokenizer's; the model pads it to 320
RUN = {"exported_from": "test", "step": 0, "steps": 0, "finished": False, "status": None}


def perturbed_params(config, vocab_size, seed=0):
  """Initial parameters plus noise, so that LayerNorms and biases are not 1 and 0 (a swapped
  name would go unnoticed at the initialisation)."""
  params = program.create_step(config, vocab_size).init(seed).params
  leaves, tree = jax.tree.flatten(params)
  keys = jax.random.split(jax.random.PRNGKey(seed + 1), len(leaves))
  return jax.tree.unflatten(tree, [np.asarray(x + 0.1 * jax.random.normal(k, x.shape))
                                   for x, k in zip(leaves, keys)])


@pytest.fixture
def torch():
  """torch, for the tests that run a transformers model (export and import need none)."""
  return pytest.importorskip("torch", reason="running a transformers model needs torch: pip "
                             "install torch --index-url https://download.pytorch.org/whl/cpu")


def hf_logits(torch, directory, cls, tokens_BL, mask_BL=None):
  model = getattr(transformers, cls).from_pretrained(directory)
  model.eval()
  kwargs = {} if mask_BL is None else {"attention_mask": torch.tensor(np.asarray(mask_BL, np.int64))}
  with torch.no_grad():
    return model(torch.tensor(np.asarray(tokens_BL, np.int64)), **kwargs).logits.numpy()


@pytest.mark.slow
@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu"])
def test_decoder_logits_equal_gpt2(tmp_path, torch, activation):
  c = tiny(activation, **DEEP)  # two blocks: each maps to transformers' layer of its index
  params = perturbed_params(c, V)
  tokens = np.random.default_rng(0).integers(0, V, (2, 32))
  ours = np.asarray(tasks.get(c).objective(config_lib.typed(c), V).model.apply({"params": params}, tokens))
  hf_checkpoint.write(tmp_path, c, "gpt2", "causal_lm", params, V, 256, RUN)
  theirs = hf_logits(torch, tmp_path, "GPT2LMHeadModel", tokens)
  assert theirs.shape == (2, 32, V)  # the padded rows are dropped
  np.testing.assert_allclose(theirs, ours[..., :V], atol=1e-4, rtol=0)


@pytest.mark.slow
@pytest.mark.parametrize("task", ["mlm", "classify"])
def test_encoder_logits_equal_bert(tmp_path, torch, task):
  c = tiny_encoder(task, **DEEP)
  vocab = 300
  params = perturbed_params(c, vocab)
  tokens = np.random.default_rng(0).integers(5, vocab, (2, 32))
  mask = np.arange(32)[None] < np.array([[32], [20]])  # the second row ends in padding
  tokens[~mask] = 0
  ours = np.asarray(tasks.get(c).objective(config_lib.typed(c), vocab).model.apply({"params": params}, tokens, mask))
  hf_checkpoint.write(tmp_path, c, "bert", task, params, vocab, 3, RUN)
  cls = {"mlm": "BertForMaskedLM", "classify": "BertForSequenceClassification"}[task]
  theirs = hf_logits(torch, tmp_path, cls, tokens, mask)
  if task == "mlm":
    ours, theirs = ours[mask][:, :vocab], theirs[mask]  # padding positions are not predicted
  np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=0)


@pytest.mark.parametrize("overrides, match", [
    ({"model.activation": "swiglu"}, "gated FFN .* cannot express; use a plain activation"),
    ({"model.activation": "elu"}, "no activation equal to actlab's 'elu'"),
    ({"model.norm": "post"}, "GPT2LMHeadModel is pre-LN .* train with model.norm='pre'"),
    ({"model.qk_norm": True}, "qk_norm=True .* GPT2LMHeadModel cannot express"),
])
def test_what_gpt2_cannot_express_is_one_line(overrides, match):
  with pytest.raises(errors.UserError, match=match):
    hf_checkpoint.hf_config(tiny(**overrides), "gpt2", "causal_lm", V, 256)


def test_what_bert_cannot_express_is_one_line():
  with pytest.raises(errors.UserError, match="BertForMaskedLM is post-LN"):
    hf_checkpoint.hf_config(tiny_encoder("mlm", **{"model.norm": "pre"}), "bert", "mlm", 300, 3)
  with pytest.raises(errors.UserError, match="qk_norm=True .* BertForMaskedLM cannot express"):
    hf_checkpoint.hf_config(tiny_encoder("mlm", **{"model.qk_norm": True}), "bert", "mlm",
                            300, 3)
  with pytest.raises(errors.UserError, match="pooler is tanh"):
    hf_checkpoint.hf_config(tiny_encoder("classify", **{"model.pooler_activation": "gelu"}),
                            "bert", "classify", 300, 3)


def test_the_family_the_run_is_is_written_and_another_named_refused_in_one_line():
  """The run's config decides the class written (no family named), and the same when it is named
  (`--family`); any other named is refused in one line that names the family the run is."""
  llama = config_lib.BLOCKS["llama"]
  runs = {"gpt2": ("causal_lm", tiny()), "bert": ("mlm", tiny_encoder("mlm")),
          "llama": ("causal_lm", tiny("silu", **llama)),
          "arcee": ("causal_lm", tiny("relu2", **{**llama, "model.ffn": "plain"})),
          "qwen3": ("causal_lm", tiny("silu", **{**llama, "model.qk_norm": True}))}
  assert set(runs) == set(mapping.FAMILIES)
  for family, (task, c) in runs.items():
    cls = mapping.FAMILIES[family].classes[task]
    for named in (None, family):
      fields = hf_checkpoint.hf_config(c, named, task, V, 256)
      assert (fields["model_type"], fields["architectures"]) == (family, [cls])
    for other in set(runs) - {family}:
      with pytest.raises(errors.UserError) as refused:
        hf_checkpoint.hf_config(c, other, task, V, 256)
      assert str(refused.value) == (f"export: --family={other}: this run's model is {family}'s "
                                    f"({cls}); pass --family={family}, or no --family")


def actlab_tokenizers(tmp_path):
  texts = lambda: list(synthetic.texts("train"))[:400]
  toks = [data.tokenizer_of("byte", directory=tmp_path),
          data.tokenizer_of("bpe:300", directory=tmp_path, train_texts=texts),
          data.tokenizer_of("wordpiece:300", directory=tmp_path, train_texts=texts)]
  if (SHARED_DATA / "gpt2" / "encoder.json").is_file():  # else gpt2 is left out (no network)
    toks.append(data.tokenizer_of("gpt2", directory=tmp_path, gpt2_dir=SHARED_DATA / "gpt2"))
  return toks


@pytest.mark.slow
def test_autotokenizer_gives_actlab_ids(tmp_path):
  sample_text = TEXT + " " + " ".join(list(synthetic.texts("validation"))[:20])
  for tok in actlab_tokenizers(tmp_path):
    directory = tmp_path / tok.name.replace(":", "")
    hf_tokenizer.write(tok, directory, 128)
    hf_tok = transformers.AutoTokenizer.from_pretrained(directory)
    ids = tok.encode(sample_text)
    assert hf_tok(sample_text, add_special_tokens=False)["input_ids"] == ids, tok.name
    assert len(hf_tok) == tok.vocab_size, tok.name
    if tok.name.startswith("wordpiece"):
      assert hf_tok(sample_text)["input_ids"] == [tok.cls_id, *ids, tok.sep_id]
      assert (hf_tok.mask_token_id, hf_tok.pad_token_id) == (tok.mask_id, tok.pad_id)
    else:
      assert hf_tok.eos_token_id == tok.eot_id
      assert hf_tok.decode(ids) == tok.decode(ids)


@pytest.mark.slow
def test_gpt2_merges_are_openais():
  if not (SHARED_DATA / "gpt2" / "vocab.bpe").is_file():
    pytest.skip("../shared/data/gpt2 is absent")
  tok = data.tokenizer_of("gpt2", directory="unused", gpt2_dir=SHARED_DATA / "gpt2")
  symbol = hf_tokenizer.bytes_to_unicode()
  ours = [" ".join("".join(symbol[b] for b in part) for part in m)
          for m in hf_tokenizer.merges_of(tok.mergeable_ranks())]
  theirs = (SHARED_DATA / "gpt2" / "vocab.bpe").read_text(encoding="utf-8").splitlines()[1:]
  assert ours == [m for m in theirs if m]


# `python -c NO_TORCH <module> <flags>` runs the module with `import torch` failing.
NO_TORCH = ("import runpy, sys; sys.modules['torch'] = None; "
            "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)")


def export_cli(workdir, out, family=None):
  """The export CLI, without torch (`family` None: no --family)."""
  return subprocess.run([sys.executable, "-c", NO_TORCH, "actlab.run.export", f"--workdir={workdir}",
                         f"--out={out}", *([f"--family={family}"] if family else [])], cwd=REPO,
                        capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  """A finished tiny decoder run that kept two checkpoints."""
  workdir = tmp_path_factory.mktemp("trained")
  train.run(tiny(**{"train.steps": 8, "train.checkpoint_every": 4}), workdir)
  return workdir


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
  """`trained` exported through the CLI, without torch: its directory."""
  out = tmp_path_factory.mktemp("exported")
  result = export_cli(trained, out)
  assert result.returncode == 0, result.stderr
  assert f"wrote {out}: GPT2LMHeadModel from {trained} step 8 of 8, tokenizer" in result.stdout
  return out


@pytest.mark.slow
def test_export_cli_of_a_trained_decoder(trained, exported, torch):
  """A few steps of training, exported through the CLI: transformers' logits are actlab's, and
  its loss is actlab's less the padded rows' share."""
  config, _, task, params, _ = pretrained.load_run(trained)
  tokens = np.random.default_rng(0).integers(0, V, (2, 33))
  ours = np.asarray(task.objective.model.apply({"params": params}, tokens[:, :-1]))
  model = transformers.GPT2LMHeadModel.from_pretrained(exported)
  with torch.no_grad():
    logits = model(torch.tensor(tokens[:, :-1])).logits
    hf_loss = float(torch.nn.functional.cross_entropy(logits.reshape(-1, V),
                                                      torch.tensor(tokens[:, 1:]).reshape(-1)))
  np.testing.assert_allclose(logits.numpy(), ours[..., :V], atol=1e-4, rtol=0)
  out = task.objective(params, tokens, jax.random.PRNGKey(0), train=False)
  loss = float(out.loss_sum) / int(out.count)
  # The losses differ by exactly the padded rows' share of actlab's softmax (large after 8 steps
  # from the initialisation; training drives those logits down).
  share = np.mean(jax.nn.logsumexp(ours, -1) - jax.nn.logsumexp(ours[..., :V], -1))
  np.testing.assert_allclose(loss - hf_loss, share, atol=1e-4)


@pytest.mark.slow
def test_export_cli_refuses_what_gpt2_cannot_express_in_one_line(trained, tmp_path):
  """hf_checkpoint's refusal (`test_what_gpt2_cannot_express_is_one_line`) through the CLI, once
  the run and transformers are loaded: one line, exit code 2, nothing written. The run is
  `trained` relabelled model.activation='elu': gelu's parameters, but no transformers activation
  equals it."""
  relabelled = tmp_path / "elu"
  shutil.copytree(trained, relabelled)
  config = json.loads((relabelled / "config.json").read_text())
  config["model"]["activation"] = "elu"
  (relabelled / "config.json").write_text(json.dumps(config))
  refused = export_cli(relabelled, tmp_path / "hf")
  assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
  assert refused.stderr.startswith("error: export: transformers has no activation equal to "
                                   "actlab's 'elu'"), refused.stderr
  assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_export_cli_refuses_a_family_the_run_is_not_in_one_line(trained, tmp_path):
  """A GPT-2-block run named `--family=llama`: one line, exit code 2, nothing written; the line
  says what to pass (without --family the run is written as gpt2: `exported`)."""
  refused = export_cli(trained, tmp_path / "hf", "llama")
  assert refused.returncode == 2 and refused.stderr.strip() == (
      "error: export: --family=llama: this run's model is gpt2's (GPT2LMHeadModel); pass "
      "--family=gpt2, or no --family"), refused.stderr
  assert not (tmp_path / "hf").exists()


@pytest.mark.slow
@pytest.mark.parametrize("where, message", [
    ("workdir", "is a run directory"),
    ("inside the workdir", "lies inside {trained}, which is a run directory"),
    ("another run", "is a run directory"),
    ("foreign", "holds files that actlab.run.export did not write")])
def test_export_refuses_an_out_in_a_run_or_over_other_files(trained, tmp_path, where, message):
  """Nothing written: --out is the workdir, lies inside it, is another run's directory, or holds
  files that are not an earlier export's."""
  shutil.copytree(trained, tmp_path / "another run")
  (tmp_path / "foreign").mkdir()
  (tmp_path / "foreign" / "notes.txt").write_text("mine")
  out = {"workdir": trained, "inside the workdir": trained / "hf"}.get(where, tmp_path / where)
  before = [files(trained), files(tmp_path)]
  with pytest.raises(errors.UserError) as refused:
    export.write(trained, out, "gpt2")
  message = message.format(trained=trained.resolve())
  assert str(refused.value).startswith(f"--out {out} {message}"), refused.value
  assert [files(trained), files(tmp_path)] == before


def test_export_refuses_a_run_whose_activation_is_unregistered(tmp_path):
  """In one line, as actlab.main and actlab.sample do (tests/test_user_errors.py)."""
  run = written_run(tmp_path / "run", activation="myact")
  with pytest.raises(errors.UserError, match=rf"^{re.escape(str(run))} holds a run with "
                     "model.activation: unknown activation 'myact'; valid names: "):
    export.write(run, tmp_path / "hf", "gpt2")
  assert not (tmp_path / "hf").exists()


@pytest.mark.slow
def test_export_says_which_step_of_how_many_and_may_redo_its_own_output(trained, tmp_path):
  """An unfinished run (no summary.json; killed after its first checkpoint), a finished and a
  diverged one, exported into the same directory: the line and config.json's `actlab` entry say
  which step of how many, and whether the run finished. An export is refused as --workdir."""
  config = json.loads((trained / "config.json").read_text())
  every, steps = config["train"]["checkpoint_every"], config["train"]["steps"]
  unfinished, diverged, out = tmp_path / "unfinished", tmp_path / "diverged", tmp_path / "hf"
  shutil.copytree(trained, unfinished)
  (unfinished / "summary.json").unlink()
  shutil.rmtree(unfinished / "checkpoints" / str(steps))
  shutil.copytree(trained, diverged)
  summary = json.loads((trained / "summary.json").read_text())
  (diverged / "summary.json").write_text(json.dumps({**summary, "status": "diverged"}))
  for workdir, step, state, status in [(unfinished, every, " (unfinished)", None),
                                       (trained, steps, "", summary["status"]),
                                       (diverged, steps, " (diverged)", "diverged")]:
    line = export.write(workdir, out)
    assert f"from {workdir} step {step} of {steps}{state}, tokenizer" in line
    assert json.loads((out / "config.json").read_text())["actlab"] == {
        "exported_from": os.path.relpath(workdir, out), "step": step, "steps": steps,
        "finished": status is not None, "status": status}  # no machine path
  with pytest.raises(errors.UserError, match="holds no run"):  # An export is no run.
    export.write(out, tmp_path / "again", "gpt2")


@pytest.mark.slow
def test_import_of_an_export_needs_no_torch(trained, exported, monkeypatch):
  """`train.init_from=hf:` an export (written without torch, `exported`), with `import torch`
  failing, gives the run's own logits."""
  monkeypatch.setitem(sys.modules, "torch", None)
  config, _, task, params, _ = pretrained.load_run(trained)
  config = config_lib.override(ml_collections.ConfigDict(config.fields),
                               {"train.init_from": f"hf:{exported}"})
  source = pretrained.init_from_config(config, V)
  imported = pretrained.params_from(config, source, task.init(1).params, V)
  tokens = np.random.default_rng(0).integers(0, V, (2, 32))
  ours, theirs = (np.asarray(task.objective.model.apply({"params": p}, tokens)[..., :V])
                  for p in (params, imported))
  np.testing.assert_allclose(theirs, ours, atol=1e-6, rtol=0)

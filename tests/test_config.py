"""Configs: every shipped file loads and validates, and resolves to its snapshot; sizes, arguments,
overrides; bad values give one readable line.

`config_snapshots.json` holds every shipped config file × variant and every sweep × variant's
cells as resolved before the sizes table existed (configs and cells as differences from
configs/tinystories_gelu.py and from their base config). Run directories compare their
config.json to these, so a change is a deliberate one: then `python tests/test_config.py`
rewrites the snapshot.
"""

import dataclasses
import functools
import json
import pathlib
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import ml_collections
import pytest
from absl import flags
from ml_collections import config_flags

from actlab import config as config_lib
from actlab import core, tasks
from actlab.config import schema, sizes
from actlab.core import activations, kernels
from actlab.core.model import MARKS
from actlab.data import tokenizer
from actlab.hf import checkpoint as hf_checkpoint, mapping
from actlab.infra import errors, workdir
from actlab.report import load as report_load
from actlab.run import program
from actlab.sweep import grid
from conftest import REPO, tiny

CONFIG_FILES = sorted((REPO / "configs").glob("*.py"))
BY_ARGUMENT = ("decoder.py", "encoder.py")  # compared with the files they generalise, not snapshot
SNAPSHOT = pathlib.Path(__file__).with_name("config_snapshots.json")
REFERENCE = "configs/tinystories_gelu.py"
DECODER_VARIANTS = ["", "smoke"]
ENCODER_VARIANTS = ["", "smoke", "base", "classify", "smoke_classify", "base_classify"]
OTHER_CONFIGS = {"benchmarks/gpt2_small.py": ["", "fp32", "smoke"],
                 "tests/tiny_config.py": ["", "swiglu"]}
SWEEP_FILES = [*(p for p in sorted((REPO / "experiments").glob("*.py"))
                 if "def get_sweep(" in p.read_text()), REPO / "benchmarks/six_run_study.py"]
# The variants of each sweep file in the snapshot (default: none and `:smoke`), and the config
# each runs on (default: the reference).
SWEEP_VARIANTS = {"relu_vs_gelu_lr": ["", "smoke", "smoke_llama"],
                  "mup_transfer": ["cpu_epoch", "smoke"]}
SWEEP_BASES = {"bert_ffn_activation": ["configs/bert_gelu.py", "configs/bert_gelu.py"],
               "bert_pooler": ["configs/bert_gelu.py:classify",
                               "configs/bert_gelu.py:smoke_classify"]}


def load(*argv):
  """Parses `--config=...` and overrides exactly as actlab.main does."""
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=fv, sys_argv=["prog", *argv])
  fv(["prog", *argv])
  return fv.config


def load_spec(spec: str) -> ml_collections.ConfigDict:
  """`load` of a repository-relative `path[:variant]`."""
  return load(f"--config={REPO}/{spec}")


def flat(config: ml_collections.ConfigDict) -> dict:
  """{"section.field": (type name, value)}: 1 and 1.0 differ in a config."""
  return {f"{section}.{field}": (type(value).__name__, value)
          for section, fields in config.to_dict().items() for field, value in fields.items()}


def changes(new: dict, old: dict) -> dict:
  return {k: v[1] for k, v in new.items() if old.get(k) != v}


def expect(reference: dict, changed: dict) -> dict:
  """The flat config that is `reference` with the snapshot's `changed` values."""
  return {**reference, **{k: (type(v).__name__, v) for k, v in changed.items()}}


def config_specs() -> list[str]:
  files = [f"configs/{p.name}" for p in CONFIG_FILES if p.name not in BY_ARGUMENT]
  specs = {f: ENCODER_VARIANTS if "/bert_" in f else DECODER_VARIANTS for f in files}
  return [f + (f":{v}" if v else "") for f, variants in {**specs, **OTHER_CONFIGS}.items()
          for v in variants]


def sweep_specs() -> dict[str, str]:
  """{sweep spec: the spec of the config it runs on}."""
  variants = {p: SWEEP_VARIANTS.get(p.stem, ["", "smoke"]) for p in SWEEP_FILES}
  return {f"{p.relative_to(REPO)}{':' + v if v else ''}":
          SWEEP_BASES.get(p.stem, [REFERENCE] * len(variants[p]))[i]
          for p in SWEEP_FILES for i, v in enumerate(variants[p])}


def take_snapshot() -> dict:
  reference = flat(load_spec(REFERENCE))
  configs = {spec: flat(load_spec(spec)) for spec in config_specs()}
  sweeps = {}
  for spec, base in sweep_specs().items():
    cells = grid.cells(load_spec(base), grid.load(f"{REPO}/{spec}"))
    sweeps[spec] = {"base": base, "cells": {c.name: changes(flat(c.config), configs[base])
                                            for c in cells}}
  return {"reference": {k: v for k, (_, v) in reference.items()},
          "configs": {spec: changes(c, reference) for spec, c in configs.items()},
          "sweeps": sweeps}


def line(key: str, value, indent: int) -> str:
  return f"{' ' * indent}{json.dumps(key)}: {json.dumps(value)}"


def write_snapshot(snapshot: dict) -> None:
  """One line per config and per sweep cell, so that a change shows as the lines it changes."""
  sweeps = [f'  {json.dumps(spec)}: {{"base": {json.dumps(s["base"])}, "cells": {{\n'
            + ",\n".join(line(name, c, 4) for name, c in s["cells"].items()) + "}}"
            for spec, s in snapshot["sweeps"].items()]
  SNAPSHOT.write_text(
      "{" + line("reference", snapshot["reference"], 0) + ',\n"configs": {\n'
      + ",\n".join(line(spec, c, 2) for spec, c in snapshot["configs"].items())
      + '},\n"sweeps": {\n' + ",\n".join(sweeps) + "}}\n")


@functools.cache
def snapshots() -> dict:
  return json.loads(SNAPSHOT.read_text())


def snapshot_config(spec: str) -> dict:
  """The flat config the snapshot holds for `spec`."""
  reference = {k: (type(v).__name__, v) for k, v in snapshots()["reference"].items()}
  return expect(reference, snapshots()["configs"][spec])


def test_snapshot_covers_every_shipped_file():
  assert sorted(snapshots()["configs"]) == sorted(config_specs())
  assert sorted(snapshots()["sweeps"]) == sorted(sweep_specs())


@pytest.mark.parametrize("spec", config_specs())
def test_config_is_its_snapshot(spec):
  assert flat(load_spec(spec)) == snapshot_config(spec)


@pytest.mark.parametrize("spec", sweep_specs())
def test_sweep_cells_are_their_snapshot(spec):
  snap = snapshots()["sweeps"][spec]
  base = load_spec(snap["base"])
  base_flat = snapshot_config(snap["base"])
  assert flat(base) == base_flat
  cells = grid.cells(base, grid.load(f"{REPO}/{spec}"))
  assert [c.name for c in cells] == list(snap["cells"])
  for cell in cells:
    assert flat(cell.config) == expect(base_flat, snap["cells"][cell.name]), cell.name


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: p.name)
@pytest.mark.parametrize("variant", [None, "smoke"])
def test_every_config_file_validates(path, variant):
  c = load(f"--config={path}:{variant}" if variant else f"--config={path}")
  config_lib.validate(c)


@pytest.mark.parametrize("activation", ["gelu", "swiglu"])
@pytest.mark.parametrize("size", sizes.DECODER_SIZES)
def test_decoder_by_argument_is_the_activation_file(activation, size):
  c = load_spec(f"configs/decoder.py:{size},act={activation}")
  assert c.to_dict() == load_spec(f"configs/tinystories_{activation}.py:{size}").to_dict()
  config_lib.validate(c)


@pytest.mark.parametrize("variant, size, task", [
    ("", "small", "mlm"), ("smoke", "smoke", "mlm"), ("base", "base", "mlm"),
    ("mini", "mini", "mlm"), ("classify", "small", "classify"),
    ("smoke_classify", "smoke", "classify"),
    ("base_classify", "base", "classify")])
def test_encoder_by_argument_is_the_activation_file(variant, size, task):
  c = load_spec(f"configs/encoder.py:act=relu,size={size},task={task}")
  assert c.to_dict() == load_spec(f"configs/bert_relu.py:{variant}").to_dict()
  config_lib.validate(c)


def test_every_size_builds_a_valid_config():
  for size in sizes.DECODER_SIZES:
    config_lib.validate(config_lib.decoder("gelu", size))
  for size in sizes.ENCODER_SIZES:
    config_lib.validate(config_lib.encoder("gelu", size))
  for size in sizes.CLASSIFY_SETTINGS:
    config_lib.validate(config_lib.encoder("gelu", size, "classify"))


def test_reference_size_is_the_base():
  assert (config_lib.override(config_lib.base(), sizes.SIZES["reference"]).to_dict()
          == config_lib.base().to_dict())


@pytest.mark.parametrize("size, vocab, total", [
    ("smoke", 257, 454_144), ("cpu", 4096, 937_472), ("reference", 50257, 30_013_440),
    ("gpt2_small", 50257, 124_475_904)])
def test_parameter_counts_in_the_sizes_table(size, vocab, total):
  c = config_lib.decoder("gelu", size)
  model = tasks.get(c).objective(config_lib.typed(c), vocab).model
  shapes = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32)))
  assert core.count_params(shapes["params"])["total"] == total


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
    ("model.activation", "gelu2", "model.activation: unknown activation 'gelu2'; did you mean "
                                  "'gelu'? valid names: "),
    ("model.activation", "swish", "model.activation: unknown activation 'swish'; did you mean "
                                  "'silu'? valid names: "),
    ("model.activation", "GELU", "model.activation: unknown activation 'GELU'; did you mean "
                                 "'gelu'? valid names: "),
    ("model.activation", "SwiGLU", "model.activation: unknown activation 'SwiGLU'; did you mean "
                                   "'swiglu'? valid names: "),
    ("model.num_heads", 5, "model.d_model=32 is not divisible by model.num_heads=5"),
    ("optim.lr", 0.0, "optim.lr=0.0 must be positive"),
    ("optim.lr", -1e-3, "optim.lr=-0.001 must be positive"),
    ("train.steps", 0, "train.steps=0 must be positive"),
    ("train.batch_size", -2, "train.batch_size=-2 must be positive"),
    ("data.seq_len", 64, "data.seq_len=64 is longer than model.max_len=32"),
    ("model.norm", "sandwich", "model.norm='sandwich': choose 'pre' or 'post'"),
    ("data.tokenizer", "bpe:abc", "data.tokenizer: unknown tokenizer 'bpe:abc'; choose"),
    ("optim.warmup_steps", 50, "optim.warmup_steps=50 must be >= 0 and < train.steps=50: set "
                               "--config.optim.warmup_steps=5 (a tenth of the steps)"),
])
def test_validate_gives_one_readable_line(field, value, message):
  c = tiny(**{field: value})
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.validate(c)
  assert str(e.value).startswith(message) and "\n" not in str(e.value)


@pytest.mark.parametrize("field, value, message", [
    ("optim.b2", 1.0, "optim.b2=1.0 must be in [0, 1)"),
    ("optim.min_lr_ratio", 1.5, "optim.min_lr_ratio=1.5 must be in [0, 1]"),
    ("metrics.ffn_hist_bins", 501, "metrics.ffn_hist_bins=501 must be in [0, 500] (0 = off)"),
    ("optim.clip_norm", -1.0, "optim.clip_norm=-1.0 must be >= 0 (0 disables)"),
    ("metrics.wandb_mode", "sometimes", "metrics.wandb_mode='sometimes': choose '', 'online', "
                                        "'offline' or 'disabled'"),
])
def test_each_field_is_checked_by_the_rule_written_with_it(field, value, message):
  """schema.py gives a field its default, its rule and its comment in one place; `validate`
  applies the rule (a ValueError, as the core's dataclasses raise it) as a `ConfigError`."""
  section, name = field.split(".")
  declared = {f.name: f for f in dataclasses.fields(schema.SECTIONS[section])}[name]
  with pytest.raises(ValueError, match=re.escape(message)):
    declared.metadata["rule"](field, value)
  with pytest.raises(config_lib.ConfigError, match=re.escape(message)):
    config_lib.validate(tiny(**{field: value}))


def test_a_field_no_section_declares_is_refused_not_ignored():
  """A config file that sets a field schema.py does not declare (a misspelling) would train
  without it: `validate` refuses it, with the closest name; a field the config lacks is one
  line too."""
  c = tiny()
  c.model.actvation = "relu"
  with pytest.raises(config_lib.ConfigError, match=re.escape(
      "model.actvation: no such field (model has no field 'actvation'; did you mean "
      "'model.activation'?)")):
    config_lib.validate(c)
  c = config_lib.encoder("gelu", "smoke")
  c.data.mlm_probability = 0.2
  with pytest.raises(config_lib.ConfigError, match="did you mean 'data.mlm_prob'"):
    config_lib.validate(c)
  config_lib.validate(config_lib.encoder("gelu", "smoke"))  # its own fields are declared
  c = tiny()
  del c.model["position"]  # e.g. a config.json from before the field existed, loaded as a config
  with pytest.raises(config_lib.ConfigError, match=r"^model.position is missing: a config starts "):
    config_lib.validate(c)


def test_the_default_config_is_the_schemas_and_the_cores_defaults():
  """`base()` is schema.py's defaults, section by section and in order; a field the core owns
  has the core's default."""
  c = json.loads(config_lib.base().to_json())  # in the order a config.json holds it
  assert list(c) == list(schema.SECTIONS)
  for section, cls in schema.SECTIONS.items():
    assert list(c[section].items()) == [(f.name, f.default) for f in dataclasses.fields(cls)]
    for f in dataclasses.fields(cls):
      if "core" in f.metadata:
        core_default = {g.name: g.default for g in dataclasses.fields(f.metadata["core"])}
        assert f.default == core_default[f.name], f"{section}.{f.name}"


def fields_of(*section_maps):
  """{"section.field": the dataclass field} of the sections (schema.SECTIONS, schema.ENCODER)."""
  return {f"{name}.{f.name}": f for sections in section_maps for name, cls in sections.items()
          for f in dataclasses.fields(cls)}


def test_a_fields_marks_are_those_the_core_documents():
  """Besides its rule, help, choices and class, a field carries only `MARKS` (core/model.py),
  each at one of its values: a misspelt mark would leave the field out of every derived list."""
  for key, f in fields_of(schema.SECTIONS, schema.ENCODER).items():
    marks = {k: v for k, v in f.metadata.items() if k not in ("rule", "help", "choices", "core")}
    assert all(v in MARKS.get(k, ()) for k, v in marks.items()), (key, marks)
  with pytest.raises(AssertionError):
    core.model.option(0, init_from="refused")


def test_init_from_checks_the_fields_marked_so():
  """`config.INIT_FROM` (what `train.init_from` does where the run started from differs) is the
  `init_from` marks: another value of a field that makes the model's parameters or its tokens is
  refused (the block's `qk_norm` and `norm_eps` too, which it once let pass), another RoPE base is
  said; dropout, the execution, the loss and the harness are not compared. A Hugging Face
  directory's fields are compared by the same marks (`hf_checkpoint.FIELDS`)."""
  assert {k for k, how in config_lib.INIT_FROM.items() if how == "say"} == {"model.rope_theta"}
  refused = {k for k, how in config_lib.INIT_FROM.items() if how == "refuse"}
  assert {"model.qk_norm", "model.norm_eps", "model.kind", "model.type_vocab_size",
          "data.tokenizer"} <= refused
  assert {f"model.{f.name}" for f in dataclasses.fields(core.Spec)} - refused == {
      "model.dropout", "model.rope_theta"}
  assert not {f"model.{f.name}" for f in dataclasses.fields(core.Execution)} & refused
  assert {f"model.{f}" for fields in hf_checkpoint.FIELDS.values() for f in fields} <= refused


def test_the_blocks_fields_are_one_list_every_block_list_derives_from():
  """The block's fields are those marked `block` (`config.BLOCK_FIELDS`), each in docs/running.md's
  table; GPT-2's block (`GPT2_BLOCK`) is its form's at their defaults, which the Hugging Face
  families fix (`mapping.BLOCKS`) and the encoder keeps (another value of any other it takes);
  the LLaMA-style block sets block fields; a report names them all (`report.load`)."""
  fields = config_lib.BLOCK_FIELDS
  assert fields == ("norm", "norm_type", "norm_eps", "position", "rope_theta", "bias", "tie_head",
                    "ffn", "qk_norm")
  table = (REPO / "docs" / "running.md").read_text().split("### The block, field by field")[1]
  assert all(f"`{name}`" in table.split("\n## ")[0] for name in fields)
  form = {k.removeprefix("model."): v for k, v in config_lib.marked("block").items()}
  assert config_lib.GPT2_BLOCK == {k: getattr(core.Spec, k) for k in fields if form[k] == "form"}
  assert mapping.BLOCKS["gpt2"] == config_lib.GPT2_BLOCK
  assert set(mapping.BLOCKS["llama"]) == set(config_lib.GPT2_BLOCK)
  assert {k.removeprefix("model.") for k in config_lib.BLOCKS["llama"]} <= set(fields)
  assert report_load.GPT2_BLOCK == {f"model.{k}": getattr(core.Spec, k) for k in fields}
  encoder = config_lib.encoder("gelu", "smoke")
  for name in fields:
    choices = fields_of(schema.SECTIONS)[f"model.{name}"].metadata.get("choices")
    value = encoder.model[name]
    other = (not value if isinstance(value, bool) else value * 2 if isinstance(value, float)
             else next(c for c in choices if c != value))
    c = config_lib.override(config_lib.encoder("gelu", "smoke"), {f"model.{name}": other})
    if form[name] == "form":
      with pytest.raises(config_lib.ConfigError, match=f"model.{name}={other!r}"):
        config_lib.validate(c)
    else:
      config_lib.validate(c)


STUDIES = sorted({p.parent.parent for p in (REPO / "results").glob("*/*/config.json")})


@pytest.mark.parametrize("study", STUDIES, ids=lambda p: p.name)
def test_every_committed_config_json_loads_and_means_what_it_meant(study):
  """Each committed run's config.json, read as a resume, `train.init_from` and `load_run` read it
  (`workdir.run_config`), is the file (its ADDED_FIELDS at their values of then, as the report
  reads it), validates, resumes (the workdir's check passes) and builds the core's dataclasses
  from the file's fields of the same names: `Spec` and `Execution` from `model` (the vocabulary:
  the file's, else the tokenizer's, padded), `OptimSpec` from `optim` with `train.steps`, and the
  task's objective from the rest."""
  vocab = 257  # stands in for the tokenizer's
  unmoved = lambda config: {k: v for k, v in workdir.dotted(config).items()
                            if k not in workdir.DATA_PATHS}  # paths are read against the run's
  names = lambda cls: [f.name for f in dataclasses.fields(cls)]
  for path in sorted(study.glob("*/config.json")):
    file = workdir.with_added_fields(json.loads(path.read_text()))
    m, o, where = file["model"], file["optim"], str(path)
    loaded = workdir.run_config(path.parent)
    assert unmoved(loaded) == unmoved(file), where
    c = ml_collections.ConfigDict(loaded)
    config_lib.validate(c)
    workdir.RunDir(path.parent, path.parent).check_config(c.to_dict(), config_lib.RUNTIME_FIELDS)
    step = program.create_step(c, vocab)
    objective, model = step.objective, step.objective.model
    assert dataclasses.asdict(model.spec) == {
        **{name: m[name] for name in names(core.Spec)},
        "vocab_size": core.pad_vocab(m["vocab_size"] or vocab)}, where
    assert dataclasses.asdict(model.execution) == {n: m[n] for n in names(core.Execution)}, where
    assert dataclasses.asdict(step.optim) == {
        **{name: o[name] for name in names(core.OptimSpec) if name != "total_steps"},
        "total_steps": file["train"]["steps"]}, where
    assert objective.z_loss == o["z_loss"], where
    if m["kind"] == "decoder":
      assert model.execution.loss_impl == m["loss_impl"], where
    else:
      assert (model.head, model.type_vocab_size) == (m["task"], m["type_vocab_size"]), where
    if m.get("task") == "mlm":
      assert (objective.prob, objective.mask_frac, objective.random_frac) == (
          file["data"]["mlm_prob"], file["data"]["mlm_mask_frac"],
          file["data"]["mlm_random_frac"]), where
    if m.get("task") == "classify":
      assert (model.pooler_activation, model.num_classes) == (
          m["pooler_activation"], m["num_classes"]), where


@pytest.mark.parametrize("spec", ["bpe:abc", "bpe:100", "wordpiece:5", "gpt-2", "BYTE"])
@pytest.mark.parametrize("kind", ["decoder", "encoder"])
def test_validate_reports_the_tokenizer_parser_message(spec, kind):
  with pytest.raises(ValueError) as parsed:
    tokenizer.parse_spec(spec)
  c = getattr(config_lib, kind)("gelu", "smoke")
  c.data.tokenizer = spec
  with pytest.raises(config_lib.ConfigError) as validated:
    config_lib.validate(c)
  assert str(validated.value) == f"data.tokenizer: {parsed.value}"


def test_unknown_variant():
  with pytest.raises(config_lib.ConfigError,
                     match="unknown config variant 'big'; choose one of: 'smoke'"):
    config_lib.decoder("gelu", "big")
  with pytest.raises(config_lib.ConfigError,
                     match="unknown encoder config variant 'mini_classify'; choose one of: 'mini'"):
    config_lib.encoder("gelu", "mini_classify")
  with pytest.raises(config_lib.ConfigError, match="encoder task 'clasify': choose 'mlm' or"):
    config_lib.encoder("gelu", "smoke", "clasify")


# --- parse_arg, parse_overrides, override --------------------------------------------------------


def test_parse_arg_converts_to_the_defaults_types():
  a = config_lib.parse_arg("size=smoke,layers=3,lr=1e-2,fast=True", size="reference", act="gelu",
                           layers=6, lr=1e-3, fast=False)
  assert a.to_dict() == {"size": "smoke", "act": "gelu", "layers": 3, "lr": 1e-2, "fast": True}
  assert config_lib.parse_arg("smoke, act=swiglu", size="x", act="gelu").to_dict() == {
      "size": "smoke", "act": "swiglu"}
  assert config_lib.parse_arg(None, size="reference").size == "reference"


@pytest.mark.parametrize("arg, message", [
    ("sise=smoke", "unknown config argument 'sise=smoke'; use size, act, layers"),
    ("smoke,gelu", "unknown config argument 'gelu'; use size, act, layers"),
    ("layers=two", "config argument 'layers=two': expected int"),
])
def test_parse_arg_refuses_unknown_keys_and_bad_values(arg, message):
  with pytest.raises(config_lib.ConfigError, match=message):
    config_lib.parse_arg(arg, size="reference", act="gelu", layers=6)


def test_config_file_argument_errors():
  for arg, message in [("sise=smoke", "unknown config argument 'sise=smoke'"),
                       ("size=huge", "unknown config variant 'huge'")]:
    with pytest.raises(config_lib.ConfigError, match=message):
      errors.call_file(f"{REPO}/configs/decoder.py", "get_config", arg, kind="config")


def test_parse_overrides_reads_values_like_the_command_line():
  assert config_lib.parse_overrides(
      "model.loss_impl=plain, train.steps=3,optim.lr=1e-3,model.scan_layers=true,"
      "data.classify=glue/sst2,train.progress=False,") == {
          "model.loss_impl": "plain", "train.steps": 3, "optim.lr": 1e-3,
          "model.scan_layers": True, "data.classify": "glue/sst2", "train.progress": False}
  with pytest.raises(config_lib.ConfigError, match="override 'train.steps': write section.field"):
    config_lib.parse_overrides("train.steps")


def test_override_sets_fields_and_returns_the_config():
  c = tiny()
  assert config_lib.override(c, {"optim.lr": 1, "model.scan_layers": True}) is c
  assert (c.optim.lr, type(c.optim.lr), c.model.scan_layers) == (1.0, float, True)
  nested = ml_collections.ConfigDict({"a": {"b": {"c": 1}}})
  assert config_lib.override(nested, {"a.b.c": 2}).a.b.c == 2


@pytest.mark.parametrize("key, value, message", [
    ("optim.lrr", 1e-3, "optim.lrr: no such field (optim has no field 'lrr'; did you mean "
                        "'optim.lr'?)"),
    ("optimizer.lr", 1e-3, "optimizer.lr: no such field (the config has no section 'optimizer'; "
                           "did you mean 'optim.lr'?)"),
    ("model", "big", "model: no such field"),
    ("model.d_model.x", 1, "model.d_model.x: no such field"),
    ("train.steps", "many", "train.steps='many': expected int, got str"),
    ("model.scan_layers", 1, "model.scan_layers=1: expected bool, got int"),
])
def test_override_refuses_unknown_fields_and_wrong_types(key, value, message):
  with pytest.raises(config_lib.ConfigError) as e:
    config_lib.override(tiny(), {key: value})
  assert str(e.value) == message or str(e.value).startswith(message + " (")


def test_override_in_a_nested_section_suggests_the_field():
  nested = ml_collections.ConfigDict({"a": {"b": {"count": 1}}})
  with pytest.raises(config_lib.ConfigError,
                     match=r"a.b.cout: no such field \(a.b has no field 'cout'; did you mean "
                           r"'a.b.count'\?\)"):
    config_lib.override(nested, {"a.b.cout": 2})


def test_sweep_and_tests_use_the_same_override():
  spec = grid.parse({"axes": {"optim.lrr": [1e-3]}})
  with pytest.raises(config_lib.ConfigError,
                     match="^sweep cell lrr=0.001,seed=0: optim.lrr: no such field"):
    grid.cells(tiny(), spec)
  with pytest.raises(config_lib.ConfigError, match="^optim.lrr: no such field"):
    tiny(**{"optim.lrr": 1e-3})


if __name__ == "__main__":
  write_snapshot(take_snapshot())


@pytest.mark.slow
def test_every_field_is_listed_with_its_default_and_comment():
  """`python -m actlab.config` lists every field of both configs, and every field of `base()`
  carries the help written with it (the listing reads it from the field: it cannot drift)."""
  listed = config_lib.listing()
  for c in (config_lib.base(), config_lib.encoder()):
    for section, values in c.to_dict().items():
      for name in values:
        assert f"  {section}.{name} = " in listed, f"{section}.{name}"
  notes = {f"{section}.{f.name}": f.metadata["help"]
           for section, cls in [*schema.SECTIONS.items(), *schema.ENCODER.items()]
           for f in dataclasses.fields(cls)}
  assert notes["model.activation"] == "FFN activation: a name from actlab.core.activations.NAMES"
  assert notes["model.loss_impl"].endswith("or \"plain\" (logits, then cross-entropy)")
  assert "  data.mlm_prob = 0.15 [encoder]" in listed
  assert "  model.norm = 'pre' [encoder: 'post']" in listed
  out = subprocess.run([sys.executable, "-m", "actlab.config"], capture_output=True, text=True,
                       cwd=REPO, timeout=120)
  assert out.returncode == 0 and "  optim.lr = 0.001" in out.stdout
  helpfull = subprocess.run([sys.executable, "-m", "actlab.main", "--helpfull"],
                            capture_output=True, text=True, cwd=REPO, timeout=120).stdout
  assert "python -m actlab.config" in helpfull


def test_activation_fields_list_the_names_of_the_registry():
  """The listing names every activation for model.activation and the plain ones for the pooler,
  as `actlab.core.activations` has them."""
  listed = config_lib.listing()
  words = lambda key: set(re.findall(r"\w+", re.search(
      rf"^  {re.escape(key)} = .*(?:\n {{6}}.*)*", listed, re.M)[0]))  # its line and its notes
  gated = {n for n in activations.NAMES if activations.get(n).gated}
  assert set(activations.NAMES) <= words("model.activation")
  pooler = words("model.pooler_activation")
  assert set(activations.NAMES) - gated <= pooler and not gated & pooler


@pytest.mark.slow
def test_python_m_actlab_config_prints_the_config_a_file_resolves_to():
  """`python -m actlab.config --config=FILE:arg --config.<field>=...` prints that config as JSON
  (as a run's config.json holds it), as does `python -m actlab.config FILE:arg ...`; a field that
  does not exist, a variant that does not, or a file given twice is one line."""
  cli = lambda *args: subprocess.run([sys.executable, "-m", "actlab.config", *args], cwd=REPO,
                                     capture_output=True, text=True, timeout=120)
  args = [f"--config={REPO / REFERENCE}:smoke", "--config.optim.lr=0.002"]
  out = cli(*args)
  assert out.returncode == 0, out.stderr
  printed = json.loads(out.stdout)
  assert printed == json.loads(load(*args).to_json()) and printed["optim"]["lr"] == 0.002
  bad = cli(f"--config={REFERENCE}", "--config.optim.lrr=0.002")
  assert bad.returncode == 2 and bad.stdout == "" and bad.stderr == (
      "error: --config.optim.lrr: optim has no field 'lrr'; did you mean 'optim.lr'?\n")
  given = cli(f"{REPO / REFERENCE}:smoke", "--config.optim.lr=0.002")  # FILE[:arg] positional
  assert given.returncode == 0 and json.loads(given.stdout) == printed, given.stderr
  for args, error in [([f"{REFERENCE}:smol"], "unknown config variant 'smol'; choose one of: "),
                      ([REFERENCE, f"--config={REFERENCE}"], f"a config file twice: {REFERENCE} "
                                                             "and --config; give one")]:
    bad = cli(*args)
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.startswith(f"error: {error}")
    assert bad.stderr.count("\n") == 1, bad.stderr

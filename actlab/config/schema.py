"""What a run is: every config field written once, with its default, its rule, its help and its
marks (`marked`); `validate`, in one line (`ConfigError`); and `typed`, a checked config as the
run reads it (`Config`). `model` and `optim` hold the fields of the core's dataclasses too."""

import dataclasses
import importlib.util
import json
from typing import Any

import ml_collections

from actlab import core
from actlab.core import activations
from actlab.core.model import (MARKS, Rule, activation_name, boolean, check, choices,
                               non_negative, one_of, positive, within)
from actlab.core.model import option as field  # a harness's field, written as the core's
from actlab.data import classify as classify_data
from actlab.data.tokenizer import parse_spec
from actlab.infra import errors, workdir


class ConfigError(errors.UserError, ValueError):
  """An inconsistent or invalid config; the message says what to fix."""


# --- The harness's rules (the core's are model.py's) ---------------------------------------------


def auto_or_boolean(k, v):
  """"auto", "true" or "false" (in any case), or a bool (what the field held before "auto")."""
  check(str(v).lower() in ("auto", "true", "false"),
        f"{k}={v!r}: choose 'auto', 'true' or 'false'")


def at_least(n) -> Rule:
  return lambda k, v: check(v >= n, f"{k}={v} must be at least {n}")


def text(what: str) -> Rule:
  return lambda k, v: check(isinstance(v, str), f"{k} must be {what}")


def listed(options) -> Rule:
  return lambda k, v: check(v in options, f"{k}={v!r}: choose one of {choices(options)}")


def parsed(parse) -> Rule:
  """A value `parse` takes; its ValueError names the key."""
  def rule(k, v):
    try:
      parse(v)
    except ValueError as e:
      raise ValueError(f"{k}: {e}") from None
  return rule


def plain_activation(k, v):
  activation_name(k, v)
  check(not activations.get(v).gated,
        f"{k}={v!r} is gated; the pooler takes a plain activation (tanh, gelu, identity, ...)")


def section(name: str, *parts) -> type:
  """A section of the defaulted fields of `parts`, in order; a core field keeps its class
  (`metadata["core"]`)."""
  fields = {}
  for part in parts:
    for f in dataclasses.fields(part):
      if f.default is dataclasses.MISSING:
        continue
      if f.name in fields:
        raise TypeError(f"{name}.{f.name} is a field of two of its parts")
      metadata = (f.metadata if not part.__module__.startswith("actlab.core.") else
                  {**f.metadata, "core": part})
      fields[f.name] = (f.name, f.type, dataclasses.field(default=f.default, metadata=metadata))
  return dataclasses.make_dataclass(name, fields.values(), frozen=True)


# --- Sections, in the order a config lists them -------------------------------------------------


@dataclasses.dataclass(frozen=True)
class TaskModel:
  """The task's own field of `model` (actlab/tasks.py), before the core's."""
  kind: str = field("decoder", one_of("decoder", "encoder"),
                    '"decoder" (GPT, causal LM) or "encoder" (BERT, MLM)', init_from="refuse")


@dataclasses.dataclass(frozen=True)
class TaskOptim:
  """The task's own field of `optim`, after the core's."""
  z_loss: float = field(0.0, non_negative(" (0 = off)"), "z-loss coefficient (PaLM): training "
                        "adds z_loss · mean (log Z)² over the predicted positions, log Z = "
                        "logsumexp of the output logits; train_loss and val_loss stay the "
                        "cross-entropy")


Model = section("Model", TaskModel, core.Spec, core.Execution)
Optim = section("Optim", core.OptimSpec, TaskOptim)


@dataclasses.dataclass(frozen=True)
class EncoderModel:
  """The encoder's own model fields (`config.encoder`)."""
  task: str = field("mlm", one_of("mlm", "classify"), '"mlm" (MLM pretraining) or "classify" '
                    "(fine-tune on data.classify)")
  pooler_activation: str = field("tanh", plain_activation, "[CLS] pooler → the "
                                 "classifier (BERT: tanh); any plain activation")
  type_vocab_size: int = field(2, positive, "segment (token-type) embeddings, as in BERT; inputs "
                               "use segment 0", init_from="refuse")
  num_classes: int = field(2, at_least(2), "classifier outputs; must match data.classify's "
                           "number of labels")


@dataclasses.dataclass(frozen=True)
class Train:
  steps: int = field(5000, positive)
  batch_size: int = field(32, positive)
  seed: int = field(1337, help="the root of all randomness: init, batches, dropout")
  log_every: int = field(50, positive, "steps between metric fetches / metrics.jsonl rows")
  eval_every: int = field(500, positive, "steps between validation passes (also at step 0 and the "
                          "end)")
  checkpoint_every: int = field(1000, positive, "steps between checkpoints (also at the end)")
  keep_checkpoints: int = field(3, positive, "how many checkpoints Orbax keeps", runtime="harness")
  init_from: str = field("", text("a workdir path, hf:<Hugging Face model directory>, or ''"),
                         "start from a workdir (latest checkpoint: every parameter with the same "
                         "name and shape; classify: the MLM run's trunk) or hf:<dir> (a local "
                         "GPT-2, BERT, Llama, Arcee or Qwen3 save_pretrained directory; the FFN "
                         "activation stays this config's, docs/huggingface.md); \"\" = random "
                         "init")
  progress: bool = field(True, boolean, "tqdm progress bar on stderr", runtime="harness")
  compile_cache: str = field("auto", text('"auto", "off" or a folder'), "where compiled programs "
                             'are kept for the next run (docs/performance.md): "auto" = '
                             '$JAX_COMPILATION_CACHE_DIR, else ~/.cache/actlab/xla; "off"; or a '
                             "folder", runtime="harness")
  deterministic_ops: bool = field(False, boolean, "XLA's deterministic GPU ops "
                                  "(--xla_gpu_deterministic_ops=true, added to XLA_FLAGS before "
                                  "JAX's backend starts): bitwise runs and resumes on a GPU, at a "
                                  "cost in speed; a CPU's programs are deterministic already")


@dataclasses.dataclass(frozen=True)
class Metrics:
  """What is measured; see docs/metrics.md."""
  act_stats: bool = field(True, boolean, "FFN activation statistics and attn_logit_max at every "
                          "evaluation")
  sharpness_every: int = field(1000, non_negative(" (0 = off)"), "steps between sharpness "
                               "estimates (also at step 0); 0 = off, and none in a run of fewer "
                               "train.steps (docs/metrics.md §5)")
  sharpness_iters: int = field(20, positive, "power-iteration steps (Hessian-vector products) "
                               "per estimate")
  tensorboard: bool = field(True, boolean, "also write every metrics.jsonl row to <workdir>/tb "
                            "(tensorboardX)", runtime="program")
  wandb_project: str = field("", help='also log every row to this Weights & Biases project ("" '
                             '= off; pip install -e ".[wandb]"); files in <workdir>/wandb',
                             runtime="program")
  wandb_mode: str = field("", one_of("", "online", "offline", "disabled"), '"online", "offline" '
                          "(sync later: wandb sync) or \"disabled\"; \"\" = W&B's choice "
                          "($WANDB_MODE, else online)", runtime="harness")
  ffn_hist_bins: int = field(64, within(0, 500, "[]", " (0 = off)"), "histogram of the FFN "
                             "pre-activations per layer at every evaluation, for TensorBoard / "
                             "W&B (not metrics.jsonl); 0 = off", runtime="program")
  ffn_hist_range: float = field(8.0, positive, "its bins span [-ffn_hist_range, ffn_hist_range], "
                                "plus under- and overflow counts", runtime="program")
  # The stability verdict (actlab.measure.metrics.verdict), applied to the logged loss curves:
  spike_rel: float = field(0.1, positive, "spike: a post-warm-up train loss > (1 + spike_rel) · "
                           "best before")
  final_gap_rel: float = field(0.05, positive, "unstable if final val loss > (1 + final_gap_rel) "
                               "· best val loss")
  uniform_frac: float = field(1.0, positive, "diverged if final val loss >= uniform_frac · "
                              "ln(vocab or classes)")
  grad_rel_max: float = field(10.0, non_negative(" (0 = off)"), "unstable if a step's grad norm > "
                              "grad_rel_max · at init (0: off)")


@dataclasses.dataclass(frozen=True)
class Parallel:
  """Devices and hosts; see actlab/infra/parallel.py."""
  mode: str = field("dp", one_of("dp", "fsdp"), '"dp": batch split, state replicated; "fsdp": '
                    "state split too", runtime="program")
  distributed: bool = field(False, boolean, "several processes: jax.distributed.initialize() "
                            "(below, else JAX_* variables or the cluster: TPU pod, SLURM, Open "
                            "MPI)", runtime="program")
  coordinator: str = field("", help='distributed: process 0\'s "host:port"; "" = from the '
                           "environment", runtime="program")
  num_processes: int = field(0, help="distributed: how many processes; 0 = from the environment",
                             runtime="program")
  process_id: int = field(-1, help="distributed: this process's index; -1 = from the environment",
                          runtime="program")
  fsdp_min_size: int = field(16384, non_negative(), "fsdp: arrays with fewer elements stay "
                             "replicated", runtime="program")
  num_devices: int = field(0, non_negative(" (0 = all)"), "use the first N devices; 0 = all (of "
                           "all hosts)", runtime="program")
  cpu_devices: int = field(0, non_negative(" (0 = one device)"), "CPU only: split the host into N "
                           "XLA devices (data parallel over them; faster for small models, see "
                           "parallel.py); 0 = one device", runtime="program")


@dataclasses.dataclass(frozen=True)
class Sweep:
  """How actlab.sweep runs the cells of a grid."""
  vectorize: str = field("auto", auto_or_boolean, "cells that differ only in optim.lr / "
                         "train.seed train as one vmapped program (train.run_group; per-cell "
                         'outputs unchanged): "auto" on a GPU or TPU, not on a CPU, where it does '
                         'not pay; "true" or "false" anywhere', runtime="harness")
  max_runs: int = field(0, non_negative(" (0 = as many as fit)"), "at most this many cells per "
                        "vectorized program; 0 = as many as fit in the device's memory by an "
                        "estimate (docs/sweeps.md; no limit on a CPU)", runtime="harness")
  compile_next: str = field("auto", auto_or_boolean, "while a compile group trains, compile the "
                            "next one (where both read the same data): \"auto\" on a GPU or "
                            "TPU, whose host is idle meanwhile, not on a CPU, where the compile "
                            'takes the training\'s cores; "true" or "false" anywhere',
                            runtime="harness")


@dataclasses.dataclass(frozen=True)
class Data:
  source: str = field("tinystories", one_of("tinystories", "synthetic"), '"tinystories" (TFDS) '
                      'or "synthetic" (the embedded corpus)', init_from="refuse")
  tokenizer: str = field("gpt2", parsed(parse_spec), '"gpt2", "byte", '
                         '"bpe:<vocab size>" or "wordpiece:<vocab size>"', init_from="refuse")
  seq_len: int = field(128, positive, "training window length; must be <= model.max_len")
  val_batches: int = field(8, positive, "fixed validation windows = val_batches · batch_size")
  test_batches: int = field(0, non_negative(" (0 = no test split)"), "> 0: held-out test windows "
                            "(test_batches · batch_size) from the validation split's second half, "
                            "scored once at the end (final_test_loss); the validation windows "
                            "keep the first half")
  dir: str = field("", help='cache root; "" means $ACTLAB_DATA_DIR or ~/.cache/actlab',
                   runtime="harness")
  tinystories_version: str = field("v2", one_of("v1", "v2"), '"v2" (GPT-4 stories) or "v1"',
                                   init_from="refuse")
  manual_dir: str = field("", help='offline TinyStories files; "" means <data '
                          "dir>/manual/tiny_stories", runtime="harness")
  gpt2_dir: str = field("", help='offline encoder.json + vocab.bpe; "" means $ACTLAB_GPT2_DIR',
                        runtime="harness")


@dataclasses.dataclass(frozen=True)
class EncoderData:
  """The encoder's own data fields (`config.encoder`)."""
  mlm_prob: float = field(0.15, within(0, 1, "()"), "share of maskable tokens selected per "
                          "sequence (exactly, rounded)")
  mlm_mask_frac: float = field(0.8, help="selected tokens replaced by [MASK]")
  mlm_random_frac: float = field(0.1, help="selected tokens replaced by a random ordinary one "
                                 "(rest unchanged)")
  classify: str = field("glue/sst2", listed(classify_data.SOURCES), 'task "classify": "glue/sst2" '
                        '(TFDS) or "synthetic/hero_gender"')


SECTIONS = {"model": Model, "optim": Optim, "train": Train, "metrics": Metrics,
            "parallel": Parallel, "sweep": Sweep, "data": Data}
ENCODER = {"model": EncoderModel, "data": EncoderData}  # what `config.encoder` adds


# --- The lists the marks make -------------------------------------------------------------------


def defaults(sections: dict = SECTIONS) -> dict[str, dict]:
  """{section: {field: default}} of `sections`, in order."""
  return {name: {f.name: f.default for f in dataclasses.fields(cls)}
          for name, cls in sections.items()}


# A config.json from before a field reads as the field's default (`workdir.with_added_fields`):
# a new field's default is what runs from before it did, so adding one touches only its section.
workdir.ADDED_FIELDS.update({(name, f): value for name, values in defaults().items()
                             for f, value in values.items()})


def marked(mark: str) -> dict[str, Any]:
  """{"section.field": its value of `mark`} of every field that carries it (the encoder's too)."""
  assert mark in MARKS, mark
  return {f"{name}.{f.name}": f.metadata[mark] for sections in (SECTIONS, ENCODER)
          for name, cls in sections.items() for f in dataclasses.fields(cls) if mark in f.metadata}


# The block's fields (`block`); GPT-2's block: the form's at their defaults, which every run built
# before the fields existed and the encoder and hf/'s GPT-2 and BERT keep to.
BLOCK_FIELDS = tuple(key.removeprefix("model.") for key in marked("block"))
GPT2_BLOCK = {name: getattr(core.Spec, name) for name in BLOCK_FIELDS
              if marked("block")[f"model.{name}"] == "form"}
# What `train.init_from` does where the run started from has another value: "refuse" or "say".
INIT_FROM = marked("init_from")


def _runtime_fields() -> tuple[str, ...]:
  keys = marked("runtime")
  whole = [name for name, cls in SECTIONS.items()
           if all(f"{name}.{f.name}" in keys for f in dataclasses.fields(cls))]
  return (*(f"{name}." for name in whole),
          *(key for key in keys if key.partition(".")[0] not in whole))


# What says how or where a run executes, not what it computes (`runtime`), as prefixes ("section."
# for a section of them alone): a run resumes with other values (provenance.json records each).
RUNTIME_FIELDS = _runtime_fields()


def identity_diffs(old: dict, new: dict) -> list[str]:
  """The differences ("field: old → new") that make `new` another run than `old` (not runtime)."""
  return workdir.diff_configs(old, new, RUNTIME_FIELDS)


# --- A config checked, and typed ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Config:
  """A checked config as the run reads it (`typed`): each section a frozen dataclass of its fields,
  and `fields`, the config as a nested dict (config.json's)."""
  model: Any
  optim: Any
  train: Any
  metrics: Any
  parallel: Any
  sweep: Any
  data: Any
  fields: dict

  def spec(self, vocab_size: int) -> core.Spec:
    """The model's `Spec`, of `model.vocab_size` or else `vocab_size`, padded to 64s."""
    return _core(core.Spec, self.model,
                 vocab_size=core.pad_vocab(self.model.vocab_size or vocab_size))

  @property
  def execution(self) -> core.Execution:
    return _core(core.Execution, self.model)

  @property
  def optim_spec(self) -> core.OptimSpec:
    return _core(core.OptimSpec, self.optim, total_steps=self.train.steps)


def _core(cls, section, **given):
  """The core's dataclass `cls` from its fields in a section and `given`."""
  return cls(**{f.name: getattr(section, f.name) for f in dataclasses.fields(cls)
                if f.name not in given and hasattr(section, f.name)}, **given)


_ENCODER_TYPED = {"model": section("Model", Model, EncoderModel),
                  "data": section("Data", SECTIONS["data"], EncoderData)}


def typed(config) -> Config:
  """`config` checked (`validate`) and as a `Config` (one already is returned as it is)."""
  if isinstance(config, Config):
    return config
  validate(config)
  classes = {**SECTIONS, **(_ENCODER_TYPED if config.model.kind == "encoder" else {})}
  return Config(**{name: cls(**{f.name: config[name][f.name] for f in dataclasses.fields(cls)})
                   for name, cls in classes.items()}, fields=json.loads(config.to_json()))


def validate(c: ml_collections.ConfigDict) -> None:
  """A one-line ConfigError for the first problem: a field unknown or absent, a rule, a relation."""
  try:
    _validate(c)
  except ValueError as e:  # a rule's or relation's (`check`), or the core's own
    raise ConfigError(str(e)) from None


def _validate(c: ml_collections.ConfigDict) -> None:
  _check_names(c)
  encoder = c.model.kind == "encoder"  # the encoder's own fields are the encoder's to check
  for section_name, cls in [*SECTIONS.items(), *(ENCODER.items() if encoder else ())]:
    for f in dataclasses.fields(cls):
      if f.metadata["rule"] and f.name in c[section_name]:
        f.metadata["rule"](f"{section_name}.{f.name}", c[section_name][f.name])
  m, o, t, d, mt = c.model, c.optim, c.train, c.data, c.metrics
  if m.kind == "decoder":
    check(m.get("task", "lm") == "lm",
          f"model.task={m.get('task')!r}: the decoder has one task, causal LM ('lm')")
  else:
    _check_encoder(c)
  check(m.d_model % m.num_heads == 0,
        f"model.d_model={m.d_model} is not divisible by model.num_heads={m.num_heads}")
  check(m.position != "rope" or (m.d_model // m.num_heads) % 2 == 0,
        f"model.position='rope' rotates pairs of features: the head dim d_model/num_heads = "
        f"{m.d_model // m.num_heads} must be even")
  check(m.ffn != "plain" or not activations.get(m.activation).gated,
        f"model.ffn='plain' with model.activation={m.activation!r}, a gated (GLU) name: use its "
        f"plain activation ({activations.GATE_BASE.get(m.activation)!r}) or model.ffn='gated'")
  check(m.parametrization == "sp" or m.mup_base_width > 0,
        "model.parametrization='mup' needs model.mup_base_width, the d_model at which μP is SP "
        f"(e.g. --config.model.mup_base_width={m.d_model} for this width)")
  check(m.parametrization == "sp" or m.kind == "decoder",
        "model.parametrization='mup' covers the decoder only; the encoder trains under 'sp'")
  check(m.parametrization == "sp" or o.name != "muon" or o.muon_scale == "width",
        "model.parametrization='mup' with optim.name='muon' takes Muon's own shape factor for the "
        "blocks' matrices: set optim.muon_scale='width' (√max(1, fan_out/fan_in))")
  _core(core.OptimSpec, o, total_steps=t.steps)  # warm-up within the steps, one clipping
  check(d.seq_len <= m.max_len,
        f"data.seq_len={d.seq_len} is longer than model.max_len={m.max_len}")
  check(not mt.wandb_project or importlib.util.find_spec("wandb") is not None,
        f"metrics.wandb_project={mt.wandb_project!r} needs wandb, which is not installed: "
        'pip install -e ".[wandb]"')


def _check_names(c: ml_collections.ConfigDict) -> None:
  """A field no section declares would be ignored, and one missing would fail later."""
  known = {name: {**values, **defaults(ENCODER).get(name, {})}
           for name, values in defaults().items()}
  for name, values in c.items():
    for key in ([f"{name}.{f}" for f in values] if isinstance(values, ml_collections.ConfigDict)
                else [name]):
      section_name, _, f = key.partition(".")
      if section_name not in known or f not in known[section_name]:
        problem = errors.unknown_field(ml_collections.ConfigDict(known), key)
        check(problem is None, f"{key}: no such field ({problem})")
  for name, values in defaults().items():
    for f in values:
      check(name in c and f in c[name], f"{name}.{f} is missing: a config starts from one of "
            "configs/*.py or actlab.config.base(), which have every field")


def _check_encoder(config) -> None:
  """The encoder's relations: a config switches between its tasks by `model.task` alone."""
  m, d = config.model, config.data
  missing = [f"{name}.{f}" for name, values in defaults(ENCODER).items()
             for f in values if f not in config[name]]
  check(not missing, f"model.kind='encoder' needs the encoder's fields ({', '.join(missing)} "
        "missing): start from configs/bert_<activation>.py (config.encoder)")
  changed = [f"model.{k}={m[k]!r}" for k, v in GPT2_BLOCK.items() if m[k] != v]
  check(not changed, f"{', '.join(changed)}: the encoder builds BERT's block (LayerNorm, learned "
        "positions, biases, the tied MLM head); these options are the decoder's")
  check(parse_spec(d.tokenizer)[0] == "wordpiece",  # a spec its rule took
        f"data.tokenizer={d.tokenizer!r}: the encoder needs [CLS], [SEP], [MASK] and [PAD]; "
        "use 'wordpiece:<vocab size>'")
  check(d.seq_len >= 3, f"data.seq_len={d.seq_len}: an encoder sequence needs [CLS], a token "
        "and [SEP]")
  check(d.mlm_mask_frac >= 0 and d.mlm_random_frac >= 0
        and d.mlm_mask_frac + d.mlm_random_frac <= 1.0,
        f"data.mlm_mask_frac={d.mlm_mask_frac} and data.mlm_random_frac={d.mlm_random_frac} must "
        "be >= 0 with a sum <= 1")
  check(m.task != "classify" or not d.test_batches,
        "data.test_batches: classification scores the labelled validation split whole; "
        "set data.test_batches=0")

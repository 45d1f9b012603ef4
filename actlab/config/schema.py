"""Every config field, written once: its default, the rule its values keep, its help text
(`python -m actlab.config` prints them) and its marks, from which every list of fields derives
(`marked`: the block's, those `train.init_from` checks, the runtime ones). A section is a
dataclass. The fields of the core's dataclasses are written there (actlab/core/options.py):
`model` is `core.Spec`'s and `kernels.Execution`'s fields after the task's own (`TaskModel`),
`optim` `core.OptimSpec`'s before the task's `z_loss` (`section`), each built back from its
section (`build`, `specs`); the harness's fields are written here. `config.base()` is built from
these, and `validation.validate` checks each field against its own rule before the relations.
"""

import dataclasses
from typing import Any

from actlab import core
from actlab.core import kernels
from actlab.core.options import (MARKS, activation_name, at_least, auto_or_boolean, boolean, listed,
                                 non_negative, one_of, parsed, positive, text, within)
from actlab.core.options import option as field  # a harness's field, written as the core's
from actlab.data import classify as classify_data
from actlab.data.tokenizer import parse_spec
from actlab.infra import workdir


def section(name: str, *parts) -> type:
  """A section of the fields of the dataclasses `parts`, in order: every field with a default (a
  field without one is given when the core's dataclass is built: `OptimSpec.total_steps` is
  `train.steps`); a field of the core's keeps its class (`metadata["core"]`)."""
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


# --- Sections, in the order a config lists them

@dataclasses.dataclass(frozen=True)
class TaskModel:
  """The task's own fields of `model` (actlab/tasks/), before the core's."""
  kind: str = field("decoder", one_of("decoder", "encoder"),
                    '"decoder" (GPT, causal LM) or "encoder" (BERT, MLM)', init_from="refuse")
  loss_impl: str = field("fused", one_of("fused", "plain"), 'decoder LM head + loss: "fused" '
                         "(chunked, no [B, L, V] logits in memory; core/kernels.py) or \"plain\" "
                         "(logits, then cross-entropy)")


@dataclasses.dataclass(frozen=True)
class TaskOptim:
  """The task's own field of `optim`, after the core's."""
  z_loss: float = field(0.0, non_negative(" (0 = off)"), "z-loss coefficient (PaLM): training "
                        "adds z_loss · mean (log Z)² over the predicted positions, log Z = "
                        "logsumexp of the output logits; train_loss and val_loss stay the "
                        "cross-entropy")


Model = section("Model", TaskModel, core.Spec, kernels.Execution)
Optim = section("Optim", core.OptimSpec, TaskOptim)


@dataclasses.dataclass(frozen=True)
class EncoderModel:
  """The encoder's own model fields (`config.encoder`)."""
  task: str = field("mlm", one_of("mlm", "classify"), '"mlm" (MLM pretraining) or "classify" '
                    "(fine-tune on data.classify)")
  pooler_activation: str = field("tanh", activation_name(plain=True), "[CLS] pooler → the "
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


def defaults(sections: dict = SECTIONS) -> dict[str, dict]:
  """{section: {field: default}} of `sections`, in order."""
  return {name: {f.name: f.default for f in dataclasses.fields(cls)}
          for name, cls in sections.items()}


def marked(mark: str) -> dict[str, Any]:
  """{"section.field": its value of `mark`} of every field that carries the mark (the encoder's
  too; `MARKS`, core/options.py), in order: each list of fields below derives from these."""
  assert mark in MARKS, mark
  return {f"{name}.{f.name}": f.metadata[mark] for sections in (SECTIONS, ENCODER)
          for name, cls in sections.items() for f in dataclasses.fields(cls) if mark in f.metadata}


# The block's fields (`block`), all `model.*`; GPT-2's block: the form's at their defaults, which
# every run built before the fields existed and the encoder and hf/'s GPT-2 and BERT keep to.
BLOCK_FIELDS = tuple(key.removeprefix("model.") for key in marked("block"))
GPT2_BLOCK = {name: getattr(core.Spec, name) for name in BLOCK_FIELDS
              if marked("block")[f"model.{name}"] == "form"}
# What `train.init_from` does where the run started from has another value: "refuse" or "say".
INIT_FROM = marked("init_from")


def runtime_fields() -> tuple[str, ...]:
  """The runtime fields (`runtime`) as prefixes: "section." for a section of them alone."""
  keys = marked("runtime")
  whole = [name for name, cls in SECTIONS.items()
           if all(f"{name}.{f.name}" in keys for f in dataclasses.fields(cls))]
  return (*(f"{name}." for name in whole),
          *(key for key in keys if key.partition(".")[0] not in whole))


# The run directory's (infra/workdir.py sits below the config: it cannot read the marks itself).
workdir.RUNTIME_FIELDS = runtime_fields()


def build(cls, section, **given):
  """The core's dataclass `cls` (`core.Spec`, `kernels.Execution`, `core.OptimSpec`) from its
  fields in a config section (each field of `cls` with a default; one the section lacks keeps
  that default) and `given` (a field without one, or another value); its own checks raise:
  `build(core.OptimSpec, config.optim, total_steps=config.train.steps)`."""
  return cls(**{f.name: section[f.name] for f in dataclasses.fields(cls)
                if f.name in section and f.name not in given}, **given)


def specs(config, vocab_size: int) -> tuple[core.Spec, kernels.Execution]:
  """The model of a config (every task's): its `core.Spec`, of `model.vocab_size` or else the
  tokenizer's `vocab_size`, padded to a multiple of 64, and its `kernels.Execution`."""
  m = config.model
  return (build(core.Spec, m, vocab_size=core.pad_vocab(m.vocab_size or vocab_size)),
          build(kernels.Execution, m))

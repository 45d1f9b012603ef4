"""`validate(config)`: every field's range and the fields' consistency, checked before anything
compiles or is written; the first problem found raises `ConfigError` with one readable line that
says what to fix."""

import dataclasses
import importlib.util

import ml_collections

from actlab import errors
from actlab.data import tokenizer
from actlab.data import classify as classify_data
from actlab.core import Execution, Spec, activations
from actlab.core.spec import GPT2_BLOCK

WANDB_MODES = ("", "online", "offline", "disabled")  # metrics.wandb_mode

POSITIVE = ("model.num_layers", "model.d_model", "model.num_heads", "model.d_ff", "model.max_len",
            "train.steps", "train.batch_size", "train.log_every", "train.eval_every",
            "train.checkpoint_every", "train.keep_checkpoints", "optim.lr", "data.seq_len",
            "data.val_batches", "model.rope_theta", "metrics.sharpness_iters", "metrics.spike_rel",
            "metrics.final_gap_rel", "metrics.uniform_frac", "metrics.ffn_hist_range")
# The fields that may be 0, with what 0 means for those where it means something.
NON_NEGATIVE = {"model.vocab_size": " (0 = tokenizer's)", "parallel.fsdp_min_size": "",
                "parallel.num_devices": " (0 = all)", "parallel.cpu_devices": " (0 = one device)",
                "sweep.max_runs": " (0 = no limit)", "optim.weight_decay": "",
                "optim.clip_norm": " (0 disables)", "optim.z_loss": " (0 = off)",
                "data.test_batches": " (0 = no test split)",
                "metrics.sharpness_every": " (0 = off)", "metrics.grad_rel_max": " (0 = off)"}
BOOLEAN = ("model.qk_norm", "model.bias", "model.tie_head", "model.scan_layers", "parallel.distributed", "sweep.vectorize")
# The model's choices are written once, on the core's `Spec` and `Execution` fields (`choice`).
ONE_OF = {**{f"model.{f.name}": f.metadata["choices"] for cls in (Spec, Execution)
             for f in dataclasses.fields(cls) if "choices" in f.metadata},
          "model.loss_impl": ("fused", "plain"), "parallel.mode": ("dp", "fsdp"),
          "data.source": ("tinystories", "synthetic"), "data.tinystories_version": ("v1", "v2")}


class ConfigError(errors.UserError, ValueError):
  """An inconsistent or invalid config; the message says what to fix."""


def choices(names) -> str:  # "'a', 'b', 'c'"
  return ", ".join(repr(n) for n in names)


def check(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def check_one_of(key: str, value, options) -> None:
  check(value in options, f"{key}={value!r}: choose {choices(options[:-1])} or {options[-1]!r}")


def _field(config: ml_collections.ConfigDict, key: str):
  section, name = key.split(".")
  return config[section][name]


def _parsed(key: str, parse, value):
  """`parse(value)`, its ValueError raised as a ConfigError about `key`."""
  try:
    return parse(value)
  except ValueError as e:
    raise ConfigError(f"{key}: {e}") from None


def tokenizer_kind(spec: str) -> str:
  """"bpe" for "bpe:4096" (`tokenizer.parse_spec`)."""
  return _parsed("data.tokenizer", tokenizer.parse_spec, spec)[0]


def validate(c: ml_collections.ConfigDict) -> None:
  """ConfigError (one readable line) for the first problem: fields' ranges, then relations."""
  m, o, t, d, mt = c.model, c.optim, c.train, c.data, c.metrics
  check_one_of("model.kind", m.kind, ("decoder", "encoder"))
  if m.kind == "decoder":
    check(m.get("task", "lm") == "lm",
          f"model.task={m.get('task')!r}: the decoder has one task, causal LM ('lm')")
  else:
    _check_encoder(c)
  _parsed("model.activation", activations.get, m.activation)
  for key in POSITIVE:
    check(_field(c, key) > 0, f"{key}={_field(c, key)} must be positive")
  for key, zero in NON_NEGATIVE.items():
    check(_field(c, key) >= 0, f"{key}={_field(c, key)} must be >= 0{zero}")
  for key in BOOLEAN:
    check(isinstance(_field(c, key), bool), f"{key}={_field(c, key)!r} must be true or false")
  for key, options in ONE_OF.items():
    check_one_of(key, _field(c, key), options)
  check(m.d_model % m.num_heads == 0,
        f"model.d_model={m.d_model} is not divisible by model.num_heads={m.num_heads}")
  check(m.position != "rope" or (m.d_model // m.num_heads) % 2 == 0,
        f"model.position='rope' rotates pairs of features: the head dim d_model/num_heads = "
        f"{m.d_model // m.num_heads} must be even")
  check(m.ffn != "plain" or not activations.get(m.activation).gated,
        f"model.ffn='plain' with model.activation={m.activation!r}, a gated (GLU) name: use its "
        f"plain activation ({activations.GATE_BASE.get(m.activation)!r}) or model.ffn='gated'")
  check(0.0 <= m.dropout < 1.0, f"model.dropout={m.dropout} must be in [0, 1)")
  check(0.0 <= o.min_lr_ratio <= 1.0, f"optim.min_lr_ratio={o.min_lr_ratio} must be in [0, 1]")
  check(0 <= o.warmup_steps < t.steps,
        f"optim.warmup_steps={o.warmup_steps} must be >= 0 and < train.steps={t.steps}")
  check(0.0 <= o.b1 < 1.0 and 0.0 <= o.b2 < 1.0, f"optim.b1={o.b1}, b2={o.b2} must be in [0, 1)")
  check(isinstance(t.init_from, str),
        "train.init_from must be a workdir path, hf:<Hugging Face model directory>, or ''")
  tokenizer_kind(d.tokenizer)
  check(d.seq_len <= m.max_len,
        f"data.seq_len={d.seq_len} is longer than model.max_len={m.max_len}")
  check(0 <= mt.ffn_hist_bins <= 500,
        f"metrics.ffn_hist_bins={mt.ffn_hist_bins} must be in [0, 500] (0 = off)")
  check(mt.wandb_mode in WANDB_MODES,
        f"metrics.wandb_mode={mt.wandb_mode!r}: choose {choices(WANDB_MODES)}")
  check(not mt.wandb_project or importlib.util.find_spec("wandb") is not None,
        f"metrics.wandb_project={mt.wandb_project!r} needs wandb, which is not installed: "
        'pip install -e ".[wandb]"')


ENCODER_FIELDS = ("model.task", "model.pooler_activation", "model.type_vocab_size",
                  "model.num_classes", "data.mlm_prob", "data.mlm_mask_frac",
                  "data.mlm_random_frac", "data.classify")


def _check_encoder(config) -> None:
  """The encoder's fields (`config.encoder`) and task: a config switches between its tasks (mlm,
  classify) by `model.task` alone."""
  m, d = config.model, config.data
  missing = [f for f in ENCODER_FIELDS if f.split(".")[1] not in config[f.split(".")[0]]]
  check(not missing, f"model.kind='encoder' needs the encoder's fields ({', '.join(missing)} "
        "missing): start from configs/bert_<activation>.py (config.encoder)")
  changed = [f"model.{k}={m[k]!r}" for k, v in GPT2_BLOCK.items() if m[k] != v]
  check(not changed, f"{', '.join(changed)}: the encoder builds BERT's block (LayerNorm, learned "
        "positions, biases, the tied MLM head); these options are the decoder's")
  check(not _parsed("model.pooler_activation", activations.get, m.pooler_activation).gated,
        f"model.pooler_activation={m.pooler_activation!r} is gated; the pooler takes a plain "
        "activation (tanh, gelu, identity, ...)")
  check(m.type_vocab_size > 0, f"model.type_vocab_size={m.type_vocab_size} must be positive")
  check(m.num_classes >= 2, f"model.num_classes={m.num_classes} must be at least 2")
  check(tokenizer_kind(d.tokenizer) == "wordpiece",
        f"data.tokenizer={d.tokenizer!r}: the encoder needs [CLS], [SEP], [MASK] and [PAD]; "
        "use 'wordpiece:<vocab size>'")
  check(d.seq_len >= 3, f"data.seq_len={d.seq_len}: an encoder sequence needs [CLS], a token "
        "and [SEP]")
  check(0.0 < d.mlm_prob < 1.0, f"data.mlm_prob={d.mlm_prob} must be in (0, 1)")
  check(d.mlm_mask_frac >= 0 and d.mlm_random_frac >= 0
        and d.mlm_mask_frac + d.mlm_random_frac <= 1.0,
        f"data.mlm_mask_frac={d.mlm_mask_frac} and data.mlm_random_frac={d.mlm_random_frac} must "
        "be >= 0 with a sum <= 1")
  check(d.classify in classify_data.SOURCES,
        f"data.classify={d.classify!r}: choose one of {choices(classify_data.SOURCES)}")
  check_one_of("model.task", m.task, ("mlm", "classify"))
  check(m.task != "classify" or not d.test_batches,
        "data.test_batches: classification scores the labelled validation split whole; "
        "set data.test_batches=0")

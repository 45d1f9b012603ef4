"""`validate(config)`: every field's range and the fields' consistency, checked before anything
compiles or is written; the first problem found raises `ConfigError` with one readable line that
says what to fix."""

import importlib.util

import ml_collections

from actlab import errors
from actlab.data import tokenizer
from actlab.data import classify as classify_data
from actlab.models import activations

WANDB_MODES = ("", "online", "offline", "disabled")  # metrics.wandb_mode


class ConfigError(errors.UserError, ValueError):
  """An inconsistent or invalid config; the message says what to fix."""


def choices(names) -> str:
  """'a', 'b', 'c': the accepted values, for a message."""
  return ", ".join(repr(n) for n in names)


def check(ok: bool, message: str) -> None:
  """Raises ConfigError(message) unless `ok`."""
  if not ok:
    raise ConfigError(message)


def tokenizer_kind(spec: str) -> str:
  """"bpe" for "bpe:4096" (`tokenizer.parse_spec`); its ValueError becomes a ConfigError."""
  try:
    return tokenizer.parse_spec(spec)[0]
  except ValueError as e:
    raise ConfigError(f"data.tokenizer: {e}") from None


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises ConfigError (one readable line) for the first inconsistency found."""
  m, o, t, d = c.model, c.optim, c.train, c.data
  _check_task(c)
  try:
    activations.get(m.activation)
  except ValueError as e:
    raise ConfigError(f"model.activation: {e}") from None
  for name in ("num_layers", "d_model", "num_heads", "d_ff", "max_len"):
    check(m[name] > 0, f"model.{name}={m[name]} must be positive")
  check(m.d_model % m.num_heads == 0,
         f"model.d_model={m.d_model} is not divisible by model.num_heads={m.num_heads}")
  check(m.vocab_size >= 0, f"model.vocab_size={m.vocab_size} must be >= 0 (0 = tokenizer's)")
  check(0.0 <= m.dropout < 1.0, f"model.dropout={m.dropout} must be in [0, 1)")
  check(m.norm in ("pre", "post"), f"model.norm={m.norm!r}: choose 'pre' or 'post'")
  check(isinstance(m.qk_norm, bool), f"model.qk_norm={m.qk_norm!r} must be true or false")
  check(m.dtype in ("float32", "bfloat16"),
         f"model.dtype={m.dtype!r}: choose 'float32' or 'bfloat16'")
  check(m.attention_impl in ("xla", "cudnn", "auto"),
         f"model.attention_impl={m.attention_impl!r}: choose 'xla', 'cudnn' or 'auto'")
  check(m.loss_impl in ("fused", "plain"),
        f"model.loss_impl={m.loss_impl!r}: choose 'fused' or 'plain'")
  check(isinstance(m.scan_layers, bool), f"model.scan_layers={m.scan_layers!r} must be true or false")
  check(m.remat in ("none", "full", "dots"),
        f"model.remat={m.remat!r}: choose 'none', 'full' or 'dots'")
  par, sw = c.parallel, c.sweep
  check(par.mode in ("dp", "fsdp"), f"parallel.mode={par.mode!r}: choose 'dp' or 'fsdp'")
  check(isinstance(par.distributed, bool),
        f"parallel.distributed={par.distributed!r} must be true or false")
  check(par.fsdp_min_size >= 0, f"parallel.fsdp_min_size={par.fsdp_min_size} must be >= 0")
  check(par.num_devices >= 0, f"parallel.num_devices={par.num_devices} must be >= 0 (0 = all)")
  check(par.cpu_devices >= 0,
        f"parallel.cpu_devices={par.cpu_devices} must be >= 0 (0 = one device)")
  check(isinstance(sw.vectorize, bool), f"sweep.vectorize={sw.vectorize!r} must be true or false")
  check(sw.max_runs >= 0, f"sweep.max_runs={sw.max_runs} must be >= 0 (0 = no limit)")
  for name in ("steps", "batch_size", "log_every", "eval_every", "checkpoint_every",
               "keep_checkpoints"):
    check(t[name] > 0, f"train.{name}={t[name]} must be positive")
  check(o.lr > 0, f"optim.lr={o.lr} must be positive")
  check(0.0 <= o.min_lr_ratio <= 1.0, f"optim.min_lr_ratio={o.min_lr_ratio} must be in [0, 1]")
  check(0 <= o.warmup_steps < t.steps,
         f"optim.warmup_steps={o.warmup_steps} must be >= 0 and < train.steps={t.steps}")
  check(0.0 <= o.b1 < 1.0 and 0.0 <= o.b2 < 1.0, f"optim.b1={o.b1}, b2={o.b2} must be in [0, 1)")
  check(o.weight_decay >= 0, f"optim.weight_decay={o.weight_decay} must be >= 0")
  check(o.clip_norm >= 0, f"optim.clip_norm={o.clip_norm} must be >= 0 (0 disables)")
  check(o.z_loss >= 0, f"optim.z_loss={o.z_loss} must be >= 0 (0 = off)")
  check(isinstance(t.init_from, str),
        "train.init_from must be a workdir path, hf:<Hugging Face model directory>, or ''")
  check(d.source in ("tinystories", "synthetic"),
         f"data.source={d.source!r}: choose 'tinystories' or 'synthetic'")
  tokenizer_kind(d.tokenizer)
  check(d.seq_len > 0, f"data.seq_len={d.seq_len} must be positive")
  check(d.seq_len <= m.max_len,
         f"data.seq_len={d.seq_len} is longer than model.max_len={m.max_len}")
  check(d.val_batches > 0, f"data.val_batches={d.val_batches} must be positive")
  check(d.test_batches >= 0, f"data.test_batches={d.test_batches} must be >= 0 (0 = no test split)")
  mt = c.metrics
  check(mt.sharpness_every >= 0,
         f"metrics.sharpness_every={mt.sharpness_every} must be >= 0 (0 = off)")
  check(mt.sharpness_iters > 0, f"metrics.sharpness_iters={mt.sharpness_iters} must be positive")
  for name in ("spike_rel", "final_gap_rel", "uniform_frac"):
    check(mt[name] > 0, f"metrics.{name}={mt[name]} must be positive")
  check(0 <= mt.ffn_hist_bins <= 500,
         f"metrics.ffn_hist_bins={mt.ffn_hist_bins} must be in [0, 500] (0 = off)")
  check(mt.ffn_hist_range > 0, f"metrics.ffn_hist_range={mt.ffn_hist_range} must be positive")
  check(mt.wandb_mode in WANDB_MODES,
         f"metrics.wandb_mode={mt.wandb_mode!r}: choose {choices(WANDB_MODES)}")
  check(not mt.wandb_project or importlib.util.find_spec("wandb") is not None,
         f"metrics.wandb_project={mt.wandb_project!r} needs wandb, which is not installed: "
         'pip install -e ".[wandb]"')
  check(d.tinystories_version in ("v1", "v2"),
         f"data.tinystories_version={d.tinystories_version!r}: choose 'v1' or 'v2'")


def _check_task(config: ml_collections.ConfigDict) -> None:
  """The config names a task and has the fields its model needs."""
  m = config.model
  check(m.kind in ("decoder", "encoder"), f"model.kind={m.kind!r}: choose 'decoder' or 'encoder'")
  if m.kind == "decoder":
    check(m.get("task", "lm") == "lm",
          f"model.task={m.get('task')!r}: the decoder has one task, causal LM ('lm')")
  else:
    _check_encoder(config)
    check(m.task in ("mlm", "classify"), f"model.task={m.task!r}: choose 'mlm' or 'classify'")
    check(m.task != "classify" or not config.data.test_batches,
          "data.test_batches: classification scores the labelled validation split whole; "
          "set data.test_batches=0")


ENCODER_FIELDS = ("model.task", "model.pooler_activation", "model.type_vocab_size",
                  "model.num_classes", "data.mlm_prob", "data.mlm_mask_frac",
                  "data.mlm_random_frac", "data.classify")


def _check_encoder(config) -> None:
  """The encoder's fields (`config.encoder`), for both its tasks (mlm, classify): a config
  switches between them by `model.task` alone."""
  m, d = config.model, config.data
  missing = [f for f in ENCODER_FIELDS if f.split(".")[1] not in config[f.split(".")[0]]]
  check(not missing, f"model.kind='encoder' needs the encoder's fields ({', '.join(missing)} "
        "missing): start from configs/bert_<activation>.py (config.encoder)")
  try:
    pooler = activations.get(m.pooler_activation)
  except ValueError as e:
    raise ConfigError(f"model.pooler_activation: {e}") from None
  check(not pooler.gated, f"model.pooler_activation={m.pooler_activation!r} is gated; the pooler "
        "takes a plain activation (tanh, gelu, identity, ...)")
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
        f"data.classify={d.classify!r}: choose one of "
        + ", ".join(map(repr, classify_data.SOURCES)))

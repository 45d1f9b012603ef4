"""The default config (every field, documented) and `validate(config)`.

Config files in `configs/` start from `base()` and change only what their experiment varies;
`validate` runs before anything compiles and raises `ConfigError` with one readable line.
"""

import ml_collections

from actlab import activations
from actlab.errors import UserError


class ConfigError(UserError, ValueError):
  """An inconsistent or invalid config; the message says what to fix."""


def base(activation: str = "gelu") -> ml_collections.ConfigDict:
  """The reference study's setup (REFERENCE.md §2): GPT decoder on TinyStories, GPT-2 BPE."""
  c = ml_collections.ConfigDict()

  c.model = m = ml_collections.ConfigDict()
  m.kind = "decoder"            # "decoder" (GPT, causal LM) or "encoder" (BERT, MLM)
  m.activation = activation     # FFN activation: a name from actlab.activations.NAMES
  m.num_layers = 6
  m.d_model = 384
  m.num_heads = 6
  m.d_ff = 1536                 # FFN hidden width of the plain (two-matrix) FFN
  m.gated_match_params = True   # gated FFNs use round(2/3·d_ff) to a multiple of 64 (Shazeer 2020)
  m.max_len = 128               # learned position embeddings (context length)
  m.vocab_size = 0              # 0: the tokenizer's vocabulary; always padded to a multiple of 64
  m.dropout = 0.0
  m.norm = "pre"                # "pre" (GPT-2) or "post" (BERT) LayerNorm placement
  m.norm_eps = 1e-5             # LayerNorm epsilon (GPT-2 1e-5, BERT 1e-12)
  m.dtype = "float32"           # compute dtype: "float32" or "bfloat16" (params stay float32)
  m.attention_impl = "xla"      # jax.nn.dot_product_attention implementation: "xla", "cudnn", "auto"

  c.optim = o = ml_collections.ConfigDict()
  o.lr = 1e-3                   # peak learning rate, reached after warm-up
  o.min_lr_ratio = 0.1          # cosine decays to min_lr_ratio · lr at the last step
  o.warmup_steps = 100          # linear warm-up from 0
  o.b1 = 0.9
  o.b2 = 0.95
  o.eps = 1e-8
  o.weight_decay = 0.1          # decoupled (AdamW); matrices and embeddings only
  o.clip_norm = 1.0             # clip_by_global_norm threshold; 0 disables clipping

  c.train = t = ml_collections.ConfigDict()
  t.steps = 5000
  t.batch_size = 32
  t.seed = 1337                 # the root of all randomness: init, batches, dropout
  t.log_every = 50              # steps between metric fetches / metrics.jsonl rows
  t.eval_every = 500            # steps between validation passes (also at step 0 and the end)
  t.checkpoint_every = 1000     # steps between checkpoints (also at the end)
  t.keep_checkpoints = 3        # how many checkpoints Orbax keeps
  t.progress = True             # tqdm progress bar on stderr

  c.data = d = ml_collections.ConfigDict()
  d.source = "tinystories"      # "tinystories" (TFDS) or "synthetic" (the embedded corpus)
  d.tokenizer = "gpt2"          # "gpt2", "byte" or "bpe:<vocab size>"
  d.seq_len = 128               # training window length; must be <= model.max_len
  d.val_batches = 8             # fixed validation windows = val_batches · batch_size
  d.dir = ""                    # cache root; "" means $ACTLAB_DATA_DIR or ~/.cache/actlab
  d.tinystories_version = "v2"  # "v2" (GPT-4 stories) or "v1"
  d.manual_dir = ""             # offline TinyStories files; "" means <data dir>/manual/tiny_stories
  d.gpt2_dir = ""               # offline encoder.json + vocab.bpe; "" means $ACTLAB_GPT2_DIR
  return c


def smoke(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A tiny model on the embedded synthetic corpus: minutes on 2 CPU cores, no downloads."""
  c.model.update(num_layers=2, d_model=128, num_heads=4, d_ff=512, max_len=128)
  c.optim.update(lr=3e-3, warmup_steps=30)
  c.train.update(steps=300, batch_size=16, log_every=10, eval_every=100,
                 checkpoint_every=100)
  c.data.update(source="synthetic", tokenizer="byte", seq_len=128, val_batches=4)
  return c


VARIANTS = {"": lambda c: c, "smoke": smoke}


def decoder(activation: str, variant: str | None = None) -> ml_collections.ConfigDict:
  """`get_config` of `configs/tinystories_<activation>.py`: the base plus a named variant."""
  variant = variant or ""
  if variant not in VARIANTS:
    raise ConfigError(f"unknown config variant {variant!r}; choose one of: "
                      + ", ".join(repr(v) for v in VARIANTS if v))
  return VARIANTS[variant](base(activation))


def _check(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises ConfigError (one readable line) for the first inconsistency found."""
  m, o, t, d = c.model, c.optim, c.train, c.data
  _check(m.kind in ("decoder", "encoder"),
         f"model.kind={m.kind!r}: choose 'decoder' or 'encoder'")
  try:
    activations.get(m.activation)
  except ValueError as e:
    raise ConfigError(f"model.activation: {e}") from None
  for name in ("num_layers", "d_model", "num_heads", "d_ff", "max_len"):
    _check(m[name] > 0, f"model.{name}={m[name]} must be positive")
  _check(m.d_model % m.num_heads == 0,
         f"model.d_model={m.d_model} is not divisible by model.num_heads={m.num_heads}")
  _check(m.vocab_size >= 0, f"model.vocab_size={m.vocab_size} must be >= 0 (0 = tokenizer's)")
  _check(0.0 <= m.dropout < 1.0, f"model.dropout={m.dropout} must be in [0, 1)")
  _check(m.norm in ("pre", "post"), f"model.norm={m.norm!r}: choose 'pre' or 'post'")
  _check(m.dtype in ("float32", "bfloat16"),
         f"model.dtype={m.dtype!r}: choose 'float32' or 'bfloat16'")
  _check(m.attention_impl in ("xla", "cudnn", "auto"),
         f"model.attention_impl={m.attention_impl!r}: choose 'xla', 'cudnn' or 'auto'")
  _check(o.lr > 0, f"optim.lr={o.lr} must be positive")
  _check(0.0 <= o.min_lr_ratio <= 1.0, f"optim.min_lr_ratio={o.min_lr_ratio} must be in [0, 1]")
  _check(0 <= o.warmup_steps < t.steps,
         f"optim.warmup_steps={o.warmup_steps} must be >= 0 and < train.steps={t.steps}")
  _check(0.0 <= o.b1 < 1.0 and 0.0 <= o.b2 < 1.0, f"optim.b1={o.b1}, b2={o.b2} must be in [0, 1)")
  _check(o.weight_decay >= 0, f"optim.weight_decay={o.weight_decay} must be >= 0")
  _check(o.clip_norm >= 0, f"optim.clip_norm={o.clip_norm} must be >= 0 (0 disables)")
  for name in ("steps", "batch_size", "log_every", "eval_every", "checkpoint_every",
               "keep_checkpoints"):
    _check(t[name] > 0, f"train.{name}={t[name]} must be positive")
  _check(d.source in ("tinystories", "synthetic"),
         f"data.source={d.source!r}: choose 'tinystories' or 'synthetic'")
  tok = d.tokenizer
  _check(tok in ("gpt2", "byte") or (tok.startswith("bpe:") and tok[4:].isdigit()
                                     and int(tok[4:]) > 256),
         f"data.tokenizer={tok!r}: choose 'gpt2', 'byte' or 'bpe:<vocab size > 256>'")
  _check(d.seq_len > 0, f"data.seq_len={d.seq_len} must be positive")
  _check(d.seq_len <= m.max_len,
         f"data.seq_len={d.seq_len} is longer than model.max_len={m.max_len}")
  _check(d.val_batches > 0, f"data.val_batches={d.val_batches} must be positive")
  _check(d.tinystories_version in ("v1", "v2"),
         f"data.tinystories_version={d.tinystories_version!r}: choose 'v1' or 'v2'")

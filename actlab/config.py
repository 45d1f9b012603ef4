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
  m.loss_impl = "fused"         # decoder LM head + loss: "fused" (chunked, no [B, L, V] logits in
                                # memory; actlab.kernels) or "plain" (logits, then cross-entropy)
  m.scan_layers = False         # nn.scan over the blocks: compile time independent of depth
                                # (params under "blocks" with a layer axis; another random init)
  m.remat = "none"              # recompute activations in the backward pass to save memory:
                                # "none", "full" (keep block inputs) or "dots" (also matmul outputs)

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

  c.metrics = mt = ml_collections.ConfigDict()  # what is measured; see the README
  mt.act_stats = True           # FFN activation statistics and attn_logit_max at every evaluation
  mt.sharpness_every = 500      # steps between sharpness estimates (also at step 0); 0 = off
  mt.sharpness_iters = 20       # power-iteration steps (Hessian-vector products) per estimate
  mt.tensorboard = True         # also write every metrics.jsonl row to <workdir>/tb (tensorboardX)
  # The stability verdict (actlab.metrics.verdict), applied to the logged loss curves:
  mt.spike_rel = 0.1            # spike: a post-warm-up train loss > (1 + spike_rel) · best before
  mt.final_gap_rel = 0.05       # unstable if final val loss > (1 + final_gap_rel) · best val loss
  mt.uniform_frac = 1.0         # diverged if final val loss >= uniform_frac · ln(vocab or classes)

  c.parallel = par = ml_collections.ConfigDict()  # devices and hosts; see actlab/parallel.py
  par.mode = "dp"               # "dp": batch split, state replicated; "fsdp": state split too
  par.distributed = False       # several hosts: jax.distributed.initialize() (env/cluster vars)
  par.fsdp_min_size = 16384     # fsdp: arrays with fewer elements stay replicated
  par.num_devices = 0           # use the first N devices; 0 = all (of all hosts)
  par.cpu_devices = 0           # CPU only: split the host into N XLA devices (data parallel over
                                # them; faster for small models, see parallel.py); 0 = one device

  c.sweep = sw = ml_collections.ConfigDict()  # how actlab.sweep runs the cells of a grid
  sw.vectorize = False          # cells that differ only in optim.lr / train.seed train as one
                                # vmapped program (actlab/vectorized.py); per-cell outputs unchanged
  sw.max_runs = 0               # at most this many cells per vectorized program; 0 = no limit

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
  c.metrics.sharpness_every = 0
  return c


VARIANTS = {"": lambda c: c, "smoke": smoke}


def decoder(activation: str, variant: str | None = None) -> ml_collections.ConfigDict:
  """`get_config` of `configs/tinystories_<activation>.py`: the base plus a named variant."""
  variant = variant or ""
  if variant not in VARIANTS:
    raise ConfigError(f"unknown config variant {variant!r}; choose one of: "
                      + ", ".join(repr(v) for v in VARIANTS if v))
  return VARIANTS[variant](base(activation))


# --- The BERT-style encoder (configs/bert_<activation>.py) -----------------------------------


def encoder_base(activation: str = "gelu") -> ml_collections.ConfigDict:
  """A small BERT for TinyStories: 4 post-LN layers, d_model 256, MLM on a WordPiece vocabulary.

  Everything not set here is the decoder's `base` (same data path, loop, metrics). The optimizer
  follows BERT (β₂ 0.999, ε 1e-6, weight decay 0.01); the FFN activation is the variable.
  """
  c = base(activation)
  m = c.model
  m.update(kind="encoder", num_layers=4, d_model=256, num_heads=4, d_ff=1024, max_len=128,
           norm="post", norm_eps=1e-12)
  m.task = "mlm"                # "mlm" (masked-LM pretraining) or "classify" (fine-tune on data.classify)
  m.pooler_activation = "tanh"  # pooler over [CLS] → the classifier (BERT: tanh); any plain activation
  m.type_vocab_size = 2         # segment (token-type) embeddings, as in BERT; all inputs use segment 0
  m.num_classes = 2             # classifier outputs (task "classify"); must match data.classify's labels
  c.optim.update(b2=0.999, eps=1e-6, weight_decay=0.01)
  c.train.init_from = ""        # workdir whose latest checkpoint initialises every parameter with the
                                # same name and shape (classify: the MLM run's trunk); "" = random init
  d = c.data
  d.tokenizer = "wordpiece:8192"  # the encoder needs [PAD] [UNK] [CLS] [SEP] [MASK] (ids 0-4)
  d.mlm_prob = 0.15             # fraction of maskable tokens selected per sequence (exactly, rounded)
  d.mlm_mask_frac = 0.8         # selected tokens replaced by [MASK]
  d.mlm_random_frac = 0.1       # selected tokens replaced by a random ordinary token (rest unchanged)
  d.classify = "glue/sst2"      # task "classify": "glue/sst2" (TFDS) or "synthetic/hero_gender"
  return c


def encoder_smoke(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """A tiny encoder on the embedded synthetic corpus: a couple of minutes on 2 CPU cores."""
  c.model.update(num_layers=2, d_model=128, num_heads=4, d_ff=512, max_len=128)
  c.optim.update(lr=2e-3, warmup_steps=30)
  c.train.update(steps=300, batch_size=16, log_every=10, eval_every=100, checkpoint_every=100)
  c.data.update(source="synthetic", tokenizer="wordpiece:2048", seq_len=128, val_batches=4,
                classify="synthetic/hero_gender")
  c.metrics.sharpness_every = 0
  return c


def encoder_bert_base(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """BERT-base (Devlin et al. 2019): 12 layers, 768, 12 heads, d_ff 3072, 512 positions,
  vocabulary 30,522 (padded to 30,528), dropout 0.1; pretraining at sequence length 128, batch
  256, peak LR 1e-4 with 10k warm-up steps over 1M steps."""
  c.model.update(num_layers=12, d_model=768, num_heads=12, d_ff=3072, max_len=512, dropout=0.1)
  c.optim.update(lr=1e-4, warmup_steps=10_000, min_lr_ratio=0.0)
  c.train.update(steps=1_000_000, batch_size=256, log_every=100, eval_every=10_000,
                 checkpoint_every=10_000)
  c.data.tokenizer = "wordpiece:30522"
  c.metrics.sharpness_every = 10_000
  return c


# Fine-tuning per size: steps, peak LR, batch size (SST-2 has 67k examples: 2,000 steps of 32 are
# about one epoch; BERT fine-tunes for 2-4 epochs at 2e-5 to 5e-5).
CLASSIFY_SETTINGS = {"": (2_000, 1e-4, 32), "smoke": (150, 1e-3, 16), "base": (6_000, 3e-5, 32)}


def encoder_classify(c: ml_collections.ConfigDict, size: str) -> ml_collections.ConfigDict:
  """Fine-tuning (`<size>_classify`): task "classify", 10% warm-up, decay to 0, no sharpness.
  Set `train.init_from` to the MLM run's workdir (else the encoder starts from random weights)."""
  steps, lr, batch_size = CLASSIFY_SETTINGS[size]
  c.model.task = "classify"
  c.optim.update(lr=lr, warmup_steps=steps // 10, min_lr_ratio=0.0)
  c.train.update(steps=steps, batch_size=batch_size, eval_every=max(50, steps // 10),
                 checkpoint_every=max(50, steps // 4))
  c.metrics.sharpness_every = 0
  return c


ENCODER_VARIANTS = {"": lambda c: c, "smoke": encoder_smoke, "base": encoder_bert_base}


def encoder(activation: str, variant: str | None = None) -> ml_collections.ConfigDict:
  """`get_config` of `configs/bert_<activation>.py`: `encoder_base` plus a variant: "" (small,
  TinyStories), "smoke" (tiny, embedded corpus), "base" (BERT-base), each with an optional
  "_classify" suffix (fine-tuning: "classify", "smoke_classify", "base_classify")."""
  variant = variant or ""
  size, classify = variant, variant == "classify" or variant.endswith("_classify")
  if classify:
    size = "" if variant == "classify" else variant[:-len("_classify")]
  if size not in ENCODER_VARIANTS:
    names = [v for v in ENCODER_VARIANTS if v] + ["classify"] + [
        f"{v}_classify" for v in ENCODER_VARIANTS if v]
    raise ConfigError(f"unknown encoder config variant {variant!r}; choose one of: "
                      + ", ".join(repr(v) for v in names))
  c = ENCODER_VARIANTS[size](encoder_base(activation))
  return encoder_classify(c, size) if classify else c


def _check(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def validate(c: ml_collections.ConfigDict) -> None:
  """Raises ConfigError (one readable line) for the first inconsistency found."""
  m, o, t, d = c.model, c.optim, c.train, c.data
  _validate_encoder(c)
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
  _check(m.get("loss_impl", "fused") in ("fused", "plain"),
         f"model.loss_impl={m.get('loss_impl')!r}: choose 'fused' or 'plain'")
  _check(isinstance(m.get("scan_layers", False), bool),
         f"model.scan_layers={m.get('scan_layers')!r} must be true or false")
  _check(m.get("remat", "none") in ("none", "full", "dots"),
         f"model.remat={m.get('remat')!r}: choose 'none', 'full' or 'dots'")
  # The encoder still builds its blocks in its own loop (not layers.stack_blocks): refuse
  # rather than silently ignore these two there.
  if m.kind != "decoder":
    _check(not m.get("scan_layers", False) and m.get("remat", "none") == "none",
           "model.scan_layers / model.remat are implemented for the decoder only so far")
  par = c.get("parallel", None)
  if par is not None:
    _check(par.mode in ("dp", "fsdp"), f"parallel.mode={par.mode!r}: choose 'dp' or 'fsdp'")
    _check(isinstance(par.distributed, bool),
           f"parallel.distributed={par.distributed!r} must be true or false")
    _check(par.fsdp_min_size >= 0, f"parallel.fsdp_min_size={par.fsdp_min_size} must be >= 0")
    _check(par.num_devices >= 0, f"parallel.num_devices={par.num_devices} must be >= 0 (0 = all)")
    _check(par.get("cpu_devices", 0) >= 0,
           f"parallel.cpu_devices={par.get('cpu_devices')} must be >= 0 (0 = one device)")
  sw = c.get("sweep", None)
  if sw is not None:
    _check(isinstance(sw.vectorize, bool), f"sweep.vectorize={sw.vectorize!r} must be true or false")
    _check(sw.max_runs >= 0, f"sweep.max_runs={sw.max_runs} must be >= 0 (0 = no limit)")
  for name in ("steps", "batch_size", "log_every", "eval_every", "checkpoint_every",
               "keep_checkpoints"):
    _check(t[name] > 0, f"train.{name}={t[name]} must be positive")
  _check(o.lr > 0, f"optim.lr={o.lr} must be positive")
  _check(0.0 <= o.min_lr_ratio <= 1.0, f"optim.min_lr_ratio={o.min_lr_ratio} must be in [0, 1]")
  _check(0 <= o.warmup_steps < t.steps,
         f"optim.warmup_steps={o.warmup_steps} must be >= 0 and < train.steps={t.steps}")
  _check(0.0 <= o.b1 < 1.0 and 0.0 <= o.b2 < 1.0, f"optim.b1={o.b1}, b2={o.b2} must be in [0, 1)")
  _check(o.weight_decay >= 0, f"optim.weight_decay={o.weight_decay} must be >= 0")
  _check(o.clip_norm >= 0, f"optim.clip_norm={o.clip_norm} must be >= 0 (0 disables)")
  _check(d.source in ("tinystories", "synthetic"),
         f"data.source={d.source!r}: choose 'tinystories' or 'synthetic'")
  tok = d.tokenizer
  _check(tok in ("gpt2", "byte") or (tok.startswith("bpe:") and tok[4:].isdigit()
                                     and int(tok[4:]) > 256)
         or (tok.startswith("wordpiece:") and tok[10:].isdigit() and int(tok[10:]) > 5),
         f"data.tokenizer={tok!r}: choose 'gpt2', 'byte', 'bpe:<vocab size > 256>' or "
         "'wordpiece:<vocab size>'")
  _check(d.seq_len > 0, f"data.seq_len={d.seq_len} must be positive")
  _check(d.seq_len <= m.max_len,
         f"data.seq_len={d.seq_len} is longer than model.max_len={m.max_len}")
  _check(d.val_batches > 0, f"data.val_batches={d.val_batches} must be positive")
  mt = c.metrics
  _check(mt.sharpness_every >= 0,
         f"metrics.sharpness_every={mt.sharpness_every} must be >= 0 (0 = off)")
  _check(mt.sharpness_iters > 0, f"metrics.sharpness_iters={mt.sharpness_iters} must be positive")
  for name in ("spike_rel", "final_gap_rel", "uniform_frac"):
    _check(mt[name] > 0, f"metrics.{name}={mt[name]} must be positive")
  _check(d.tinystories_version in ("v1", "v2"),
         f"data.tinystories_version={d.tinystories_version!r}: choose 'v1' or 'v2'")


ENCODER_FIELDS = ("model.task", "model.pooler_activation", "model.type_vocab_size",
                  "model.num_classes", "train.init_from", "data.mlm_prob", "data.mlm_mask_frac",
                  "data.mlm_random_frac", "data.classify")
CLASSIFY_DATA = ("glue/sst2", "synthetic/hero_gender")


def _validate_encoder(c: ml_collections.ConfigDict) -> None:
  """The encoder's fields (`encoder_base`); a decoder config has none of them."""
  m, d = c.model, c.data
  if m.kind != "encoder":
    _check(m.get("task", "lm") == "lm",
           f"model.task={m.get('task')!r}: the decoder has one task, causal LM ('lm')")
    return
  missing = [f for f in ENCODER_FIELDS if f.split(".")[1] not in c[f.split(".")[0]]]
  _check(not missing, f"model.kind='encoder' needs the encoder's fields ({', '.join(missing)} "
         "missing): start from configs/bert_<activation>.py (config.encoder)")
  _check(m.task in ("mlm", "classify"), f"model.task={m.task!r}: choose 'mlm' or 'classify'")
  try:
    pooler = activations.get(m.pooler_activation)
  except ValueError as e:
    raise ConfigError(f"model.pooler_activation: {e}") from None
  _check(not pooler.gated, f"model.pooler_activation={m.pooler_activation!r} is gated; the pooler "
         "takes a plain activation (tanh, gelu, identity, ...)")
  _check(m.type_vocab_size > 0, f"model.type_vocab_size={m.type_vocab_size} must be positive")
  _check(m.num_classes >= 2, f"model.num_classes={m.num_classes} must be at least 2")
  _check(d.tokenizer.startswith("wordpiece:"),
         f"data.tokenizer={d.tokenizer!r}: the encoder needs [CLS], [SEP], [MASK] and [PAD]; "
         "use 'wordpiece:<vocab size>'")
  _check(d.seq_len >= 3, f"data.seq_len={d.seq_len}: an encoder sequence needs [CLS], a token "
         "and [SEP]")
  _check(0.0 < d.mlm_prob < 1.0, f"data.mlm_prob={d.mlm_prob} must be in (0, 1)")
  _check(d.mlm_mask_frac >= 0 and d.mlm_random_frac >= 0
         and d.mlm_mask_frac + d.mlm_random_frac <= 1.0,
         f"data.mlm_mask_frac={d.mlm_mask_frac} and data.mlm_random_frac={d.mlm_random_frac} must "
         "be >= 0 with a sum <= 1")
  _check(d.classify in CLASSIFY_DATA,
         f"data.classify={d.classify!r}: choose one of {', '.join(map(repr, CLASSIFY_DATA))}")
  _check(isinstance(c.train.init_from, str), "train.init_from must be a workdir path or ''")

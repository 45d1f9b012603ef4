"""The default config (`base`: every field, with its comment), the builders of the shipped config
files (`decoder`, `encoder`, at the sizes of sizes.py) and the one override parser. `validate`
(validation.py) raises `ConfigError` with one readable line before anything compiles.
"""

import ast
from typing import Any, Mapping

import ml_collections

from actlab import errors
from actlab.config.sizes import (CLASSIFY_SETTINGS, DECODER_SIZES, ENCODER_PREFIX,
                                 ENCODER_SIZES, SIZES)
from actlab.config.validation import ConfigError, check, choices, validate

__all__ = ["BLOCKS", "ConfigError", "base", "decoder", "encoder", "override", "parse_arg", "parse_overrides",
           "validate"]


def base(activation: str = "gelu") -> ml_collections.ConfigDict:
  """The reference study's setup (docs/reference.md §2): GPT decoder on TinyStories, GPT-2 BPE."""
  c = ml_collections.ConfigDict()

  c.model = m = ml_collections.ConfigDict()
  m.kind = "decoder"            # "decoder" (GPT, causal LM) or "encoder" (BERT, MLM)
  m.activation = activation     # FFN activation: a name from actlab.core.activations.NAMES
  m.num_layers = 6
  m.d_model = 384
  m.num_heads = 6
  m.d_ff = 1536                 # FFN hidden width of the plain (two-matrix) FFN
  m.gated_match_params = True   # gated FFNs use round(2/3·d_ff) to a multiple of 64 (Shazeer 2020)
  m.max_len = 128               # learned position embeddings (context length)
  m.vocab_size = 0              # 0: the tokenizer's vocabulary; always padded to a multiple of 64
  m.dropout = 0.0
  m.norm = "pre"                # "pre" (GPT-2) or "post" (BERT) placement of the norms
  m.norm_type = "layer"         # "layer" (LayerNorm) or "rms" (RMSNorm as Llama's: float32,
                                # a scale only)
  m.norm_eps = 1e-5             # the norms' epsilon (GPT-2 1e-5, BERT 1e-12, Llama 1e-6)
  m.position = "learned"        # "learned" position embeddings (max_len of them) or "rope"
                                # (rotary on queries and keys, transformers' half-split layout)
  m.rope_theta = 10000.0        # RoPE's base (position="rope")
  m.bias = True                 # every linear and norm bias (false: none, as Llama)
  m.tie_head = True             # the LM head is the token embedding (GPT-2) or its own matrix
  m.ffn = "auto"                # "plain" W₂·act(W₁x), "gated" W₂·(act(W_g x) ⊙ W₁x) for any
                                # activation, "auto": gated for the GLU names (swiglu, ...)
  m.qk_norm = False             # qk-norm: the block's norm of queries and keys over the head dim
                                # before q·k (Wortsman et al. 2023); Hugging Face export in the
                                # LLaMA-style block only (Qwen3)
  m.dtype = "float32"           # compute dtype: "float32" or "bfloat16" (params stay float32)
  m.attention_impl = "xla"      # jax.nn.dot_product_attention implementation: "xla", "cudnn",
                                # "auto"
  m.loss_impl = "fused"         # decoder LM head + loss: "fused" (chunked, no [B, L, V] logits in
                                # memory; core/kernels.py) or "plain" (logits, then cross-entropy)
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
  o.z_loss = 0.0                # z-loss coefficient (PaLM): training adds z_loss · mean (log Z)²
                                # over the predicted positions, log Z = logsumexp of the output
                                # logits; train_loss and val_loss stay the cross-entropy

  c.train = t = ml_collections.ConfigDict()
  t.steps = 5000
  t.batch_size = 32
  t.seed = 1337                 # the root of all randomness: init, batches, dropout
  t.log_every = 50              # steps between metric fetches / metrics.jsonl rows
  t.eval_every = 500            # steps between validation passes (also at step 0 and the end)
  t.checkpoint_every = 1000     # steps between checkpoints (also at the end)
  t.keep_checkpoints = 3        # how many checkpoints Orbax keeps
  t.init_from = ""              # start from a workdir (latest checkpoint: every parameter with the
                                # same name and shape; classify: the MLM run's trunk) or hf:<dir>
                                # (a local GPT-2, BERT, Llama, Arcee or Qwen3 save_pretrained
                                # directory; the FFN activation stays this config's,
                                # docs/huggingface.md); "" = random init
  t.progress = True             # tqdm progress bar on stderr

  c.metrics = mt = ml_collections.ConfigDict()  # what is measured; see docs/metrics.md
  mt.act_stats = True           # FFN activation statistics and attn_logit_max at every evaluation
  mt.sharpness_every = 500      # steps between sharpness estimates (also at step 0); 0 = off,
                                # and none in a run of fewer train.steps (docs/metrics.md §5)
  mt.sharpness_iters = 20       # power-iteration steps (Hessian-vector products) per estimate
  mt.tensorboard = True         # also write every metrics.jsonl row to <workdir>/tb (tensorboardX)
  mt.wandb_project = ""         # also log every row to this Weights & Biases project ("" = off;
                                # pip install -e ".[wandb]"); files in <workdir>/wandb
  mt.wandb_mode = ""            # "online", "offline" (sync later: wandb sync) or "disabled";
                                # "" = W&B's choice ($WANDB_MODE, else online)
  mt.ffn_hist_bins = 64         # histogram of the FFN pre-activations per layer at every
                                # evaluation, for TensorBoard / W&B (not metrics.jsonl); 0 = off
  mt.ffn_hist_range = 8.0       # its bins span [-ffn_hist_range, ffn_hist_range], plus under-
                                # and overflow counts
  # The stability verdict (actlab.measure.metrics.verdict), applied to the logged loss curves:
  mt.spike_rel = 0.1            # spike: a post-warm-up train loss > (1 + spike_rel) · best before
  mt.final_gap_rel = 0.05       # unstable if final val loss > (1 + final_gap_rel) · best val loss
  mt.uniform_frac = 1.0         # diverged if final val loss >= uniform_frac · ln(vocab or classes)
  mt.grad_rel_max = 10.0        # unstable if a step's grad norm > grad_rel_max · at init (0: off)

  c.parallel = par = ml_collections.ConfigDict()  # devices and hosts; see actlab/run/parallel.py
  par.mode = "dp"               # "dp": batch split, state replicated; "fsdp": state split too
  par.distributed = False       # several processes: jax.distributed.initialize() (below, else
                                # JAX_* variables or the cluster: TPU pod, SLURM, Open MPI)
  par.coordinator = ""          # distributed: process 0's "host:port"; "" = from the environment
  par.num_processes = 0         # distributed: how many processes; 0 = from the environment
  par.process_id = -1           # distributed: this process's index; -1 = from the environment
  par.fsdp_min_size = 16384     # fsdp: arrays with fewer elements stay replicated
  par.num_devices = 0           # use the first N devices; 0 = all (of all hosts)
  par.cpu_devices = 0           # CPU only: split the host into N XLA devices (data parallel over
                                # them; faster for small models, see parallel.py); 0 = one device

  c.sweep = sw = ml_collections.ConfigDict()  # how actlab.sweep runs the cells of a grid
  sw.vectorize = False          # cells that differ only in optim.lr / train.seed train as one
                                # vmapped program (train.run_group); per-cell outputs unchanged
  sw.max_runs = 0               # at most this many cells per vectorized program; 0 = no limit

  c.data = d = ml_collections.ConfigDict()
  d.source = "tinystories"      # "tinystories" (TFDS) or "synthetic" (the embedded corpus)
  d.tokenizer = "gpt2"          # "gpt2", "byte", "bpe:<vocab size>" or "wordpiece:<vocab size>"
  d.seq_len = 128               # training window length; must be <= model.max_len
  d.val_batches = 8             # fixed validation windows = val_batches · batch_size
  d.test_batches = 0            # > 0: held-out test windows (test_batches · batch_size) from
                                # the validation split's second half, scored once at the end
                                # (final_test_loss); the validation windows keep the first half
  d.dir = ""                    # cache root; "" means $ACTLAB_DATA_DIR or ~/.cache/actlab
  d.tinystories_version = "v2"  # "v2" (GPT-4 stories) or "v1"
  d.manual_dir = ""             # offline TinyStories files; "" means <data dir>/manual/tiny_stories
  d.gpt2_dir = ""               # offline encoder.json + vocab.bpe; "" means $ACTLAB_GPT2_DIR
  return c


# The decoder's blocks by name: GPT-2's (`base`), and the LLaMA-style block (RMSNorm, rotary
# positions, no biases, an untied head, a gated FFN for any activation).
BLOCKS = {"gpt2": {},
          "llama": {"model.norm_type": "rms", "model.norm_eps": 1e-6, "model.position": "rope",
                    "model.bias": False, "model.tie_head": False, "model.ffn": "gated"}}


def decoder(activation: str = "gelu", size: str | None = None,
            block: str = "gpt2") -> ml_collections.ConfigDict:
  """`configs/decoder.py` (and `tinystories_<activation>.py`): `base` at a decoder size of
  `SIZES` ("reference", the default, is `base` itself) with a block of `BLOCKS`."""
  size = size or "reference"
  if size not in DECODER_SIZES:
    raise ConfigError(f"unknown config variant {size!r}; choose one of: {choices(DECODER_SIZES)}")
  check(block in BLOCKS, f"unknown block {block!r}; choose one of: {choices(BLOCKS)}")
  return override(override(base(activation), SIZES[size]), BLOCKS[block])


def encoder(activation: str = "gelu", size: str | None = None,
            task: str = "mlm") -> ml_collections.ConfigDict:
  """`configs/encoder.py` (and `bert_<activation>.py`): the BERT-style encoder (post-LN, BERT's
  optimizer) at an encoder size of `SIZES` (default "small") for `task` "mlm" or "classify"
  (docs/encoder.md). A `size` may name the task too: "classify", "smoke_classify", ..."""
  if size and (size == "classify" or size.endswith("_classify")):
    size, task = size.removesuffix("classify").removesuffix("_"), "classify"
  size = size or "small"
  check(task in ("mlm", "classify"), f"encoder task {task!r}: choose 'mlm' or 'classify'")
  variant = size if task == "mlm" else f"{size}_classify"
  variants = ENCODER_SIZES + ["classify"] + [f"{s}_classify" for s in CLASSIFY_SETTINGS]
  check(variant in variants,
        f"unknown encoder config variant {variant!r}; choose one of: {choices(variants)}")
  c = base(activation)
  m = c.model
  m.update(kind="encoder", norm="post", norm_eps=1e-12)
  m.task = "mlm"                # "mlm" (MLM pretraining) or "classify" (fine-tune on data.classify)
  m.pooler_activation = "tanh"  # [CLS] pooler → the classifier (BERT: tanh); any plain activation
  m.type_vocab_size = 2         # segment (token-type) embeddings, as in BERT; inputs use segment 0
  m.num_classes = 2             # classifier outputs; must match data.classify's number of labels
  c.optim.update(b2=0.999, eps=1e-6, weight_decay=0.01)
  d = c.data
  d.mlm_prob = 0.15             # share of maskable tokens selected per sequence (exactly, rounded)
  d.mlm_mask_frac = 0.8         # selected tokens replaced by [MASK]
  d.mlm_random_frac = 0.1       # selected tokens replaced by a random ordinary one (rest unchanged)
  d.classify = "glue/sst2"      # task "classify": "glue/sst2" (TFDS) or "synthetic/hero_gender"
  override(c, SIZES[ENCODER_PREFIX + size])
  if task == "classify":
    steps, lr, batch_size = CLASSIFY_SETTINGS[size]
    override(c, {"model.task": "classify", "optim.lr": lr, "optim.warmup_steps": steps // 10,
                 "optim.min_lr_ratio": 0.0, "train.steps": steps, "train.batch_size": batch_size,
                 "train.eval_every": max(50, steps // 10),
                 "train.checkpoint_every": max(50, steps // 4), "metrics.sharpness_every": 0,
                 # A new 2-class head starts with a near-zero gradient: growth from it is no
                 # sign of instability (docs/metrics.md §6).
                 "metrics.grad_rel_max": 0.0})
  return c


# --- Arguments and overrides --------------------------------------------------------------------

_BOOLS = {"true": True, "false": False}


def parse_arg(arg: str | None, **defaults) -> ml_collections.ConfigDict:
  """`get_config(arg)`'s argument as big_vision's `parse_arg` reads it: "key=value,..." sets keys
  of `defaults`, as their types (bools: true or false); a first item without "=" is the first
  key's value (`decoder.py:smoke,act=swiglu`). ConfigError for an unknown key or bad value."""
  values = dict(defaults)
  for i, item in enumerate(filter(None, (x.strip() for x in (arg or "").split(",")))):
    key, eq, text = item.partition("=")
    if not eq and i == 0:
      key, text = next(iter(defaults)), item
    if key not in defaults:
      raise ConfigError(f"unknown config argument {item!r}; use {', '.join(defaults)} "
                        "(key=value, comma-separated)")
    kind = type(defaults[key])
    try:
      values[key] = _BOOLS[text.lower()] if kind is bool else kind(text)
    except (KeyError, ValueError):
      raise ConfigError(f"config argument {item!r}: expected {kind.__name__}") from None
  return ml_collections.ConfigDict(values)


def parse_overrides(text: str) -> dict[str, Any]:
  """"model.loss_impl=plain,train.steps=3" → {"model.loss_impl": "plain", "train.steps": 3}:
  values as Python literals, true/false as bools, anything else as a string."""
  overrides = {}
  for item in filter(None, (x.strip() for x in text.split(","))):
    key, eq, value = (x.strip() for x in item.partition("="))
    if not eq:
      raise ConfigError(f"override {item!r}: write section.field=value")
    if value.lower() in _BOOLS:
      overrides[key] = _BOOLS[value.lower()]
      continue
    try:
      overrides[key] = ast.literal_eval(value)
    except (ValueError, SyntaxError):
      overrides[key] = value
  return overrides


def override(config: ml_collections.ConfigDict,
             overrides: Mapping[str, Any]) -> ml_collections.ConfigDict:
  """`config` with each dotted `section.field` of `overrides` set (in place); ConfigError for a key
  that names no field or a value of another type than the field's."""
  for key, value in overrides.items():
    *sections, field = key.split(".")
    node = config
    for part in sections:
      node = node.get(part) if isinstance(node, ml_collections.ConfigDict) else None
    if (not isinstance(node, ml_collections.ConfigDict) or field not in node
        or isinstance(node[field], ml_collections.ConfigDict)):
      problem = errors.unknown_field(config, key)
      raise ConfigError(f"{key}: no such field" + (f" ({problem})" if problem else ""))
    try:
      node[field] = value
    except TypeError:
      raise ConfigError(f"{key}={value!r}: expected {type(node[field]).__name__}, got "
                        f"{type(value).__name__}") from None
  return config

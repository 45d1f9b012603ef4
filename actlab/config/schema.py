"""Every config field, written once: its default, what it may be and what it does, the comment
beside it (`python -m actlab.config` prints them: fields.py). A section is a dataclass; a field
the core owns (`core.Spec`, `core.Execution`, `core.OptimSpec`) takes its default and its choices
from the core's field. `config.base()` is built from these, and `validation.validate` checks each
field against its own rule before it checks the fields' relations.
"""

import dataclasses
from typing import Any, Callable

from actlab import core
from actlab.config.rules import (activation_name, at_least, boolean, listed, non_negative,
                                 one_of, parsed, positive, text, within)
from actlab.data import classify as classify_data
from actlab.data.tokenizer import parse_spec


def field(default, rule: Callable[[str, Any], None] | None = None):
  """A field: its default and the rule its values keep (None: any value of its type)."""
  return dataclasses.field(default=default, metadata={"rule": rule})


def core_field(cls, name: str, rule: Callable[[str, Any], None] | None = None):
  """The field `name` of the core's dataclass `cls`: its default, and its choices where it has
  them (`core.model.choice`), written there once."""
  f = next(f for f in dataclasses.fields(cls) if f.name == name)
  rule = one_of(*f.metadata["choices"]) if "choices" in f.metadata else rule
  return dataclasses.field(default=f.default, metadata={"rule": rule, "core": cls})


def rules(section) -> dict[str, Callable]:
  """{field: its rule} of a section's dataclass, for the fields that have one."""
  return {f.name: f.metadata["rule"] for f in dataclasses.fields(section) if f.metadata["rule"]}


# --- Sections, in the order a config lists them; the comment beside a field is its documentation

@dataclasses.dataclass(frozen=True)
class Model:
  kind: str = field("decoder", one_of("decoder", "encoder"))  # "decoder" (GPT, causal LM) or
                                # "encoder" (BERT, MLM)
  activation: str = field("gelu", activation_name())  # FFN activation: a name from
                                # actlab.core.activations.NAMES
  num_layers: int = field(6, positive)
  d_model: int = field(384, positive)
  num_heads: int = field(6, positive)
  d_ff: int = field(1536, positive)  # FFN hidden width of the plain (two-matrix) FFN
  gated_match_params: bool = core_field(core.Spec, "gated_match_params", boolean)  # gated FFNs
                                # use round(2/3·d_ff) to a multiple of 64 (Shazeer 2020)
  max_len: int = field(128, positive)  # learned position embeddings (context length)
  vocab_size: int = field(0, non_negative(" (0 = tokenizer's)"))  # 0: the tokenizer's
                                # vocabulary; always padded to a multiple of 64
  dropout: float = core_field(core.Spec, "dropout", within(0, 1))
  norm: str = core_field(core.Spec, "norm")  # "pre" (GPT-2) or "post" (BERT) placement of the
                                # norms
  norm_type: str = core_field(core.Spec, "norm_type")  # "layer" (LayerNorm) or "rms" (RMSNorm
                                # as Llama's: float32, a scale only)
  norm_eps: float = core_field(core.Spec, "norm_eps")  # the norms' epsilon (GPT-2 1e-5, BERT
                                # 1e-12, Llama 1e-6)
  position: str = core_field(core.Spec, "position")  # "learned" position embeddings (max_len
                                # of them) or "rope" (rotary on queries and keys, transformers'
                                # half-split layout)
  rope_theta: float = core_field(core.Spec, "rope_theta", positive)  # RoPE's base
                                # (position="rope")
  bias: bool = core_field(core.Spec, "bias", boolean)  # every linear and norm bias (false:
                                # none, as Llama)
  tie_head: bool = core_field(core.Spec, "tie_head", boolean)  # the LM head is the token
                                # embedding (GPT-2) or its own matrix
  ffn: str = core_field(core.Spec, "ffn")  # "plain" W₂·act(W₁x), "gated" W₂·(act(W_g x) ⊙ W₁x)
                                # for any activation, "auto": gated for the GLU names (swiglu,
                                # ...)
  qk_norm: bool = core_field(core.Spec, "qk_norm", boolean)  # qk-norm: the block's norm of
                                # queries and keys over the head dim before q·k (Wortsman et al.
                                # 2023); Hugging Face export in the LLaMA-style block only (Qwen3)
  dtype: str = core_field(core.Execution, "dtype")  # compute dtype: "float32" or "bfloat16"
                                # (params stay float32)
  attention_impl: str = core_field(core.Execution, "attention_impl")  # jax.nn.
                                # dot_product_attention implementation: "xla", "cudnn", "auto"
  loss_impl: str = field("fused", one_of("fused", "plain"))  # decoder LM head + loss: "fused"
                                # (chunked, no [B, L, V] logits in memory; core/kernels.py) or
                                # "plain" (logits, then cross-entropy)
  scan_layers: bool = core_field(core.Execution, "scan_layers", boolean)  # nn.scan over the
                                # blocks: compile time independent of depth (params under
                                # "blocks" with a layer axis; another random init)
  remat: str = core_field(core.Execution, "remat")  # recompute activations in the backward
                                # pass to save memory: "none", "full" (keep block inputs) or
                                # "dots" (also matmul outputs)


@dataclasses.dataclass(frozen=True)
class EncoderModel:
  """The encoder's own model fields (`config.encoder`)."""
  task: str = field("mlm", one_of("mlm", "classify"))  # "mlm" (MLM pretraining) or "classify"
                                # (fine-tune on data.classify)
  pooler_activation: str = field("tanh", activation_name(plain=True))  # [CLS] pooler → the
                                # classifier (BERT: tanh); any plain activation
  type_vocab_size: int = field(2, positive)  # segment (token-type) embeddings, as in BERT;
                                # inputs use segment 0
  num_classes: int = field(2, at_least(2))  # classifier outputs; must match data.classify's
                                # number of labels


@dataclasses.dataclass(frozen=True)
class Optim:
  lr: float = core_field(core.OptimSpec, "lr", positive)  # peak learning rate, reached after
                                # warm-up
  min_lr_ratio: float = core_field(core.OptimSpec, "min_lr_ratio", within(0, 1, "[]"))  # cosine
                                # decays to min_lr_ratio · lr at the last step
  warmup_steps: int = core_field(core.OptimSpec, "warmup_steps")  # linear warm-up from 0
  b1: float = core_field(core.OptimSpec, "b1", within(0, 1))
  b2: float = core_field(core.OptimSpec, "b2", within(0, 1))
  eps: float = core_field(core.OptimSpec, "eps")
  weight_decay: float = core_field(core.OptimSpec, "weight_decay", non_negative())  # decoupled
                                # (AdamW); matrices and embeddings only
  clip_norm: float = core_field(core.OptimSpec, "clip_norm", non_negative(" (0 disables)"))
                                # clip_by_global_norm threshold; 0 disables clipping
  spike_clip: float = core_field(core.OptimSpec, "spike_clip", non_negative(" (0 = off)"))
                                # spike-only clipping: a gradient whose global norm is above
                                # spike_clip × the run's own at its first step is scaled to that
                                # norm, any other left as it is (10: the stability rule's
                                # threshold); 0 = off; not with clip_norm
  z_loss: float = field(0.0, non_negative(" (0 = off)"))  # z-loss coefficient (PaLM): training
                                # adds z_loss · mean (log Z)² over the predicted positions, log Z
                                # = logsumexp of the output logits; train_loss and val_loss stay
                                # the cross-entropy


@dataclasses.dataclass(frozen=True)
class Train:
  steps: int = field(5000, positive)
  batch_size: int = field(32, positive)
  seed: int = field(1337)       # the root of all randomness: init, batches, dropout
  log_every: int = field(50, positive)  # steps between metric fetches / metrics.jsonl rows
  eval_every: int = field(500, positive)  # steps between validation passes (also at step 0 and
                                # the end)
  checkpoint_every: int = field(1000, positive)  # steps between checkpoints (also at the end)
  keep_checkpoints: int = field(3, positive)  # how many checkpoints Orbax keeps
  init_from: str = field("", text("a workdir path, hf:<Hugging Face model directory>, or ''"))
                                # start from a workdir (latest checkpoint: every parameter with
                                # the same name and shape; classify: the MLM run's trunk) or
                                # hf:<dir> (a local GPT-2, BERT, Llama, Arcee or Qwen3
                                # save_pretrained directory; the FFN activation stays this
                                # config's, docs/huggingface.md); "" = random init
  progress: bool = field(True, boolean)  # tqdm progress bar on stderr
  compile_cache: str = field("auto", text('"auto", "off" or a folder'))  # where compiled
                                # programs are kept for the next run (docs/performance.md):
                                # "auto" = $JAX_COMPILATION_CACHE_DIR, else ~/.cache/actlab/xla;
                                # "off"; or a folder


@dataclasses.dataclass(frozen=True)
class Metrics:
  """What is measured; see docs/metrics.md."""
  act_stats: bool = field(True, boolean)  # FFN activation statistics and attn_logit_max at every
                                # evaluation
  sharpness_every: int = field(500, non_negative(" (0 = off)"))  # steps between sharpness
                                # estimates (also at step 0); 0 = off, and none in a run of fewer
                                # train.steps (docs/metrics.md §5)
  sharpness_iters: int = field(20, positive)  # power-iteration steps (Hessian-vector products)
                                # per estimate
  tensorboard: bool = field(True, boolean)  # also write every metrics.jsonl row to <workdir>/tb
                                # (tensorboardX)
  wandb_project: str = field("")  # also log every row to this Weights & Biases project ("" =
                                # off; pip install -e ".[wandb]"); files in <workdir>/wandb
  wandb_mode: str = field("", one_of("", "online", "offline", "disabled"))  # "online",
                                # "offline" (sync later: wandb sync) or "disabled"; "" = W&B's
                                # choice ($WANDB_MODE, else online)
  ffn_hist_bins: int = field(64, within(0, 500, "[]", " (0 = off)"))  # histogram of the FFN
                                # pre-activations per layer at every evaluation, for TensorBoard
                                # / W&B (not metrics.jsonl); 0 = off
  ffn_hist_range: float = field(8.0, positive)  # its bins span [-ffn_hist_range,
                                # ffn_hist_range], plus under- and overflow counts
  # The stability verdict (actlab.measure.metrics.verdict), applied to the logged loss curves:
  spike_rel: float = field(0.1, positive)  # spike: a post-warm-up train loss > (1 + spike_rel) ·
                                # best before
  final_gap_rel: float = field(0.05, positive)  # unstable if final val loss > (1 +
                                # final_gap_rel) · best val loss
  uniform_frac: float = field(1.0, positive)  # diverged if final val loss >= uniform_frac ·
                                # ln(vocab or classes)
  grad_rel_max: float = field(10.0, non_negative(" (0 = off)"))  # unstable if a step's grad
                                # norm > grad_rel_max · at init (0: off)


@dataclasses.dataclass(frozen=True)
class Parallel:
  """Devices and hosts; see actlab/infra/parallel.py."""
  mode: str = field("dp", one_of("dp", "fsdp"))  # "dp": batch split, state replicated; "fsdp":
                                # state split too
  distributed: bool = field(False, boolean)  # several processes: jax.distributed.initialize()
                                # (below, else JAX_* variables or the cluster: TPU pod, SLURM,
                                # Open MPI)
  coordinator: str = field("")  # distributed: process 0's "host:port"; "" = from the environment
  num_processes: int = field(0)  # distributed: how many processes; 0 = from the environment
  process_id: int = field(-1)   # distributed: this process's index; -1 = from the environment
  fsdp_min_size: int = field(16384, non_negative())  # fsdp: arrays with fewer elements stay
                                # replicated
  num_devices: int = field(0, non_negative(" (0 = all)"))  # use the first N devices; 0 = all
                                # (of all hosts)
  cpu_devices: int = field(0, non_negative(" (0 = one device)"))  # CPU only: split the host
                                # into N XLA devices (data parallel over them; faster for small
                                # models, see parallel.py); 0 = one device


@dataclasses.dataclass(frozen=True)
class Sweep:
  """How actlab.sweep runs the cells of a grid."""
  vectorize: bool = field(False, boolean)  # cells that differ only in optim.lr / train.seed
                                # train as one vmapped program (train.run_group); per-cell
                                # outputs unchanged
  max_runs: int = field(0, non_negative(" (0 = no limit)"))  # at most this many cells per
                                # vectorized program; 0 = no limit


@dataclasses.dataclass(frozen=True)
class Data:
  source: str = field("tinystories", one_of("tinystories", "synthetic"))  # "tinystories" (TFDS)
                                # or "synthetic" (the embedded corpus)
  tokenizer: str = field("gpt2", lambda k, v: parsed(k, parse_spec, v))  # "gpt2",
                                # "byte", "bpe:<vocab size>" or "wordpiece:<vocab size>"
  seq_len: int = field(128, positive)  # training window length; must be <= model.max_len
  val_batches: int = field(8, positive)  # fixed validation windows = val_batches · batch_size
  test_batches: int = field(0, non_negative(" (0 = no test split)"))  # > 0: held-out test
                                # windows (test_batches · batch_size) from the validation split's
                                # second half, scored once at the end (final_test_loss); the
                                # validation windows keep the first half
  dir: str = field("")          # cache root; "" means $ACTLAB_DATA_DIR or ~/.cache/actlab
  tinystories_version: str = field("v2", one_of("v1", "v2"))  # "v2" (GPT-4 stories) or "v1"
  manual_dir: str = field("")   # offline TinyStories files; "" means <data
                                # dir>/manual/tiny_stories
  gpt2_dir: str = field("")     # offline encoder.json + vocab.bpe; "" means $ACTLAB_GPT2_DIR


@dataclasses.dataclass(frozen=True)
class EncoderData:
  """The encoder's own data fields (`config.encoder`)."""
  mlm_prob: float = field(0.15, within(0, 1, "()"))  # share of maskable tokens selected per
                                # sequence (exactly, rounded)
  mlm_mask_frac: float = field(0.8)  # selected tokens replaced by [MASK]
  mlm_random_frac: float = field(0.1)  # selected tokens replaced by a random ordinary one (rest
                                # unchanged)
  classify: str = field("glue/sst2", listed(classify_data.SOURCES))  # task "classify": "glue/sst2"
                                # (TFDS) or "synthetic/hero_gender"


SECTIONS = {"model": Model, "optim": Optim, "train": Train, "metrics": Metrics,
            "parallel": Parallel, "sweep": Sweep, "data": Data}
ENCODER = {"model": EncoderModel, "data": EncoderData}  # what `config.encoder` adds

# The block options whose defaults (`core.Spec`'s) build GPT-2's block, at those defaults: the
# block every run built before the options existed, and the one the encoder and the GPT-2 and
# BERT mappings (actlab/hf/) keep to (`config.BLOCKS` names the decoder's blocks).
GPT2_BLOCK = {name: getattr(Model, name) for name in ("norm_type", "position", "bias", "tie_head")}


def defaults(sections: dict = SECTIONS) -> dict[str, dict]:
  """{section: {field: default}} of `sections`, in order."""
  return {name: {f.name: f.default for f in dataclasses.fields(cls)}
          for name, cls in sections.items()}

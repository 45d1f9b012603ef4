"""A straightforward PyTorch implementation of actlab's decoder, for speed comparisons only.

nanoGPT's architecture (Karpathy, model.py), eager or `torch.compile`d, float32 or under
bfloat16 autocast, on the CPU or a CUDA device: token + position embeddings, pre-LN blocks
(fused `c_attn` q/k/v projection, `F.scaled_dot_product_attention` with `is_causal=True`, MLP
`c_fc` → activation → `c_proj`), a final LayerNorm and an LM head tied to the token embedding;
`F.cross_entropy` over the materialised logits; `torch.optim.AdamW` (default implementation,
decay on matrices and embeddings) or, with `optim` "muon", `torch.optim.Muon` on the blocks'
matrices and AdamW on the rest (`optimizers`), after `clip_grad_norm_` or, with `spike_clip`,
spike-only clipping (`clip_spikes`, as actlab's); a constant LR (a schedule, cosine or
warm-up–stable–decay, costs nothing to time). The same shapes, initialisation
scales and hyperparameters as the actlab config it is built from, so both do the same FLOPs per
step; not actlab's RNGs, but from the same weights the same loss (tests/test_bench.py). The
block's options are actlab's (`GPT2_BLOCK`'s keys; docs/running.md, "The block, field by
field"): e.g. RMSNorm, RoPE, no biases, an untied head, a gated FFN for any activation.

Never imported by actlab at run time: `actlab.bench --torch` runs it in a subprocess, and the
`bench` extra (`pip install -e '.[bench]'`; on CPU take the CPU wheel:
`pip install torch --index-url https://download.pytorch.org/whl/cpu`) provides torch.

    python benchmarks/torch_ref.py --layers 2 --d_model 128 --heads 4 --d_ff 512 \\
        --seq_len 128 --vocab 320 --batch 16 --steps 20

`--worker` speaks a line protocol on stdin/stdout (used by `actlab.bench`): the first line is a
JSON model description (shapes, hyperparameters, and `compile`, `device`, `dtype`), then each line
`run <n>` answers with one JSON line of n step times (each step waited for) and `queue <n>` with
the wall time of n steps queued back to back (one wait at the end).
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def _act(name: str):
  """(activation, gated) for actlab's activation names that have a torch counterpart."""
  table = {
      "relu": (F.relu, False), "gelu": (F.gelu, False),
      "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), False),
      "silu": (F.silu, False), "tanh": (torch.tanh, False), "elu": (F.elu, False),
      "sigmoid": (torch.sigmoid, False), "identity": (lambda x: x, False),
      "relu2": (lambda x: F.relu(x).square(), False),
      "swiglu": (F.silu, True), "geglu": (F.gelu, True), "reglu": (F.relu, True),
      "glu": (torch.sigmoid, True), "bilinear": (lambda x: x, True),
  }
  if name not in table:
    raise ValueError(f"torch_ref has no activation {name!r}; choose one of {sorted(table)}")
  return table[name]


GPT2_BLOCK = {"norm_type": "layer", "norm_eps": 1e-5, "position": "learned", "rope_theta": 10000.0,
              "bias": True, "tie_head": True, "ffn": "auto", "qk_norm": False}


def gated(activation: str, ffn: str = "auto") -> bool:
  """Whether the FFN is gated: `ffn` "gated", or "auto" with a GLU name (actlab's `spec.gated`)."""
  return ffn == "gated" or (ffn == "auto" and _act(activation)[1])


class RMSNorm(nn.Module):
  """x / √(mean(x²) + eps) · weight (from 1), as Llama's: float32 statistic, cast back, no bias."""

  def __init__(self, d, eps):
    super().__init__()
    self.eps = eps
    self.weight = nn.Parameter(torch.ones(d))

  def forward(self, x):
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
    return self.weight * y.to(x.dtype)


def make_norm(d, block):
  """The block's norm over the last axis: LayerNorm (its bias as `bias` says) or RMSNorm."""
  if block["norm_type"] == "rms":
    return RMSNorm(d, block["norm_eps"])
  return nn.LayerNorm(d, eps=block["norm_eps"], bias=block["bias"])


def rope(x, cos, sin):
  """x [B, H, T, K] rotated by positions 0 … T−1 (angles in float32, the result in x's dtype)."""
  T = x.size(2)
  x1, x2 = x.chunk(2, dim=-1)
  return (x * cos[:T] + torch.cat([-x2, x1], dim=-1) * sin[:T]).to(x.dtype)


class CausalSelfAttention(nn.Module):
  def __init__(self, d_model, n_head, layers, block=GPT2_BLOCK, max_len=0):
    super().__init__()
    self.n_head = n_head
    self.c_attn = nn.Linear(d_model, 3 * d_model, bias=block["bias"])
    self.c_proj = nn.Linear(d_model, d_model, bias=block["bias"])
    self.c_proj.residual = True
    head_dim = d_model // n_head
    self.q_norm = make_norm(head_dim, block) if block["qk_norm"] else None
    self.k_norm = make_norm(head_dim, block) if block["qk_norm"] else None
    self.rope = block["position"] == "rope"
    if self.rope:  # angles position · theta^(−2j/K) of features j and j + K/2 (`rotate_half`)
      inv_freq = 1.0 / block["rope_theta"] ** (torch.arange(0, head_dim, 2) / head_dim)
      angles = torch.outer(torch.arange(max_len, dtype=torch.float32), inv_freq).repeat(1, 2)
      self.register_buffer("cos", angles.cos(), persistent=False)
      self.register_buffer("sin", angles.sin(), persistent=False)

  def forward(self, x):
    B, T, C = x.size()
    q, k, v = self.c_attn(x).split(C, dim=2)
    q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
    k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
    v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
    if self.q_norm is not None:
      q, k = self.q_norm(q), self.k_norm(k)
    if self.rope:
      q, k = rope(q, self.cos, self.sin), rope(k, self.cos, self.sin)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    y = y.transpose(1, 2).contiguous().view(B, T, C)
    return self.c_proj(y)


class MLP(nn.Module):
  def __init__(self, d_model, d_ff, activation, block=GPT2_BLOCK):
    super().__init__()
    self.act = _act(activation)[0]
    self.gated = gated(activation, block["ffn"])
    self.c_fc = nn.Linear(d_model, d_ff, bias=block["bias"])
    self.c_gate = nn.Linear(d_model, d_ff, bias=block["bias"]) if self.gated else None
    self.c_proj = nn.Linear(d_ff, d_model, bias=block["bias"])
    self.c_proj.residual = True

  def forward(self, x):
    h = self.act(self.c_gate(x)) * self.c_fc(x) if self.gated else self.act(self.c_fc(x))
    return self.c_proj(h)


class Block(nn.Module):
  def __init__(self, d_model, n_head, d_ff, activation, layers, block=GPT2_BLOCK, max_len=0):
    super().__init__()
    self.ln_1 = make_norm(d_model, block)
    self.attn = CausalSelfAttention(d_model, n_head, layers, block, max_len)
    self.ln_2 = make_norm(d_model, block)
    self.mlp = MLP(d_model, d_ff, activation, block)

  def forward(self, x):
    x = x + self.attn(self.ln_1(x))
    return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
  """GPT-2's decoder, or with `block` (a dict of `GPT2_BLOCK`'s keys) e.g. the LLaMA-style one."""

  def __init__(self, vocab, max_len, layers, d_model, n_head, d_ff, activation, block=None):
    super().__init__()
    block = {**GPT2_BLOCK, **(block or {})}
    self.wte = nn.Embedding(vocab, d_model)
    self.wpe = nn.Embedding(max_len, d_model) if block["position"] == "learned" else None
    self.h = nn.ModuleList([Block(d_model, n_head, d_ff, activation, layers, block, max_len)
                            for _ in range(layers)])
    self.ln_f = make_norm(d_model, block)
    self.lm_head = nn.Linear(d_model, vocab, bias=False)
    if block["tie_head"]:
      self.lm_head.weight = self.wte.weight  # tied, as nanoGPT
    for name, p in self.named_parameters():
      if p.dim() >= 2:
        std = 0.02 / math.sqrt(2 * layers) if name.endswith("c_proj.weight") else 0.02
        nn.init.normal_(p, mean=0.0, std=std)
      elif name.endswith("bias"):
        nn.init.zeros_(p)

  def forward(self, idx, targets):
    x = self.wte(idx)
    if self.wpe is not None:
      x = x + self.wpe(torch.arange(idx.size(1), dtype=torch.long, device=idx.device))
    for block in self.h:
      x = block(x)
    logits = self.lm_head(self.ln_f(x))
    return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def ffn_width(activation, d_ff, gated_match_params=True, ffn="auto"):
  if gated(activation, ffn) and gated_match_params:
    return max(64, round(2 * d_ff / 3 / 64) * 64)
  return d_ff


def clip_spikes(parameters, multiple: float, initial_norm):
  """actlab's spike-only clipping (core/step.py): gradients whose global norm is above `multiple`
  × the first step's (`initial_norm`; None at the first step) scaled to that norm, others
  unchanged, without a host sync. Returns the first step's norm."""
  grads = [p.grad for p in parameters if p.grad is not None]
  norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
  now = norm.detach()
  initial_norm = now if initial_norm is None else torch.where(initial_norm > 0, initial_norm,
                                                              now)  # a zero one: the next
  limit = multiple * initial_norm
  scale = torch.where(norm <= limit, torch.ones_like(norm), limit / norm)
  for g in grads:
    g.mul_(scale)
  return initial_norm


# actlab's `optim.muon_scale` as torch's Muon names it (its `adjust_lr_fn`).
MUON_SCALES = {"rms": "match_rms_adamw", "width": "original"}


def optimizers(model: GPT, spec: dict, fused: bool) -> list[torch.optim.Optimizer]:
  """AdamW, decaying matrices and embeddings; or with `optim` "muon", torch's Muon (Nesterov, the
  quintic Newton–Schulz, `muon_scale`'s factor) on the blocks' matrices and AdamW on the rest at
  `muon_adam_lr_ratio` · lr. The fused q/k/v projection `c_attn` is one matrix here where actlab
  orthogonalizes three: the same cost, another update."""
  lr, wd = spec.get("lr", 1e-3), spec.get("weight_decay", 0.1)
  muon = spec.get("optim", "adamw") == "muon"
  matrices = [p for name, p in model.named_parameters()
              if muon and name.startswith("h.") and p.dim() == 2]
  rest = [p for p in model.parameters() if all(p is not m for m in matrices)]
  adamw = torch.optim.AdamW(
      [{"params": [p for p in rest if p.dim() >= 2], "weight_decay": wd},
       {"params": [p for p in rest if p.dim() < 2], "weight_decay": 0.0}],
      lr=lr * (spec.get("muon_adam_lr_ratio", 1.0) if muon else 1.0),
      betas=(spec.get("b1", 0.9), spec.get("b2", 0.95)), eps=spec.get("eps", 1e-8), fused=fused)
  if not muon:
    return [adamw]
  return [torch.optim.Muon(matrices, lr=lr, weight_decay=wd,
                           momentum=spec.get("muon_momentum", 0.95), nesterov=True,
                           adjust_lr_fn=MUON_SCALES[spec.get("muon_scale", "rms")]), adamw]


class Trainer:
  """Model, its optimizers and one pre-made batch: `step()` is one full training step. With
  `compile`, the model is `torch.compile`d and, on CUDA, AdamW is the fused implementation; with
  dtype bfloat16 the forward pass runs under bfloat16 autocast (nanoGPT's mixed precision)."""

  def __init__(self, spec: dict):
    torch.manual_seed(spec.get("seed", 0))
    if spec.get("threads"):
      torch.set_num_threads(int(spec["threads"]))
    self.device = torch.device(spec.get("device", "cpu"))
    block = {k: spec.get(k, v) for k, v in GPT2_BLOCK.items()}
    width = ffn_width(spec["activation"], spec["d_ff"], spec.get("gated_match_params", True),
                      block["ffn"])
    model = GPT(spec["vocab"], spec["max_len"], spec["layers"], spec["d_model"],
                spec["heads"], width, spec["activation"], block).to(self.device)
    self.opts = optimizers(model, spec, self.device.type == "cuda" and bool(spec.get("compile")))
    self.parameters = list(model.parameters())
    self.model = torch.compile(model) if spec.get("compile") else model
    self.autocast = torch.autocast(self.device.type, dtype=torch.bfloat16,
                                   enabled=spec.get("dtype") == "bfloat16")
    self.clip = spec.get("clip_norm", 1.0)
    self.spike_clip, self.initial_norm = spec.get("spike_clip", 0.0), None
    g = torch.Generator().manual_seed(0)
    batch = torch.randint(0, spec["vocab"], (spec["batch"], spec["seq_len"] + 1), generator=g)
    self.x = batch[:, :-1].contiguous().to(self.device)
    self.y = batch[:, 1:].contiguous().to(self.device)
    self.params = sum(p.numel() for p in self.parameters)

  def _step(self) -> torch.Tensor:
    with self.autocast:
      loss = self.model(self.x, self.y)
    for opt in self.opts:
      opt.zero_grad(set_to_none=True)
    loss.backward()
    if self.clip:
      torch.nn.utils.clip_grad_norm_(self.parameters, self.clip)
    elif self.spike_clip:
      self.initial_norm = clip_spikes(self.parameters, self.spike_clip, self.initial_norm)
    for opt in self.opts:
      opt.step()
    return loss

  def step(self) -> float:
    return self._step().item()  # a host sync, like blocking on the JAX step

  def timed(self, n: int) -> dict:
    times, r0 = [], resource.getrusage(resource.RUSAGE_SELF)
    for _ in range(n):
      t0 = time.perf_counter()
      self.step()
      times.append(time.perf_counter() - t0)
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    return {"times": times, "cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime}

  def queued(self, n: int) -> dict:
    t0 = time.perf_counter()
    for _ in range(n):
      loss = self._step()
    loss.item()  # The one wait: the last step's loss needs every step before it.
    return {"wall": time.perf_counter() - t0}


def worker() -> None:
  """stdin: a JSON spec line, then `run <n>` lines; stdout: one JSON line per request."""
  out = sys.stdout
  sys.stdout = sys.stderr  # Nothing else may write to the protocol channel.
  spec = json.loads(sys.stdin.readline())
  t0 = time.perf_counter()
  try:
    trainer = Trainer(spec)
  except ValueError as e:  # a config it cannot build (e.g. an activation it lacks): one line
    out.write(json.dumps({"error": str(e)}) + "\n")
    out.flush()
    return
  trainer.step()  # The first step allocates; count it as set-up.
  out.write(json.dumps({"ready": True, "setup_s": time.perf_counter() - t0,
                        "params": trainer.params, "threads": torch.get_num_threads(),
                        "torch": torch.__version__}) + "\n")
  out.flush()
  for line in sys.stdin:
    cmd, _, arg = line.strip().partition(" ")
    if cmd in ("run", "queue"):
      out.write(json.dumps((trainer.timed if cmd == "run" else trainer.queued)(int(arg))) + "\n")
      out.flush()
    elif cmd == "quit":
      break


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--worker", action="store_true", help="line protocol for actlab.bench")
  for name, default in (("layers", 2), ("d_model", 128), ("heads", 4), ("d_ff", 512),
                        ("seq_len", 128), ("vocab", 320), ("batch", 16), ("steps", 20),
                        ("warmup", 3), ("threads", 0)):
    p.add_argument(f"--{name}", type=int, default=default)
  p.add_argument("--activation", default="gelu")
  a = p.parse_args()
  if a.worker:
    return worker()
  trainer = Trainer({"vocab": a.vocab, "max_len": a.seq_len, "layers": a.layers,
                     "d_model": a.d_model, "heads": a.heads, "d_ff": a.d_ff,
                     "activation": a.activation, "seq_len": a.seq_len, "batch": a.batch,
                     "threads": a.threads})
  for _ in range(a.warmup):
    trainer.step()
  times = sorted(trainer.timed(a.steps)["times"])
  med = times[len(times) // 2]
  print(f"torch {torch.__version__} ({torch.get_num_threads()} threads): median step "
        f"{med * 1e3:.1f} ms, {a.batch * a.seq_len / med:,.0f} tokens/s")


if __name__ == "__main__":
  main()

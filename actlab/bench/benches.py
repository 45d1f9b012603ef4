"""What is timed. A bench has a `name`; `setup(warmup)` compiles and warms up (returning
`compile_s`, `warmup_s`), `timed(n)` runs n steps, each waited for (returning their `times` and
this process's `cpu` seconds), `queued(n)` runs n steps back to back as the training loop queues
them, with one wait at the end (returning their `wall` time), and `memory()` reports what it
knows of memory. `JaxBench` is actlab's training step, `TorchBench` the PyTorch reference in a
worker process."""

from __future__ import annotations

import json
import pathlib
import resource
import subprocess
import sys
import time

import jax
import ml_collections

from actlab import models, tasks
from actlab.bench.timing import Window
from actlab.data import tokenizer
from actlab.run import steps


def tokenizer_vocab(config: ml_collections.ConfigDict) -> int:
  """The tokenizer's vocabulary size from its name alone (no files): what the model pads."""
  if config.model.vocab_size:
    return config.model.vocab_size
  kind, size = tokenizer.parse_spec(config.data.tokenizer)
  return size or {"byte": 257, "gpt2": 50257}[kind]


class JaxBench:
  """actlab's training step: `setup()` compiles and warms up, `timed(n)` times n steps."""
  name = "actlab (JAX)"

  def __init__(self, config: ml_collections.ConfigDict, runs: int = 1):
    self.config, self.runs = config, runs
    self.vocab = tokenizer_vocab(config)

  def setup(self, warmup: int) -> dict:
    c = self.config
    program = steps.Program.create(c, self.vocab, self.runs)
    state = program.start([c] * self.runs)
    batch = program.put_batches([tasks.get(c).random_batch(c, self.vocab, s)
                                 for s in range(self.runs)])
    t0 = time.perf_counter()
    self.compiled = program.train_step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    self.state, self.batch, self.sync_each_step = state, batch, program.plan.sync_each_step
    t0 = time.perf_counter()
    for _ in range(max(1, warmup)):
      self.state, metrics = self.compiled(self.state, self.batch)
      jax.block_until_ready(metrics)
    return {"compile_s": compile_s, "warmup_s": time.perf_counter() - t0}

  def timed(self, n: int) -> dict:
    times = []
    with Window() as w:
      for _ in range(n):
        t0 = time.perf_counter()
        self.state, metrics = self.compiled(self.state, self.batch)
        jax.block_until_ready(metrics)
        times.append(time.perf_counter() - t0)
    return {"times": times, "cpu": w.cpu}

  def queued(self, n: int) -> dict:
    with Window() as w:
      for _ in range(n):
        self.state, metrics = self.compiled(self.state, self.batch)
        if self.sync_each_step:  # simulated CPU devices: see parallel.Plan.sync_each_step
          jax.block_until_ready(metrics)
      jax.block_until_ready((self.state, metrics))
    return {"wall": w.wall}

  def memory(self) -> dict:
    out = {}
    stats = jax.local_devices()[0].memory_stats() or {}
    if "peak_bytes_in_use" in stats:
      out["peak_memory_gb"] = stats["peak_bytes_in_use"] / 1e9
    try:
      m = self.compiled.memory_analysis()
      out["compiled_memory_gb"] = (m.argument_size_in_bytes + m.output_size_in_bytes
                                   + m.temp_size_in_bytes - m.alias_size_in_bytes) / 1e9
    except Exception:  # Not every backend implements it.
      pass
    out["host_peak_rss_gb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    return out


TORCH_MODES = ("eager", "compile")


class TorchBench:
  """The PyTorch reference in a worker process (benchmarks/torch_ref.py --worker): eager, or
  `torch.compile`d with fused AdamW (the GPU comparator), on `device` ("cpu" or "cuda"), in
  bfloat16 autocast where the config computes in bfloat16."""

  def __init__(self, config: ml_collections.ConfigDict, mode: str = "eager",
               device: str = "cpu"):
    c = config
    if not tasks.get(c).causal or c.model.norm != "pre":
      raise ValueError("--torch compares the pre-LN decoder (causal LM) only")
    if mode not in TORCH_MODES:
      raise ValueError(f"--torch_mode={mode!r}: choose one of {', '.join(TORCH_MODES)}")
    self.name = f"PyTorch {mode} (nanoGPT)"
    self.script = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "torch_ref.py"
    if not self.script.exists():
      raise FileNotFoundError(f"{self.script} not found: --torch needs a source checkout")
    self.spec = {
        "vocab": models.pad_vocab(tokenizer_vocab(c)), "max_len": c.model.max_len,
        "layers": c.model.num_layers, "d_model": c.model.d_model, "heads": c.model.num_heads,
        "d_ff": c.model.d_ff, "activation": c.model.activation,
        "gated_match_params": c.model.gated_match_params, "seq_len": c.data.seq_len,
        "batch": c.train.batch_size, "lr": c.optim.lr, "b1": c.optim.b1, "b2": c.optim.b2,
        "eps": c.optim.eps, "weight_decay": c.optim.weight_decay, "clip_norm": c.optim.clip_norm,
        "compile": mode == "compile", "device": device, "dtype": c.model.dtype,
    }

  def setup(self, warmup: int) -> dict:
    self.proc = subprocess.Popen([sys.executable, str(self.script), "--worker"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    self.info = self._ask(json.dumps(self.spec))
    if warmup > 1:
      self._ask(f"run {warmup - 1}")
    # torch.compile compiles on the first step, which setup_s includes.
    return {"compile_s": None, "warmup_s": self.info["setup_s"]}

  def _ask(self, line: str) -> dict:
    self.proc.stdin.write(line + "\n")
    self.proc.stdin.flush()
    answer = self.proc.stdout.readline()
    if not answer:
      raise RuntimeError(f"the torch worker exited (code {self.proc.wait()}); is torch installed? "
                         "pip install -e '.[bench]'")
    return json.loads(answer)

  def timed(self, n: int) -> dict:
    return self._ask(f"run {n}")

  def queued(self, n: int) -> dict:
    return self._ask(f"queue {n}")

  def memory(self) -> dict:
    return {}

  def close(self) -> None:
    try:
      self.proc.stdin.write("quit\n")
      self.proc.stdin.close()
      self.proc.wait(timeout=30)
    except Exception:
      self.proc.kill()

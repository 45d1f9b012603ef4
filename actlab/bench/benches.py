"""What is timed, and how on a shared machine. A bench (`JaxBench`, `TorchBench`) has a `name`,
`setup(warmup)`, `timed(n)` (each step waited for), `queued(n)` (one wait at the end) and
`memory()`; `side_by_side` and `back_to_back` time several in alternating rounds so that other
processes' load, which comes and goes, hits all alike."""

import json
import os
import pathlib
import resource
import statistics
import subprocess
import sys
import time

import jax
import ml_collections

from actlab import config as config_lib, core, tasks
from actlab.data import tokenizer
from actlab.infra.errors import UserError
from actlab.run import program as program_lib


def _busy_ticks() -> int | None:
  """Busy CPU ticks of the whole machine so far (Linux), for the background load."""
  try:
    with open("/proc/stat") as f:
      fields = [int(x) for x in f.readline().split()[1:]]
    return fields[0] + fields[1] + fields[2] + sum(fields[5:8])
  except (OSError, ValueError, IndexError):
    return None


class Window:
  """Wall time, this process's CPU time and everyone else's busy cores over a stretch of code."""

  def __enter__(self):
    self.ticks, self.t0, self.cpu0 = _busy_ticks(), time.perf_counter(), time.process_time()
    return self

  def __exit__(self, *exc):
    self.wall = time.perf_counter() - self.t0
    self.cpu = time.process_time() - self.cpu0
    ticks = _busy_ticks()
    self.busy = (None if ticks is None or self.ticks is None
                 else (ticks - self.ticks) / os.sysconf("SC_CLK_TCK"))


def wait_quiet(max_wait_s: float, threshold: float = 0.2, window_s: float = 5.0) -> None:
  """Waits (up to `max_wait_s`) until other processes keep fewer than `threshold` cores busy."""
  deadline = time.time() + max_wait_s
  while True:
    with Window() as w:  # This process sleeps: the machine's busy time is everyone else's.
      time.sleep(window_s)
    if w.busy is None or w.busy / window_s < threshold or time.time() > deadline:
      return


def _alternating(count: int, steps: int, rounds: int):
  """(bench index, steps per round) in `rounds` alternating rounds over `count` benches, ABBA."""
  per_round = max(1, -(-steps // rounds))
  for r in range(rounds):
    order = range(count)
    yield from ((i, per_round) for i in (reversed(order) if r % 2 else order))


def side_by_side(benches, steps: int, rounds: int) -> list[dict]:
  """Times `steps` steps of every bench, each waited for, in `rounds` alternating rounds: its
  times, CPU, wall and others' busy seconds."""
  out = [{"times": [], "cpu": 0.0, "wall": 0.0, "busy": 0.0, "busy_known": True}
         for _ in benches]
  for i, per_round in _alternating(len(benches), steps, rounds):
    with Window() as w:
      res = benches[i].timed(per_round)
    o = out[i]
    o["times"] += res["times"]
    o["cpu"] += res["cpu"]
    o["wall"] += w.wall
    if w.busy is None:
      o["busy_known"] = False
    else:
      # The worker's own CPU shows up in the machine's busy time: subtract it as well.
      o["busy"] += w.busy - res["cpu"] - (w.cpu if benches[i].name.startswith("PyTorch") else 0)
  return out


def back_to_back(benches, steps: int, rounds: int) -> list[dict]:
  """Each bench's median `queued_s` per step, its steps queued back to back in alternating rounds."""
  walls = [[] for _ in benches]
  for i, per_round in _alternating(len(benches), steps, rounds):
    walls[i].append(benches[i].queued(per_round)["wall"] / per_round)
  return [{"queued_s": statistics.median(w)} for w in walls]


class JaxBench:
  """actlab's training step: `setup()` compiles and warms up, `timed(n)` times n steps."""
  name = "actlab (JAX)"

  def __init__(self, config: ml_collections.ConfigDict, runs: int = 1):
    self.config, self.runs = config, runs
    self.vocab = tokenizer.nominal_vocab_size(config)

  def setup(self, warmup: int) -> dict:
    c = self.config
    program = program_lib.Program.create(c, self.vocab, self.runs)
    self.state = program.start([c] * self.runs)
    self.batch = program.put_batches([tasks.get(c).random_batch(c, self.vocab, s)
                                      for s in range(self.runs)])
    self.sync_each_step = program.plan.sync_each_step
    with Window() as compiling:
      self.compiled = program.train_step.jitted.lower(self.state, self.batch).compile()
    with Window() as warming:
      for _ in range(max(1, warmup)):
        self.state, metrics = self.compiled(self.state, self.batch)
        jax.block_until_ready(metrics)
    return {"compile_s": compiling.wall, "warmup_s": warming.wall}

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
  """The PyTorch reference of the config's model and optimizer (AdamW, or Muon and AdamW) in a
  worker process (benchmarks/torch_ref.py --worker): eager, or `torch.compile`d with fused AdamW,
  on `device` ("cpu" or "cuda")."""

  def __init__(self, config: ml_collections.ConfigDict, mode: str = "eager",
               device: str = "cpu"):
    c = config
    if not tasks.get(c).causal or c.model.norm != "pre":
      raise ValueError("--torch compares the pre-LN decoder (causal LM) only")
    if c.model.parametrization != "sp":
      raise UserError("actlab.bench --torch: the PyTorch reference builds the standard "
                      "parametrization only; time model.parametrization='mup' without --torch")
    if mode not in TORCH_MODES:
      raise ValueError(f"--torch_mode={mode!r}: choose one of {', '.join(TORCH_MODES)}")
    self.name = f"PyTorch {mode} (nanoGPT)"
    self.script = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "torch_ref.py"
    if not self.script.exists():
      raise FileNotFoundError(f"{self.script} not found: --torch needs a source checkout")
    self.spec = {
        "vocab": core.pad_vocab(tokenizer.nominal_vocab_size(c)), "max_len": c.model.max_len,
        "layers": c.model.num_layers, "d_model": c.model.d_model, "heads": c.model.num_heads,
        "d_ff": c.model.d_ff, "activation": c.model.activation,
        "gated_match_params": c.model.gated_match_params, "seq_len": c.data.seq_len,
        **{k: getattr(c.model, k) for k in config_lib.BLOCK_FIELDS},
        "batch": c.train.batch_size, "lr": c.optim.lr, "b1": c.optim.b1, "b2": c.optim.b2,
        "eps": c.optim.eps, "weight_decay": c.optim.weight_decay, "clip_norm": c.optim.clip_norm,
        "spike_clip": c.optim.spike_clip, "optim": c.optim.name,
        "muon_momentum": c.optim.muon_momentum, "muon_adam_lr_ratio": c.optim.muon_adam_lr_ratio,
        "muon_scale": c.optim.muon_scale,
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
    reply = json.loads(answer)
    if "error" in reply:
      raise UserError(f"actlab.bench --torch: {reply['error']}")
    return reply

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

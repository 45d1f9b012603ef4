"""Training-step benchmark: compile time, step time, tokens/s, model FLOPs, MFU, memory.

    python -m actlab.bench --config=configs/tinystories_gelu.py:smoke
    python -m actlab.bench --config=configs/tinystories_gelu.py --config.model.dtype=bfloat16
    python -m actlab.bench --config=configs/tinystories_gelu.py:smoke --torch   # vs PyTorch
    python -m actlab.bench --config=configs/tinystories_gelu.py:smoke --runs=6  # vectorized

What it runs is exactly `train.run`'s step (the same `steps.Program`: shardings from
`config.parallel`, donated state) on random tokens of the config's vocabulary, so no data is
downloaded or tokenized. It reports:

- `compile_s`: lowering + XLA compilation of the training step (ahead of time, timed alone);
- `step_ms`: the median over `--steps` timed steps after `--warmup` untimed ones, each step
  waited for (`block_until_ready`), so that the time is the step's and not its dispatch's;
- `tokens_per_s` = batch · seq_len / step time; `flops_per_token` from `actlab.flops` (6·N for
  the matmuls plus attention, the PaLM convention) and `tflops` = their product;
- `mfu` = tflops / the device's peak, from `PEAK_TFLOPS` by device kind and compute dtype, or
  `--peak_tflops`; none is claimed where the peak is unknown (CPUs);
- `peak_memory_gb` where JAX reports it (`Device.memory_stats`: GPU, TPU), and XLA's own
  estimate of the step's buffers (`compiled_memory_gb`: arguments + outputs + temporaries);
- `others_cores`: how many CPU cores other processes kept busy during the timed steps (Linux),
  because on a shared machine every number here depends on it.

`--torch` runs the PyTorch reference (`benchmarks/torch_ref.py`, nanoGPT's architecture in eager
float32; needs the `bench` extra) *side by side*: both are compiled/warmed up, then timed in
alternating rounds (`--rounds`; default: step by step) so that background load hits both alike,
and the report gives the speed-up. `--runs=N` benchmarks a vectorized sweep of N runs of the config
(`steps.Program` with R runs: stacked states, per-run learning rates).

Results print as a table; `--json_out` appends one JSON object per measurement (with device,
versions and the command line), `--markdown` prints rows for BENCHMARKS.md.
"""

from __future__ import annotations

import json
import os
import pathlib
import platform
import resource
import subprocess
import sys
import time

import jax
import ml_collections
import numpy as np

from actlab import config as config_lib
from actlab import flops as flops_lib
from actlab import models, parallel, steps, tasks
from actlab.data import tokenizer as tokenizers

# Dense peak TFLOP/s per chip by (device kind substring, compute dtype). float32 on NVIDIA is the
# TF32 tensor-core peak (XLA's default precision for float32 matmuls); TPUs run float32 matmuls
# as bfloat16 passes at default precision. First match wins, so specific names come first.
PEAK_TFLOPS: list[tuple[str, dict[str, float]]] = [
    ("H100 PCIe", {"bfloat16": 756.0, "float32": 378.0}),
    ("H100", {"bfloat16": 989.0, "float32": 494.0}),
    ("GH200", {"bfloat16": 989.0, "float32": 494.0}),
    ("H200", {"bfloat16": 989.0, "float32": 494.0}),
    ("H800", {"bfloat16": 989.0, "float32": 494.0}),
    ("B200", {"bfloat16": 2250.0, "float32": 1100.0}),
    ("A100", {"bfloat16": 312.0, "float32": 156.0}),
    ("A800", {"bfloat16": 312.0, "float32": 156.0}),
    ("L40S", {"bfloat16": 362.0, "float32": 183.0}),
    ("L4", {"bfloat16": 121.0, "float32": 60.0}),
    ("A10G", {"bfloat16": 70.0, "float32": 35.0}),
    ("V100", {"float16": 125.0, "float32": 15.7}),
    ("TPU v4", {"bfloat16": 275.0, "float32": 275.0}),
    ("TPU v5 lite", {"bfloat16": 197.0, "float32": 197.0}),
    ("TPU v5e", {"bfloat16": 197.0, "float32": 197.0}),
    ("TPU v5p", {"bfloat16": 459.0, "float32": 459.0}),
    ("TPU v5", {"bfloat16": 459.0, "float32": 459.0}),
    ("TPU v6 lite", {"bfloat16": 918.0, "float32": 918.0}),
    ("TPU v6e", {"bfloat16": 918.0, "float32": 918.0}),
    ("TPU7x", {"bfloat16": 2307.0, "float32": 2307.0}),
]


def peak_tflops(device_kind: str, dtype: str) -> tuple[float | None, str]:
  """(peak TFLOP/s per chip, where it came from) for a device kind and compute dtype."""
  for name, peaks in PEAK_TFLOPS:
    if name.lower() in device_kind.lower() and dtype in peaks:
      return peaks[dtype], f"{name} {dtype} dense peak"
  return None, "unknown peak"


def tokenizer_vocab(config: ml_collections.ConfigDict) -> int:
  """The tokenizer's vocabulary size from its name alone (no files): what the model pads."""
  if config.model.vocab_size:
    return config.model.vocab_size
  kind, size = tokenizers.parse_spec(config.data.tokenizer)
  return size or {"byte": 257, "gpt2": 50257}[kind]


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
    self.ticks, self.t0 = _busy_ticks(), time.perf_counter()
    r = resource.getrusage(resource.RUSAGE_SELF)
    self.cpu0 = r.ru_utime + r.ru_stime
    return self

  def __exit__(self, *exc):
    self.wall = time.perf_counter() - self.t0
    r = resource.getrusage(resource.RUSAGE_SELF)
    self.cpu = r.ru_utime + r.ru_stime - self.cpu0
    ticks = _busy_ticks()
    self.busy = (None if ticks is None or self.ticks is None
                 else (ticks - self.ticks) / os.sysconf("SC_CLK_TCK"))


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
    step = program.train_step
    self.params = models.count_params(program.run_part(state.params, 0))
    t0 = time.perf_counter()
    self.compiled = step.lower(state, batch).compile()
    compile_s = time.perf_counter() - t0
    self.state, self.batch, self.plan = state, batch, program.plan
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


class TorchBench:
  """The PyTorch reference in a worker process (benchmarks/torch_ref.py --worker)."""
  name = "PyTorch eager (nanoGPT)"

  def __init__(self, config: ml_collections.ConfigDict):
    c = config
    if not tasks.get(c).CAUSAL or c.model.dtype != "float32" or c.model.norm != "pre":
      raise ValueError("--torch compares the float32 pre-LN decoder (causal LM) only")
    self.script = pathlib.Path(__file__).resolve().parents[1] / "benchmarks" / "torch_ref.py"
    if not self.script.exists():
      raise FileNotFoundError(f"{self.script} not found: --torch needs a source checkout")
    self.spec = {
        "vocab": models.pad_vocab(tokenizer_vocab(c)), "max_len": c.model.max_len,
        "layers": c.model.num_layers, "d_model": c.model.d_model, "heads": c.model.num_heads,
        "d_ff": c.model.d_ff, "activation": c.model.activation,
        "gated_match_params": c.model.gated_match_params, "seq_len": c.data.seq_len,
        "batch": c.train.batch_size, "lr": c.optim.lr, "b1": c.optim.b1, "b2": c.optim.b2,
        "eps": c.optim.eps, "weight_decay": c.optim.weight_decay, "clip_norm": c.optim.clip_norm,
    }

  def setup(self, warmup: int) -> dict:
    self.proc = subprocess.Popen([sys.executable, str(self.script), "--worker"],
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    ready = self._ask(json.dumps(self.spec))
    self.info = ready
    if warmup > 1:
      self._ask(f"run {warmup - 1}")
    return {"compile_s": None, "warmup_s": ready["setup_s"]}

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

  def memory(self) -> dict:
    return {}

  def close(self) -> None:
    try:
      self.proc.stdin.write("quit\n")
      self.proc.stdin.close()
      self.proc.wait(timeout=30)
    except Exception:
      self.proc.kill()


def wait_quiet(max_wait_s: float, threshold: float = 0.2, window_s: float = 5.0) -> float | None:
  """Waits (up to `max_wait_s`) until other processes keep fewer than `threshold` CPU cores busy
  over a `window_s` window; returns the last load seen (None where it cannot be measured)."""
  deadline = time.time() + max_wait_s
  while True:
    with Window() as w:  # This process sleeps: the machine's busy time is everyone else's.
      time.sleep(window_s)
    if w.busy is None:
      return None
    load = w.busy / window_s
    if load < threshold or time.time() > deadline:
      return load


def side_by_side(benches, steps: int, rounds: int) -> list[dict]:
  """Times `steps` steps of every bench in `rounds` alternating rounds (ABBA order); with
  rounds = steps they alternate step by step, so that load from other processes, which comes
  and goes, hits all of them alike."""
  per_round = max(1, -(-steps // rounds))
  out = [{"times": [], "cpu": 0.0, "wall": 0.0, "busy": 0.0, "busy_known": True}
         for _ in benches]
  for r in range(rounds):
    order = list(range(len(benches)))
    if r % 2:
      order.reverse()
    for i in order:
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


def environment() -> dict:
  d = jax.devices()[0]
  cpu = platform.processor() or platform.machine()
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
  except (OSError, StopIteration):
    pass
  versions = {"jax": jax.__version__}
  for mod in ("jaxlib", "flax", "optax"):
    try:
      versions[mod] = __import__(mod).__version__
    except Exception:
      pass
  return {"platform": d.platform, "device_kind": d.device_kind, "devices": jax.device_count(),
          "processes": jax.process_count(), "host_cpu": cpu, "host_cores": os.cpu_count(),
          "versions": versions, "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "command": " ".join([os.path.basename(sys.executable), "-m", "actlab.bench"]
                              + sys.argv[1:])}


def summarize(name: str, config, res: dict, setup: dict, memory: dict, runs: int,
              peak: float | None, peak_source: str) -> dict:
  c = config
  times = np.asarray(res["times"])
  step = float(np.median(times))
  tokens = c.train.batch_size * c.data.seq_len * runs
  fl = flops_lib.for_config(c, tokenizer_vocab(c))
  tflops = fl.total * tokens / step / 1e12
  wall = res.get("wall") or float(times.sum())
  row = {
      "impl": name, "runs": runs, "step_ms": step * 1e3,
      "step_ms_p10": float(np.percentile(times, 10)) * 1e3,
      "step_ms_p90": float(np.percentile(times, 90)) * 1e3, "steps_timed": len(times),
      "tokens_per_step": tokens, "tokens_per_s": tokens / step,
      "flops_per_token": fl.total, "tflops": tflops,
      "mfu": (tflops / peak) if peak else None, "peak_tflops": peak, "peak_source": peak_source,
      "cpu_s_per_step": res["cpu"] / len(times),
      "others_cores": max(0.0, res["busy"] / wall) if res.get("busy_known") else None,
      **setup, **memory,
  }
  return row


def _fmt(x, spec):
  return "—" if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
  head = ("| impl | runs | compile s | step ms (p10–p90) | tokens/s | GFLOP/token | TFLOP/s | MFU "
          "| mem GB | CPU s/step | others' cores |")
  lines = [head, "|---" * (head.count("|") - 1) + "|"]
  for r in rows:
    mem = r.get("peak_memory_gb", r.get("compiled_memory_gb"))
    lines.append(
        f"| {r['impl']}{' [' + r['variant'] + ']' if r.get('variant') else ''} | {r['runs']} | {_fmt(r.get('compile_s'), '.1f')} | "
        f"{r['step_ms']:.1f} ({r['step_ms_p10']:.0f}–{r['step_ms_p90']:.0f}) | "
        f"{r['tokens_per_s']:,.0f} | {r['flops_per_token'] / 1e9:.4f} | {r['tflops']:.3f} | "
        f"{_fmt(r['mfu'] and 100 * r['mfu'], '.1f')}{'%' if r['mfu'] else ''} | "
        f"{_fmt(mem, '.2f')} | {r['cpu_s_per_step']:.2f} | {_fmt(r['others_cores'], '.2f')} |")
  return "\n".join(lines)


def run(config: ml_collections.ConfigDict, *, steps: int = 20, warmup: int = 3,
        rounds: int = 0, torch: bool = False, runs: int = 1,
        peak: float | None = None, variants: list[str] = (), quiet_s: float = 0) -> list[dict]:
  """Benchmarks `config`, each of `variants` (override strings, `config.parse_overrides`) and,
  with `torch`, the PyTorch reference, timed in alternating rounds; returns one row per bench."""
  configs = [config] + [config_lib.override(config.copy_and_resolve_references(),
                                            config_lib.parse_overrides(v)) for v in variants]
  labels = [""] + list(variants)
  for c in configs:
    config_lib.validate(c)
  parallel.initialize(config)  # Before the first device use (parallel.cpu_devices, hosts).
  env = environment()
  benches = [JaxBench(c, runs) for c in configs] + ([TorchBench(config)] if torch else [])
  for b, label in zip(benches, labels):
    b.label = label
  setups = []
  try:
    for b in benches:
      setups.append(b.setup(warmup))
    several = len(benches) > 1
    if quiet_s:
      wait_quiet(quiet_s)
    results = side_by_side(benches, steps, (rounds or steps) if several else 1)
    rows = []
    for i, (b, res, s) in enumerate(zip(benches, results, setups)):
      c = configs[min(i, len(configs) - 1)]
      pk, source = (peak, "--peak_tflops") if peak else peak_tflops(env["device_kind"],
                                                                   c.model.dtype)
      if pk and not peak:
        pk *= jax.device_count()
      rows.append(summarize(b.name, c, res, s, b.memory(), runs, pk, source))
  finally:
    for b in benches:
      if isinstance(b, TorchBench) and hasattr(b, "proc"):
        b.close()
  for r, c, label in zip(rows, configs, labels):
    r["env"] = env
    r["config"] = _config_summary(c)
    r["variant"] = label
    if label:
      r["speedup_vs_base"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
  if torch:
    t = rows[-1]
    for r in rows[:-1]:
      r["speedup_vs_torch"] = r["tokens_per_s"] / t["tokens_per_s"]
    t["env"], t["variant"] = env, ""
    t["versions"] = {"torch": benches[-1].info.get("torch"),
                     "torch_threads": benches[-1].info.get("threads")}
    t["config"] = ("same shapes: nanoGPT GPT in eager float32 (F.scaled_dot_product_attention, "
                   "F.cross_entropy on full logits, torch.optim.AdamW)")
  return rows


def _config_summary(c) -> str:
  m = c.model
  return (f"{tasks.name(c)} {m.activation} L{m.num_layers} d{m.d_model} h{m.num_heads} ff{m.d_ff} "
          f"ctx{c.data.seq_len} V{models.pad_vocab(tokenizer_vocab(c))} B{c.train.batch_size} "
          f"{m.dtype} attn={m.attention_impl} loss={m.get('loss_impl', 'plain')}"
          + (" scan" if m.get("scan_layers", False) else "")
          + (f" remat={m.remat}" if m.get("remat", "none") != "none" else "")
          + (f" {c.parallel.mode}" if c.get("parallel") else "")
          + (f" cpu_devices={c.parallel.cpu_devices}"
             if c.get("parallel") and c.parallel.get("cpu_devices", 0) else ""))


def markdown_rows(rows: list[dict], label: str = "") -> str:
  """One BENCHMARKS.md row per measurement: device, config, numbers, versions, command."""
  out = []
  for r in rows:
    e = r["env"]
    versions = ", ".join(f"{k} {v}" for k, v in {**e["versions"], **r.get("versions", {})}.items())
    device = (f"{e['devices']}× {e['device_kind']}" if e["platform"] != "cpu"
              else f"CPU: {e['host_cpu']}, {e['host_cores']} cores"
              + (f" as {e['devices']} XLA devices" if e["devices"] > 1 else ""))
    mfu = f"{100 * r['mfu']:.1f}%" if r["mfu"] else "—"
    speed = f" ({r['speedup_vs_torch']:.2f}× torch)" if "speedup_vs_torch" in r else ""
    out.append(
        f"| {device} | {r['impl']}{' ×%d runs' % r['runs'] if r['runs'] > 1 else ''}"
        f"{' [' + r['variant'] + ']' if r.get('variant') else ''} | "
        f"{r['config']}{' — ' + label if label else ''} | {_fmt(r.get('compile_s'), '.1f')} | "
        f"{r['step_ms']:.1f} | {r['tokens_per_s']:,.0f}{speed} | {r['tflops']:.3f} | {mfu} | "
        f"{_fmt(r.get('peak_memory_gb'), '.2f')} | {_fmt(r['others_cores'], '.2f')} | "
        f"{versions} | `{e['command']}` |")
  return "\n".join(out)


def main(argv):
  del argv
  from absl import flags
  F = flags.FLAGS
  rows = run(_CONFIG.value, steps=F.steps, warmup=F.warmup, rounds=F.rounds, torch=F.torch,
             runs=F.runs, peak=F.peak_tflops or None, variants=F.variant, quiet_s=F.wait_quiet)
  e = rows[0]["env"]
  print(f"{e['devices']}× {e['device_kind']} ({e['platform']}); host {e['host_cpu']}, "
        f"{e['host_cores']} cores; {', '.join(f'{k} {v}' for k, v in e['versions'].items())}")
  print(f"config: {rows[0]['config']}; {rows[0]['flops_per_token'] / 1e6:.2f} MFLOP/token")
  print(table(rows))
  for r in rows:
    if "speedup_vs_torch" in r:
      print(f"actlab{' [' + r['variant'] + ']' if r['variant'] else ''} / torch tokens/s: "
            f"{r['speedup_vs_torch']:.2f}×")
    if "speedup_vs_base" in r:
      print(f"[{r['variant']}] / base tokens/s: {r['speedup_vs_base']:.2f}×")
  if F.markdown:
    print(markdown_rows(rows, F.label))
  if F.json_out:
    with open(F.json_out, "a") as f:
      for r in rows:
        f.write(json.dumps({**r, "label": F.label}) + "\n")


if __name__ == "__main__":
  from absl import flags
  from actlab import errors
  flags.FLAGS.set_default("verbosity", -1)  # absl WARNING: no backend-probing INFO lines.
  _CONFIG = errors.define_config_file("config", "Config file, e.g. configs/x.py:smoke.")
  flags.mark_flags_as_required(["config"])
  flags.DEFINE_integer("steps", 20, "timed steps (after warm-up)")
  flags.DEFINE_integer("warmup", 3, "untimed steps after compilation")
  flags.DEFINE_integer("rounds", 0, "with --torch or --variant: alternating rounds the timed "
                       "steps are split into; 0 = alternate every step")
  flags.DEFINE_float("wait_quiet", 0, "wait up to this many seconds for other processes to "
                     "leave the CPU (< 0.2 cores busy) before timing")
  flags.DEFINE_multi_string("variant", [], "also time the config with these overrides, side by "
                            "side, e.g. --variant=model.loss_impl=plain (repeatable; "
                            "comma-separated overrides)")
  flags.DEFINE_bool("torch", False, "also time the PyTorch reference, side by side")
  flags.DEFINE_integer("runs", 1, "vectorized runs per step (steps.Program); 1 = a plain run")
  flags.DEFINE_float("peak_tflops", 0.0, "peak TFLOP/s of all devices together (overrides the table)")
  flags.DEFINE_string("json_out", "", "append the results as JSON lines to this file")
  flags.DEFINE_bool("markdown", False, "print BENCHMARKS.md rows")
  flags.DEFINE_string("label", "", "free text describing the variant (goes into the rows)")
  errors.run(main)

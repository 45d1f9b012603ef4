"""The training-step benchmark (`python -m actlab.bench`, see __main__.py): `run` times a config,
its variants and the PyTorch reference side by side. `benches` holds what is timed and how,
`results` the rows, the peak table and the environment."""

import jax
import ml_collections
import numpy as np

from actlab import config as config_lib
from actlab.bench.benches import (JaxBench, TORCH_MODES, TorchBench, back_to_back, side_by_side,
                                  wait_quiet)
from actlab.bench.results import (PEAK_TFLOPS, config_summary, environment, markdown_rows,
                                  peak_tflops, summarize, table)
from actlab.infra import parallel
from actlab.run import train

__all__ = ["JaxBench", "PEAK_TFLOPS", "TORCH_MODES", "TorchBench", "environment", "markdown_rows",
           "peak_tflops", "run", "run_seconds", "table"]


def run(config: ml_collections.ConfigDict, *, steps: int = 20, warmup: int = 3,
        rounds: int = 0, torch: bool = False, torch_mode: str = "auto", runs: int = 1,
        peak: float | None = None, variants: list[str] = (), quiet_s: float = 0) -> list[dict]:
  """Times `config`, each of `variants` (override strings) and, with `torch`, the PyTorch
  reference in alternating rounds, step by step and back to back; one row per bench."""
  configs = [config] + [config_lib.override(config.copy_and_resolve_references(),
                                            config_lib.parse_overrides(v)) for v in variants]
  labels = [""] + list(variants)
  configs = [config_lib.typed(c) for c in configs]
  for c, label in zip(configs, labels):
    for field in ("cpu_devices", "distributed"):
      if getattr(c.parallel, field) != config.parallel[field]:
        raise parallel.ParallelError(
            f"--variant={label}: parallel.{field} sets up the process's devices, once; time it "
            "in a separate actlab.bench run")
  config = train.initialize(config)  # Before the first device use (parallel.cpu_devices, hosts).
  env = environment()
  gpu = env["platform"] == "gpu"
  if torch_mode == "auto":
    torch_mode = "compile" if gpu else "eager"
  benches = [JaxBench(c, runs) for c in configs] + (
      [TorchBench(config, torch_mode, "cuda" if gpu else "cpu")] if torch else [])
  try:
    setups = [b.setup(warmup) for b in benches]
    several = len(benches) > 1
    if quiet_s:
      wait_quiet(quiet_s)
    results = side_by_side(benches, steps, (rounds or steps) if several else 1)
    queued = back_to_back(benches, steps, (rounds or 2) if several else 1)
    rows = []
    for b, c, res, q, s in zip(benches, configs + [config] * torch, results, queued, setups):
      # (the torch bench runs the base config's shapes, and is summarized with it)
      pk, source = peak_tflops(env["device_kind"], c.model.dtype)  # per chip
      pk, source = (peak, "--peak_tflops") if peak else (pk and pk * jax.device_count(), source)
      rows.append(summarize(b.name, c, {**res, **q}, s, b.memory(), runs, pk, source))
  finally:
    for b in benches:
      if hasattr(b, "proc"):  # a started torch worker
        b.close()
  for r, c, label in zip(rows, configs, labels):
    r.update(env=env, config=config_summary(c), variant=label)
    if label:
      r["speedup_vs_base"] = r["tokens_per_s"] / rows[0]["tokens_per_s"]
      r["queued_speedup_vs_base"] = r["queued_tokens_per_s"] / rows[0]["queued_tokens_per_s"]
  if torch:
    t = rows[-1]
    for r in rows[:-1]:
      r["speedup_vs_torch"] = r["tokens_per_s"] / t["tokens_per_s"]
      r["queued_speedup_vs_torch"] = r["queued_tokens_per_s"] / t["queued_tokens_per_s"]
    t["env"], t["variant"] = env, ""
    t["versions"] = {"torch": benches[-1].info.get("torch"),
                     "torch_threads": benches[-1].info.get("threads")}
    t["config"] = (f"same shapes: nanoGPT GPT, {torch_mode}, {config.model.dtype} "
                   "(F.scaled_dot_product_attention, F.cross_entropy on full logits, "
                   f"torch.optim.AdamW{', fused' if gpu else ''})")
  return rows


def run_seconds(config: ml_collections.ConfigDict, runs: int = 1, together: int = 1) -> float:
  """The seconds one of `runs` runs of `config` takes, timed from a few steps of a program of
  `together` of them (an evaluation window as a third of a step, a Hessian-vector product as 3)."""
  b = JaxBench(config, together)
  compile_s = b.setup(1)["compile_s"]
  step = float(np.median(b.timed(5)["times"])) / together
  t, m = config.train, config.metrics
  windows = (t.steps // t.eval_every + 1) * config.data.val_batches + config.data.test_batches
  sharpness = (t.steps // m.sharpness_every + 1) * m.sharpness_iters if m.sharpness_every else 0
  return step * (t.steps + windows / 3 + 3 * sharpness) + compile_s / runs

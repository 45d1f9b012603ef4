"""A bench's measurements as a row of numbers (`summarize`: step time percentiles, tokens/s,
TFLOP/s, MFU, others' cores) and rows as text: the table the command prints and BENCHMARKS.md
rows."""

from __future__ import annotations

import numpy as np

from actlab import models, tasks
from actlab.bench.benches import tokenizer_vocab
from actlab.measure import flops as flops_lib


def summarize(name: str, config, res: dict, setup: dict, memory: dict, runs: int,
              peak: float | None, peak_source: str) -> dict:
  """One row: `side_by_side`'s result `res` for a bench of `config`, its setup and memory."""
  c = config
  times = np.asarray(res["times"])
  step = float(np.median(times))
  tokens = c.train.batch_size * c.data.seq_len * runs
  fl = flops_lib.for_config(c, tokenizer_vocab(c))
  tflops = fl.total * tokens / step / 1e12
  wall = res.get("wall") or float(times.sum())
  queued = res["queued_s"]
  return {
      "impl": name, "runs": runs, "step_ms": step * 1e3,
      "step_ms_p10": float(np.percentile(times, 10)) * 1e3,
      "step_ms_p90": float(np.percentile(times, 90)) * 1e3, "steps_timed": len(times),
      "tokens_per_step": tokens, "tokens_per_s": tokens / step,
      "flops_per_token": fl.total, "tflops": tflops,
      "mfu": (tflops / peak) if peak else None, "peak_tflops": peak, "peak_source": peak_source,
      "queued_step_ms": queued * 1e3, "queued_tokens_per_s": tokens / queued,
      "queued_mfu": (fl.total * tokens / queued / 1e12 / peak) if peak else None,
      "cpu_s_per_step": res["cpu"] / len(times),
      "others_cores": max(0.0, res["busy"] / wall) if res.get("busy_known") else None,
      **setup, **memory,
  }


def config_summary(c) -> str:
  """The config in one line: task, activation, shapes, dtype and how it runs."""
  m = c.model
  return (f"{tasks.name(c)} {m.activation} L{m.num_layers} d{m.d_model} h{m.num_heads} ff{m.d_ff} "
          f"ctx{c.data.seq_len} V{models.pad_vocab(tokenizer_vocab(c))} B{c.train.batch_size} "
          f"{m.dtype} attn={m.attention_impl} loss={m.loss_impl}"
          + (" scan" if m.scan_layers else "")
          + (f" remat={m.remat}" if m.remat != "none" else "")
          + f" {c.parallel.mode}"
          + (f" cpu_devices={c.parallel.cpu_devices}" if c.parallel.cpu_devices else ""))


def variant_tag(row: dict) -> str:
  """` [overrides]` after the name of a variant's row, nothing for the base config."""
  return f" [{row['variant']}]" if row.get("variant") else ""


def _fmt(x, spec):
  return "—" if x is None else format(x, spec)


def table(rows: list[dict]) -> str:
  head = ("| impl | runs | compile s | step ms (p10–p90) | tokens/s | back to back: ms/step, "
          "tokens/s, MFU | GFLOP/token | TFLOP/s | MFU | mem GB | CPU s/step | others' cores |")
  lines = [head, "|---" * (head.count("|") - 1) + "|"]
  for r in rows:
    mem = r.get("peak_memory_gb", r.get("compiled_memory_gb"))
    lines.append(
        f"| {r['impl']}{variant_tag(r)} | {r['runs']} | {_fmt(r.get('compile_s'), '.1f')} | "
        f"{r['step_ms']:.1f} ({r['step_ms_p10']:.0f}–{r['step_ms_p90']:.0f}) | "
        f"{r['tokens_per_s']:,.0f} | {r['queued_step_ms']:.1f}, {r['queued_tokens_per_s']:,.0f}, "
        f"{_fmt(r['queued_mfu'] and 100 * r['queued_mfu'], '.1f')}{'%' if r['queued_mfu'] else ''}"
        f" | {r['flops_per_token'] / 1e9:.4f} | {r['tflops']:.3f} | "
        f"{_fmt(r['mfu'] and 100 * r['mfu'], '.1f')}{'%' if r['mfu'] else ''} | "
        f"{_fmt(mem, '.2f')} | {r['cpu_s_per_step']:.2f} | {_fmt(r['others_cores'], '.2f')} |")
  return "\n".join(lines)


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
    speed = (f" ({r['speedup_vs_torch']:.2f}× torch; back to back {r['queued_step_ms']:.1f} ms, "
             f"{r['queued_speedup_vs_torch']:.2f}×)" if "speedup_vs_torch" in r else "")
    out.append(
        f"| {device} | {r['impl']}{' ×%d runs' % r['runs'] if r['runs'] > 1 else ''}"
        f"{variant_tag(r)} | "
        f"{r['config']}{' — ' + label if label else ''} | {_fmt(r.get('compile_s'), '.1f')} | "
        f"{r['step_ms']:.1f} | {r['tokens_per_s']:,.0f}{speed} | {r['tflops']:.3f} | {mfu} | "
        f"{_fmt(r.get('peak_memory_gb'), '.2f')} | {_fmt(r['others_cores'], '.2f')} | "
        f"{versions} | `{e['command']}` |")
  return "\n".join(out)

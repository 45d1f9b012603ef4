"""A bench's measurements as a row (`summarize`), the devices' peak TFLOP/s, the `environment`
the row records, and rows as the table the command prints and as BENCHMARKS.md rows."""

import os
import sys

import jax
import numpy as np

from actlab import core, tasks
from actlab.data.tokenizer import nominal_vocab_size
from actlab.measure import flops as flops_lib
from actlab.report.tables import markdown_row, markdown_table
from actlab.run import rows

# Dense peak TFLOP/s per chip by (device kind substring, compute dtype). float32 on NVIDIA is the
# TF32 tensor-core peak (XLA's default precision for float32 matmuls); TPUs run float32 matmuls
# as bfloat16 passes at default precision. First match wins, so specific names come first.
PEAK_TFLOPS: list[tuple[tuple[str, ...], dict[str, float]]] = [
    (("H100 PCIe",), {"bfloat16": 756.0, "float32": 378.0}),
    (("H100", "GH200", "H200", "H800"), {"bfloat16": 989.0, "float32": 494.0}),
    (("B200",), {"bfloat16": 2250.0, "float32": 1100.0}),
    (("A100", "A800"), {"bfloat16": 312.0, "float32": 156.0}),
    (("L40S",), {"bfloat16": 362.0, "float32": 183.0}),
    (("L4",), {"bfloat16": 121.0, "float32": 60.0}),
    (("A10G",), {"bfloat16": 70.0, "float32": 35.0}),
    (("V100",), {"float16": 125.0, "float32": 15.7}),
    (("TPU v4",), {"bfloat16": 275.0, "float32": 275.0}),
    (("TPU v5 lite", "TPU v5e"), {"bfloat16": 197.0, "float32": 197.0}),
    (("TPU v5p", "TPU v5"), {"bfloat16": 459.0, "float32": 459.0}),
    (("TPU v6 lite", "TPU v6e"), {"bfloat16": 918.0, "float32": 918.0}),
    (("TPU7x",), {"bfloat16": 2307.0, "float32": 2307.0}),
]


def peak_tflops(device_kind: str, dtype: str) -> tuple[float | None, str]:
  """(peak TFLOP/s per chip, where it came from) for a device kind and compute dtype."""
  for names, peaks in PEAK_TFLOPS:
    for name in names:
      if name.lower() in device_kind.lower() and dtype in peaks:
        return peaks[dtype], f"{name} {dtype} dense peak"
  return None, "unknown peak"


def environment() -> dict:
  """The devices, host CPU, library versions, XLA flags and command line of this process."""
  d = jax.devices()[0]
  versions = {mod: __import__(mod).__version__ for mod in ("jax", "jaxlib", "flax", "optax")}
  return {"platform": d.platform, "device_kind": d.device_kind, "devices": jax.device_count(),
          "processes": jax.process_count(), "host_cpu": rows.host_cpu(),
          "host_cores": os.cpu_count(),
          "versions": versions, "xla_flags": os.environ.get("XLA_FLAGS", ""),
          "command": " ".join([os.path.basename(sys.executable), "-m", "actlab.bench"]
                              + sys.argv[1:])}


def summarize(name: str, c, res: dict, setup: dict, memory: dict, runs: int,
              peak: float | None, peak_source: str) -> dict:
  """One row: `side_by_side`'s result `res` for a bench of config `c`, its setup and memory."""
  times = np.asarray(res["times"])
  step = float(np.median(times))
  tokens = c.train.batch_size * c.data.seq_len * runs
  fl = flops_lib.for_config(c, nominal_vocab_size(c))
  tflops = fl.total * tokens / step / 1e12
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
      "others_cores": max(0.0, res["busy"] / res["wall"]) if res["busy_known"] else None,
      **setup, **memory,
  }


def config_summary(c) -> str:
  """The config in one line: task, activation, block, shapes, dtype, the optimizer where not
  AdamW, and how it runs."""
  m = c.model
  block = [name for name, other in (("rms", m.norm_type == "rms"), ("rope", m.position == "rope"),
                                    ("no-bias", not m.bias), ("untied", not m.tie_head),
                                    (f"ffn={m.ffn}", m.ffn != "auto"), ("qk-norm", m.qk_norm))
           if other]
  return (f"{tasks.name(c)} {m.activation}{''.join(f' {b}' for b in block)} "
          f"L{m.num_layers} d{m.d_model} h{m.num_heads} ff{m.d_ff} "
          f"ctx{c.data.seq_len} V{core.pad_vocab(nominal_vocab_size(c))} B{c.train.batch_size} "
          f"{m.dtype} attn={m.attention_impl} loss={m.loss_impl}"
          + (f" {c.optim.name}" if c.optim.name != "adamw" else "")
          + (" scan" if m.scan_layers else "")
          + (f" remat={m.remat}" if m.remat != "none" else "")
          + f" {c.parallel.mode}"
          + (f" cpu_devices={c.parallel.cpu_devices}" if c.parallel.cpu_devices else ""))


def variant_tag(row: dict) -> str:
  """` [overrides]` after the name of a variant's row, nothing for the base config."""
  return f" [{row['variant']}]" if row.get("variant") else ""


def _fmt(x, spec):
  return "—" if x is None else format(x, spec)


def _percent(fraction) -> str:
  return f"{100 * fraction:.1f}%" if fraction else "—"


def table(rows: list[dict]) -> str:
  head = ["impl", "runs", "compile s", "step ms (p10–p90)", "tokens/s",
          "back to back: ms/step, tokens/s, MFU", "GFLOP/token", "TFLOP/s", "MFU", "mem GB",
          "CPU s/step", "others' cores"]
  return markdown_table(head, [[
      f"{r['impl']}{variant_tag(r)}", str(r["runs"]), _fmt(r.get("compile_s"), ".1f"),
      f"{r['step_ms']:.1f} ({r['step_ms_p10']:.0f}–{r['step_ms_p90']:.0f})",
      f"{r['tokens_per_s']:,.0f}", f"{r['queued_step_ms']:.1f}, {r['queued_tokens_per_s']:,.0f}, "
      f"{_percent(r['queued_mfu'])}", f"{r['flops_per_token'] / 1e9:.4f}", f"{r['tflops']:.3f}",
      _percent(r["mfu"]), _fmt(r.get("peak_memory_gb", r.get("compiled_memory_gb")), ".2f"),
      f"{r['cpu_s_per_step']:.2f}", _fmt(r["others_cores"], ".2f")] for r in rows])


def markdown_rows(rows: list[dict], label: str = "") -> str:
  """One BENCHMARKS.md row per measurement: device, config, numbers, versions, command."""
  out = []
  for r in rows:
    e = r["env"]
    versions = ", ".join(f"{k} {v}" for k, v in {**e["versions"], **r.get("versions", {})}.items())
    device = (f"{e['devices']}× {e['device_kind']}" if e["platform"] != "cpu"
              else f"CPU: {e['host_cpu']}, {e['host_cores']} cores"
              + (f" as {e['devices']} XLA devices" if e["devices"] > 1 else ""))
    speed = (f" ({r['speedup_vs_torch']:.2f}× torch; back to back {r['queued_step_ms']:.1f} ms, "
             f"{r['queued_speedup_vs_torch']:.2f}×)" if "speedup_vs_torch" in r else "")
    runs = f" ×{r['runs']} runs" if r["runs"] > 1 else ""
    out.append(markdown_row([
        device, f"{r['impl']}{runs}{variant_tag(r)}", r["config"] + (f" — {label}" if label else ""),
        _fmt(r.get("compile_s"), ".1f"), f"{r['step_ms']:.1f}", f"{r['tokens_per_s']:,.0f}{speed}",
        f"{r['tflops']:.3f}", _percent(r["mfu"]), _fmt(r.get("peak_memory_gb"), ".2f"),
        _fmt(r["others_cores"], ".2f"), versions, f"`{e['command']}`"]))
  return "\n".join(out)

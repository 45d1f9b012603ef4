"""What the benchmark runs on: the devices' peak TFLOP/s (for MFU) and the environment a row
records (devices, host CPU, versions, XLA flags, the command line)."""

from __future__ import annotations

import os
import platform
import sys

import jax

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


def environment() -> dict:
  """The devices, host CPU, library versions, XLA flags and command line of this process."""
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

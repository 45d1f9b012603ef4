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
- `queued_step_ms`, `queued_tokens_per_s`, `queued_mfu`: the same steps queued back to back as
  the training loop queues them (no wait between steps, one at the end of each round; median
  over rounds): throughput, where `step_ms` is latency. On a GPU the difference is the host's
  dispatch time that the device no longer waits for;
- `tokens_per_s` = batch · seq_len / step time; `flops_per_token` from `actlab.measure.flops` (6·N for
  the matmuls plus attention, the PaLM convention) and `tflops` = their product;
- `mfu` = tflops / the device's peak, from `PEAK_TFLOPS` by device kind and compute dtype, or
  `--peak_tflops`; none is claimed where the peak is unknown (CPUs);
- `peak_memory_gb` where JAX reports it (`Device.memory_stats`: GPU, TPU), and XLA's own
  estimate of the step's buffers (`compiled_memory_gb`: arguments + outputs + temporaries);
- `others_cores`: how many CPU cores other processes kept busy during the timed steps (Linux),
  because on a shared machine every number here depends on it.

`--torch` runs the PyTorch reference (`benchmarks/torch_ref.py`, nanoGPT's architecture; needs
the `bench` extra) *side by side*: both are compiled/warmed up, then timed in alternating rounds
(`--rounds`; default: step by step) so that background load hits both alike, and the report
gives the speed-up, step by step and back to back. `--torch_mode`: `eager` (the CPU comparator)
or `compile` (`torch.compile` and fused AdamW: the GPU comparator); `auto` (default) picks by the
device. Where the config computes in bfloat16, the reference runs under bfloat16 autocast.
`--runs=N` benchmarks a vectorized sweep of N runs of the config (`steps.Program` with R runs:
stacked states, per-run learning rates).

Results print as a table; `--json_out` appends one JSON object per measurement (with device,
versions and the command line), `--markdown` prints rows for BENCHMARKS.md.
"""

import json
import logging

from absl import flags
from absl import logging as absl_logging

from actlab import errors
from actlab.bench import run
from actlab.bench.results import markdown_rows, table, variant_tag


def main(argv):
  del argv
  F = flags.FLAGS
  rows = run(_CONFIG.value, steps=F.steps, warmup=F.warmup, rounds=F.rounds, torch=F.torch,
             torch_mode=F.torch_mode, runs=F.runs, peak=F.peak_tflops or None,
             variants=F.variant, quiet_s=F.wait_quiet)
  e = rows[0]["env"]
  print(f"{e['devices']}× {e['device_kind']} ({e['platform']}); host {e['host_cpu']}, "
        f"{e['host_cores']} cores; {', '.join(f'{k} {v}' for k, v in e['versions'].items())}")
  print(f"config: {rows[0]['config']}; {rows[0]['flops_per_token'] / 1e6:.2f} MFLOP/token")
  print(table(rows))
  for r in rows:
    if "speedup_vs_torch" in r:
      print(f"actlab{variant_tag(r)} / torch tokens/s: {r['speedup_vs_torch']:.2f}× step by step, "
            f"{r['queued_speedup_vs_torch']:.2f}× back to back")
    if "speedup_vs_base" in r:
      print(f"[{r['variant']}] / base tokens/s: {r['speedup_vs_base']:.2f}× step by step, "
            f"{r['queued_speedup_vs_base']:.2f}× back to back")
  if F.markdown:
    print(markdown_rows(rows, F.label))
  if F.json_out:
    with open(F.json_out, "a") as f:
      for r in rows:
        f.write(json.dumps({**r, "label": F.label}) + "\n")


def _drop_tpu_probe_line() -> None:
  """Drops the INFO line JAX logs when its probe for a TPU fails ("Unable to initialize backend
  'tpu': ... libtpu.so ..."), as it does on every CPU or GPU host: absl shows INFO by default.
  Only that record: a TPU that is present but unusable still gets JAX's warning, and every
  other line, INFO included, stays."""
  absl_logging.get_absl_handler().addFilter(lambda record: not (
      record.levelno == logging.INFO
      and record.getMessage().startswith("Unable to initialize backend 'tpu'")))


if __name__ == "__main__":
  _drop_tpu_probe_line()
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
  flags.DEFINE_enum("torch_mode", "auto", ["auto", "eager", "compile"], "the PyTorch reference: "
                    "eager, or torch.compile with fused AdamW; auto = compile on a GPU, eager on "
                    "a CPU")
  flags.DEFINE_integer("runs", 1, "vectorized runs per step (steps.Program); 1 = a plain run")
  flags.DEFINE_float("peak_tflops", 0.0, "peak TFLOP/s of all devices together (overrides the table)")
  flags.DEFINE_string("json_out", "", "append the results as JSON lines to this file")
  flags.DEFINE_bool("markdown", False, "print BENCHMARKS.md rows")
  flags.DEFINE_string("label", "", "free text describing the variant (goes into the rows)")
  errors.run(main)

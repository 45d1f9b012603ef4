"""Training-step benchmark (docs/performance.md, "Benchmarking"): `python -m actlab.bench
--config=configs/tinystories_gelu.py:smoke [--torch] [--variant=<overrides>] [--runs=N]` times
`train.run`'s own step on random tokens: compile time, each step waited for and steps queued back
to back, tokens/s, MFU, memory; `--torch` and `--variant` side by side in alternating rounds.
"""

import json
import logging

from absl import flags
from absl import logging as absl_logging

from actlab.bench import run
from actlab.bench.results import markdown_rows, table, variant_tag
from actlab.infra import errors


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
    for vs, name in (("torch", f"actlab{variant_tag(r)}"), ("base", f"[{r['variant']}]")):
      if f"speedup_vs_{vs}" in r:
        print(f"{name} / {vs} tokens/s: {r[f'speedup_vs_{vs}']:.2f}× step by step, "
              f"{r[f'queued_speedup_vs_{vs}']:.2f}× back to back")
  if F.markdown:
    print(markdown_rows(rows, F.label))
  if F.json_out:
    with open(F.json_out, "a") as f:
      for r in rows:
        f.write(json.dumps({**r, "label": F.label}) + "\n")


if __name__ == "__main__":
  # Drops the INFO line JAX logs on every CPU or GPU host when its probe for a TPU fails.
  absl_logging.get_absl_handler().addFilter(lambda record: not (
      record.levelno == logging.INFO
      and record.getMessage().startswith("Unable to initialize backend 'tpu'")))
  _CONFIG = errors.define_config_file("config", "Config file, e.g. configs/x.py:smoke.")
  errors.require("config")
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
  flags.DEFINE_integer("runs", 1, "vectorized runs per step (program.Program); 1 = a plain run")
  flags.DEFINE_float("peak_tflops", 0.0, "peak TFLOP/s of all devices together (overrides the "
                     "table)")
  flags.DEFINE_string("json_out", "", "append the results as JSON lines to this file")
  flags.DEFINE_bool("markdown", False, "print BENCHMARKS.md rows")
  flags.DEFINE_string("label", "", "free text describing the variant (goes into the rows)")
  errors.run(main)

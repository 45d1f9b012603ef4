"""Where a run's time goes, as a user runs it: `python benchmarks/run_cost.py [--sizes=smoke,reference]
[--steps=N]` (BENCHMARKS.md, "A run's fixed cost"; docs/performance.md).

Per size, two cells of one sweep run two ways, each with a fresh compilation cache: each cell
`python -m actlab.main` in its own process (cell 1, seed 0 and LR 1e-3, finds the cache empty;
cell 2, seed 1 and LR 3e-3, the same shapes, finds cell 1's programs), and both cells (LR 1e-3 and
3e-3, seed 0) in one `python -m actlab.sweep` process, as a sweep runs them cell by cell (cell 2
runs the programs cell 1 built; `sweep.vectorize=false`, a CPU's default, so that a GPU measures
the same thing rather than one program of both cells). `actlab.bench` times the same config's step
queued back to back. Per cell it prints: the programs compiled and taken from the cache (summary.json's
`timing.compile`), the seconds spent compiling, the fixed cost (process start to the first step,
`timing.startup_sec`; for a sweep's cell 2, from its own start), the loop's steady step over the back-to-back step, measurement's share of the
loop's wall (`timing.measure_share`), and the process's whole wall time (a sweep's: both cells'). The sizes: `smoke`, the
Quickstart's config; `reference`, configs/tinystories_gelu.py on the synthetic corpus with the byte
tokenizer (6 × 384, context 128, batch 32), at its default measurement settings.
"""

import argparse
import json
import pathlib
import subprocess
import sys
import tempfile
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
SIZES = {
    "smoke": ["--config=configs/tinystories_gelu.py:smoke"],
    "reference": ["--config=configs/tinystories_gelu.py", "--config.data.source=synthetic",
                  "--config.data.tokenizer=byte", "--config.metrics.tensorboard=false"],
}
CELLS = (("1 (empty cache)", 0, 1e-3), ("2 (other seed, LR)", 1, 3e-3))
SWEEP = "def get_sweep(arg=None):\n  return {'axes': {'optim.lr': [1e-3, 3e-3]}, 'seeds': [0]}\n"
SWEEP_CELLS = (("sweep cell 1 (empty cache)", "lr=0.001,seed=0"),
               ("sweep cell 2 (other LR)", "lr=0.003,seed=0"))


def run(command: list[str], cache: pathlib.Path) -> float:
  """Runs an actlab command with the cache `cache`; its wall time (s)."""
  start = time.perf_counter()
  out = subprocess.run([sys.executable, "-m", *command, f"--config.train.compile_cache={cache}",
                        "--config.train.progress=false"], cwd=REPO, capture_output=True, text=True)
  if out.returncode:
    sys.exit(out.stdout[-2000:] + out.stderr[-2000:])
  return time.perf_counter() - start


def results(workdir: pathlib.Path) -> tuple[dict, int]:
  """A run's summary and tokens per step."""
  config = json.loads((workdir / "config.json").read_text())
  tokens_per_step = config["train"]["batch_size"] * config["data"]["seq_len"]
  return json.loads((workdir / "summary.json").read_text()), tokens_per_step


def back_to_back_ms(flags: list[str], out: pathlib.Path, steps: int) -> float:
  """`actlab.bench`'s queued step (ms): the same config's step, back to back."""
  subprocess.run([sys.executable, "-m", "actlab.bench", *flags, f"--steps={steps}", "--warmup=3",
                  "--rounds=3", f"--json_out={out}"], cwd=REPO, check=True, capture_output=True)
  return json.loads(out.read_text().splitlines()[-1])["queued_step_ms"]


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--sizes", default="smoke,reference")
  parser.add_argument("--steps", type=int, default=0,
                      help="train.steps (0: the config's), with a tenth of them to warm up")
  parser.add_argument("--bench_steps", type=int, default=30, help="actlab.bench's --steps")
  args = parser.parse_args()
  print("| size | cell | programs compiled / from the cache | compiling (s) | fixed cost (s) | "
        "loop step / back-to-back step | measurement's share of the loop | whole run (s) |")
  print("|---|---|---|---|---|---|---|---|")
  for size in args.sizes.split(","):
    flags = SIZES[size] + ([f"--config.train.steps={args.steps}",
                            f"--config.optim.warmup_steps={args.steps // 10}"] if args.steps else [])
    with tempfile.TemporaryDirectory(prefix="actlab-run-cost-") as tmp:
      tmp = pathlib.Path(tmp)
      bench_ms = back_to_back_ms(flags, tmp / "bench.jsonl", args.bench_steps)
      rows = []
      for name, seed, lr in CELLS:
        wall = run(["actlab.main", *flags, f"--workdir={tmp / f'cell{seed}'}",
                    f"--config.train.seed={seed}", f"--config.optim.lr={lr}"], tmp / "xla")
        rows.append((name, *results(tmp / f"cell{seed}"), f"{wall:.1f}"))
      (tmp / "sweep.py").write_text(SWEEP)
      wall = run(["actlab.sweep", *flags, "--config.sweep.vectorize=false",
                  f"--sweep={tmp / 'sweep.py'}",
                  f"--workdir={tmp / 'sweep'}"], tmp / "sweep-xla")
      for (name, cell), whole in zip(SWEEP_CELLS, ("", f"{wall:.1f} (both)")):
        rows.append((name, *results(tmp / "sweep" / cell), whole))
      for name, summary, tokens_per_step, whole in rows:
        t, c = summary["timing"], summary["timing"]["compile"]
        step_ms = 1e3 * tokens_per_step / summary["tokens_per_sec"]  # the loop's steady step
        print(f"| {size} | {name} | {c['programs_compiled']} / {c['programs_cached']} | "
              f"{c['sec']:.1f} | {t['startup_sec']:.1f} | {step_ms:.1f} / {bench_ms:.1f} ms = "
              f"{bench_ms / step_ms:.2f}× | {100 * t['measure_share']:.1f}% | {whole} |",
              flush=True)


if __name__ == "__main__":
  main()

"""Does the best LR transfer across width under μP, and not under SP? (Descriptive: no test.)

`:cpu_epoch`: GELU in GPT-2's block at the ladder's CPU schedule (`sizes.SIZES["cpu_epoch"]`: the
TinyStories sample, 450 steps, 45 warm-up, cosine to 10%, no clipping), 2 layers of width 64, 128
and 256 with 4 heads each (the head dimension grows with the width, as μP's 1/K attention
assumes) and d_ff 4 × the width, under SP and under μP with its base at 128 (the ladder's 2 ×
128: there μP is SP, bitwise), × peak LR {1e-3, 3e-3, 1e-2, 3e-2} × seeds {0, 1}: 48 runs, about
3.5 core-hours on a 2-core AMD EPYC host (declared with seeds {0, 1, 2}; cut to two before any
run, so that the sweep finishes within one working session).

Stated before running: the result is each width's best LR (lowest mean final validation loss
over the seeds) under each parametrization, with its loss and the grid's neighbours, read as
description (no interval, no test). μP "transfers" here if its best LR is the same grid point at
all three widths; SP's is expected to move down as the width grows (the ladder's 3e-3 at 2 × 128
against 1e-3 at 4 × 256). The 128 cells of both parametrizations differ in the field alone and are
both trained: their numbers must agree to the bit, a check of μP's base in the sweep itself.

`:smoke`: the same grid on the embedded corpus's tiny decoder, 60 steps, 1 seed (a minute).
"""

from actlab.config import sizes

WIDTHS = {"w64": 64, "w128": 128, "w256": 256}
BASE = 128


def get_sweep(arg=None):
  if arg not in ("cpu_epoch", "smoke"):
    raise ValueError(f"mup_transfer: unknown variant {arg!r}; use ':cpu_epoch' or ':smoke'")
  smoke = arg == "smoke"
  widths = {name: {"model.d_model": d, "model.d_ff": 4 * d, "model.num_heads": 4}
            for name, d in WIDTHS.items()}
  return {"description": "the best LR against the width under SP and μP (base 128): descriptive",
          # Width first: the sweep trains in grid order, so the narrower widths finish first.
          "axes": {"arm": list(WIDTHS), "model.parametrization": ["sp", "mup"],
                   "optim.lr": [1e-3, 3e-3, 1e-2, 3e-2]},
          "seeds": [0] if smoke else [0, 1],
          "fixed": {**(sizes.SIZES["mini"] if smoke else sizes.SIZES["cpu_epoch"]),
                    "model.activation": "gelu", "model.mup_base_width": BASE,
                    **({"train.steps": 60, "optim.warmup_steps": 6} if smoke else {})},
          "fixed_by": {"arm": widths}}


def table(root: str = "results/mup_transfer_cpu_epoch") -> None:
  """Prints the stated result from the sweep's committed runs: each width's mean final
  validation loss per LR under SP and μP, its best LR, and the check of μP's base (each 128 run
  under SP and under μP equal to the bit in every metrics row, time measures aside)."""
  import numpy as np
  from actlab.report import load, stats, tables
  from actlab.run.rows import untimed
  manifest, runs = load.load(root)
  lrs, seeds = manifest["axes"]["optim.lr"], manifest["seeds"]
  cells = stats.pivot(manifest, runs, "optim.lr")  # {(arm, parametrization): {(lr, seed): Run}}
  rows = []
  for (arm, param), by in cells.items():
    losses = {lr: [by[lr, s].value("final_val_loss") for s in seeds
                   if (lr, s) in by and by[lr, s].state == "done"] for lr in lrs}
    means = {lr: float(np.mean(v)) for lr, v in losses.items() if len(v) == len(seeds)}
    best = min(means, key=means.get) if len(means) == len(lrs) else None
    rows.append([str(WIDTHS[arm]), param, *(f"{means[lr]:.3f}" if lr in means else "—"
                                             for lr in lrs), "—" if best is None else f"{best:g}"])
  print(f"Mean final validation loss over seeds {seeds} (—: not every seed finished).\n")
  print(tables.markdown_table(["width", "parametrization", *(f"LR {lr:g}" for lr in lrs),
                               "best LR"], rows))
  pairs = [(sp, cells["w128", "mup"].get(k)) for k, sp in cells["w128", "sp"].items()]
  done = [(a, b) for a, b in pairs if b is not None and a.state == b.state == "done"]
  same = [list(map(untimed, a.rows)) == list(map(untimed, b.rows)) for a, b in done]
  print(f"\nμP's base: {sum(same)} of {len(done)} finished "
        "pairs of 128 runs (SP, μP) equal to the bit in every metrics row")


if __name__ == "__main__":
  import sys
  table(*sys.argv[1:])

"""Trains one run: `python -m actlab.main --config=configs/tinystories_gelu.py --workdir=runs/x`.

Override any field with `--config.optim.lr=3e-3`; a config file takes a variant after a colon
(`configs/tinystories_gelu.py:smoke`). Running the same command again resumes the run (a run that
has ended is reported, not trained again).
"""

from absl import flags, logging

from actlab.infra import errors, workdir
from actlab.run import train

def define_flags() -> None:
  """The command's flags, defined when it runs (actlab.sample has a --workdir of its own)."""
  errors.define_config_file("config", "Config file, e.g. configs/x.py:smoke.")
  flags.DEFINE_string("workdir", None, "Run directory (created; reused to resume).")
  errors.require("config", "workdir")


def main(argv):
  del argv
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)  # Orbax logs every save at INFO.
  train_one(flags.FLAGS.config, flags.FLAGS.workdir)


def train_one(config, where: str) -> None:
  """Trains (or resumes) the run of `config` in directory `where` and prints how it ended."""
  config = train.initialize(config)  # Devices and hosts first: nothing has asked JAX for any.
  run_dir = workdir.RunDir.open(where)
  ended = workdir.read_summary(run_dir.logdir, warn=False)  # train.run just returns its summary
  summary = train.run(config, run_dir)
  if ended is not None:
    print(f"nothing trained: {where} holds a run that had already ended; its result:")
  reasons = "; ".join(summary["status_reasons"])
  print(f"status: {summary['status']}" + (f" ({reasons})" if reasons else ""))
  if summary["status"] == "diverged" and summary["diverged_at"] is not None:
    print(f"stopped at step {summary['diverged_at']}; the last checkpoint is the last good state; "
          f"workdir {where}")
    return
  print(f"val loss: {summary['initial_val_loss']:.4f} at step 0 → "
        f"{summary['final_val_loss']:.4f} at step {summary['steps']} "
        f"(best {summary['best_val_loss']:.4f}); "
        f"{summary['tokens_per_sec'] or 0:,.0f} tokens/s in the loop (its median); "
        f"{summary['wall_time_sec']:.0f} s in the loop{timing(summary.get('timing'))}; "
        f"workdir {where}")


def timing(t: dict | None) -> str:
  """The closing line's account of the run's start and compilation (summary.json's `timing`); the
  compile seconds, summed over threads, may exceed the run's."""
  if not t:
    return ""
  start = t.get("startup_sec")
  said = "" if start is None else f", its first step {start:.1f} s after the start"
  tally = t.get("compile")
  if tally:
    n = tally["programs_compiled"]
    said += (f"; compile work {tally['sec']:.1f} s, summed over background threads "
             f"({n} program{'' if n == 1 else 's'} compiled, {tally['programs_cached']} from the "
             "cache)")
  return said


if __name__ == "__main__":
  define_flags()
  errors.run(main)

"""How many ops XLA's optimized train step runs (BENCHMARKS.md, "Op counts"): no GPU needed.

    JAX_PLATFORMS=cpu python benchmarks/op_counts.py configs/tinystories_gelu.py:smoke \
        [overrides] [--time=ROUNDS]

Compiles `Program.train_step` (every step) and `Program.log_step` (the steps the loop logs) for a
config and counts the top-level instructions of each optimized HLO module's entry computation:
fusions, copies, all of them. Each is a kernel or a thunk at run time, so small-op overhead shows
here before it shows in a profile. `overrides` is one comma-separated list, e.g.
`model.loss_impl=plain`. `--time=ROUNDS` also times both steps side by side: ROUNDS alternating
rounds of 10 steps each, median step time of each.
"""

import collections
import re
import sys
import time

import jax
import numpy as np

from actlab import config as config_lib
from actlab import tasks
from actlab.data.tokenizer import nominal_vocab_size
from actlab.infra import errors
from actlab.run import program as program_lib


def entry_ops(compiled_text: str) -> collections.Counter:
  entry = compiled_text[compiled_text.index("\nENTRY"):]
  return collections.Counter(re.findall(r"= \S+ ([\w\-]+)\(", entry))


def main(spec: str, overrides: str = "", rounds: int = 0) -> None:
  path, colon, arg = spec.partition(":")
  config = errors.call_file(path, "get_config", *([arg] if colon else []), kind="config")
  if overrides:
    config = config_lib.override(config, config_lib.parse_overrides(overrides))
  vocab = nominal_vocab_size(config)
  program = program_lib.Program.create(config, vocab)
  state = jax.eval_shape(program.step.init, 0, 1.0)
  batch = jax.eval_shape(lambda: tasks.get(config).random_batch(config, vocab, 0))
  variants = {name: getattr(program, name) for name in ("train_step", "log_step")}
  for name, step in variants.items():
    ops = entry_ops(step.lower(state, batch).compile().as_text())
    print(f"{spec} {overrides} {name}: {ops['fusion']} fusions, {ops['copy']} copies, "
          f"{sum(ops.values())} ops")
  if not rounds:
    return
  state = program.start([config])
  batch = program.put_batches([tasks.get(config).random_batch(config, vocab, 0)])
  times = {name: [] for name in variants}
  for r in range(rounds + 1):  # Round 0 warms up.
    for name, step in variants.items():
      t0 = time.perf_counter()
      for _ in range(10):
        state, metrics = step(state, batch)
      jax.block_until_ready((state, metrics))
      if r:
        times[name].append((time.perf_counter() - t0) / 10)
  medians = {name: 1e3 * float(np.median(t)) for name, t in times.items()}
  print(", ".join(f"{name} {ms:.1f} ms" for name, ms in medians.items())
        + f"; log_step / train_step {medians['log_step'] / medians['train_step']:.3f}")


if __name__ == "__main__":
  args = [a for a in sys.argv[1:] if not a.startswith("--time=")]
  main(*args, rounds=sum(int(a[7:]) for a in sys.argv[1:] if a.startswith("--time=")))

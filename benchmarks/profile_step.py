"""Where a config's train step spends its time (BENCHMARKS.md, "Where the smoke step goes"):

    python benchmarks/profile_step.py configs/tinystories_gelu.py:smoke [overrides] [--trace]

prints the median time of the jitted forward (the loss), forward + backward, optimizer update and
whole train step on random tokens, the step the loop runs on log steps (with the update and
parameter norms) and on the others; with `--trace`, also a `jax.profiler` trace of 5 steps of
each summed by what each XLA thunk computes (matmul by output shape, elementwise, reduction, exp).
`overrides` is one comma-separated list, e.g. `model.loss_impl=plain,model.activation=relu`.
"""

import collections
import functools
import gzip
import json
import pathlib
import re
import sys
import tempfile
import time

import jax
import numpy as np

from actlab import config as config_lib
from actlab import tasks
from actlab.data.tokenizer import nominal_vocab_size
from actlab.infra import errors
from actlab.run import program


def median_ms(f, *args, n: int = 20) -> float:
  jax.block_until_ready(f(*args))
  times = []
  for _ in range(n):
    t0 = time.perf_counter()
    jax.block_until_ready(f(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * float(np.median(times))


def what(instruction: str, computations: dict) -> str:
  """What one thunk computes, from its HLO instruction (and a fusion's computation)."""
  shape = lambda text: (re.findall(r"(\w+\[[\d,]*\])", text) or ["?"])[0]
  op = re.search(r"= \S+ ([\w\-]+)\(", instruction).group(1)
  if op != "fusion":
    return f"{op} {shape(instruction)}"
  called = re.search(r"calls=%?([\w.\-]+)", instruction)
  body = computations.get(called.group(1), "") if called else ""
  dot = re.search(r"= ([^\n]*) dot\(", body)
  if dot:
    return f"matmul fusion {shape(dot.group(1))}"
  return ("exp fusion" if "exponential(" in body else "reduce fusion" if "reduce(" in body
          else "elementwise fusion")


def trace(step, state, batch, n: int = 5) -> None:
  hlo = step.lower(state, batch).compile().as_text()
  computations = dict(re.findall(r"\n%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.S))
  instructions = dict(re.findall(r"\n\s*(?:ROOT )?%?([\w.\-]+) = ([^\n]*)", hlo))
  with tempfile.TemporaryDirectory() as d:
    with jax.profiler.trace(d, create_perfetto_trace=True):
      for _ in range(n):
        state, _ = step(state, batch)
        jax.block_until_ready(state)
    events = json.load(gzip.open(next(pathlib.Path(d).rglob("*perfetto_trace.json.gz"))))
  by_kind = collections.Counter()
  for e in events["traceEvents"] if isinstance(events, dict) else events:
    if e.get("ph") == "X" and e["name"] in instructions:
      by_kind[what(" = " + instructions[e["name"]], computations)] += e.get("dur", 0) / n / 1e3
  total = sum(by_kind.values())
  print(f"thunks: {total:.1f} ms per step (they overlap on the CPU's threads)")
  for kind, ms in by_kind.most_common():
    print(f"{ms:8.2f} ms  {100 * ms / total:4.1f}%  {kind}")


def main(argv) -> None:
  spec, rest = argv[1], [a for a in argv[2:] if a != "--trace"]
  path, _, arg = spec.partition(":")
  c = errors.call_file(path, "get_config", arg or None, kind="config")
  if rest:
    c = config_lib.override(c, config_lib.parse_overrides(rest[0]))
  vocab = nominal_vocab_size(c)
  fns = program.create_step(c, vocab)
  state = jax.jit(fns.init)(0)
  batch = jax.numpy.asarray(tasks.get(c).random_batch(c, vocab))
  key = jax.random.PRNGKey(0)

  def loss(params):
    out = fns.objective(params, batch, key, train=True)
    return out.loss_sum / out.count

  grads = jax.jit(jax.grad(loss))(state.params)
  log_step = jax.jit(fns.train_step)
  train_step = jax.jit(functools.partial(fns.train_step, diagnostics=False))
  for name, f, args in [
      ("forward (loss)", jax.jit(loss), (state.params,)),
      ("forward + backward", jax.jit(jax.value_and_grad(loss)), (state.params,)),
      ("optimizer update", jax.jit(fns.tx.update), (grads, state.opt_state, state.params)),
      ("train step, logged", log_step, (state, batch)),
      ("train step, not logged", train_step, (state, batch))]:
    print(f"{name:22s} {median_ms(f, *args):8.1f} ms")
  if "--trace" in argv:
    for name, step in (("logged", log_step), ("not logged", train_step)):
      print(f"-- train step, {name}")
      trace(step, state, batch)


if __name__ == "__main__":
  main(sys.argv)

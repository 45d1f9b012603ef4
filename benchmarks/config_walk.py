"""Where a `ConfigDict` goes on a run (docs/design.md §1): no GPU needed.

    JAX_PLATFORMS=cpu python benchmarks/config_walk.py [configs/tinystories_gelu.py:smoke]

Trains the config for 4 steps in a temporary workdir with a profiler on, and records every call of
an actlab function that receives the config or one of its sections (`config.model`, …) as an
argument. Prints the walk module by module, the number of modules it enters, and how many times
it returns to a module it had left. The run types the config at its door (`config.typed`): past
it, the run reads the typed `Config`.
"""

import collections
import sys
import tempfile

import ml_collections

from actlab.infra import errors
from actlab.run import train


def walk(config: ml_collections.ConfigDict) -> list[str]:
  """`module:function` of each call that receives `config` or a section of it, in order."""
  ids = {id(config)} | {id(v) for v in config.values() if isinstance(v, ml_collections.ConfigDict)}
  calls = []

  def profile(frame, event, _):
    module = frame.f_globals.get("__name__", "")
    if event != "call" or not module.startswith("actlab"):
      return
    code = frame.f_code
    names = code.co_varnames[:code.co_argcount + code.co_kwonlyargcount]
    if any(id(frame.f_locals.get(n)) in ids for n in names):
      calls.append(f"{module}:{code.co_name}")

  sys.setprofile(profile)
  try:
    train.run(config, tempfile.mkdtemp())
  finally:
    sys.setprofile(None)
  return calls


def main(spec: str = "configs/tinystories_gelu.py:smoke") -> None:
  path, colon, arg = spec.partition(":")
  config = errors.call_file(path, "get_config", *([arg] if colon else []), kind="config")
  config.train.update(steps=4, log_every=2, eval_every=4, checkpoint_every=4, progress=False)
  config.optim.warmup_steps = 1
  calls = walk(config)
  modules = [c.split(":")[0] for c in calls]
  visits = [m for i, m in enumerate(modules) if i == 0 or modules[i - 1] != m]
  for i, c in enumerate(calls):
    if i == 0 or calls[i - 1] != c:
      print(" ", c)
  print(f"calls: {len(calls)}  modules: {len(set(visits))}  "
        f"returns to a module left: {len(visits) - len(set(visits))}")
  print("visits per module:", dict(collections.Counter(visits).most_common()))


if __name__ == "__main__":
  main(*sys.argv[1:])

"""benchmarks/gpu_suite.sh stays runnable although no GPU runs it here: every command's config,
overrides, flags and sweep file resolve and validate (a renamed field or flag fails this test,
not a GPU session)."""

import re
import shlex

from absl import flags
from ml_collections import config_flags

from actlab import config as config_lib
from actlab.sweep import grid
from conftest import REPO

SUITE = REPO / "benchmarks" / "gpu_suite.sh"


def commands() -> list[list[str]]:
  """The suite's `$B ...`, `python3 -m actlab.sweep ...` and `python3 benchmarks/compile_options.py
  ...` commands as argument lists, with the script's variables substituted (the loop variable
  `$v` as `true`)."""
  text = SUITE.read_text().replace("\\\n", " ")
  variables = {name: value for name, _, value in re.findall(r'^([A-Z]+)=("?)(.*?)\2$', text, re.M)}
  out = []
  for line in text.splitlines():
    line = line.strip()
    if not line.startswith(("$B ", "python3 -m actlab.sweep", "python3 benchmarks/compile_opt")):
      continue
    for name, value in variables.items():
      line = line.replace(f"${name} ", f"{value} ").replace(f"${name}:", f"{value}:")
    line = line.replace("$v", "true")
    args = shlex.split(line)
    program = next(p for p in ("actlab.sweep", "benchmarks/compile_options.py", "actlab.bench")
                   if p in args)
    out.append(args[args.index(program) + 1:])
  return out


def bench_flags() -> set[str]:
  sources = [REPO / "actlab" / "bench" / "__main__.py", REPO / "benchmarks" / "compile_options.py"]
  return {name for path in sources
          for name in re.findall(r'DEFINE_\w+\("(\w+)"', path.read_text())} | {"config"}


def load(config_args: list[str]):
  fv = flags.FlagValues()
  config_flags.DEFINE_config_file("config", flag_values=fv, sys_argv=["prog", *config_args])
  fv(["prog", *config_args])
  return fv.config


def test_every_gpu_suite_command_resolves():
  cmds = commands()
  assert len(cmds) >= 12, cmds  # the GPT-2 small rows, the reference rows, the six-run study
  assert any("--sweep=benchmarks/six_run_study.py" in args for args in cmds), cmds
  known = bench_flags() | {"sweep", "workdir"}
  for args in cmds:
    names = {a[2:].split("=")[0].split(".")[0] for a in args if a.startswith("--")}
    assert names <= known, (args, names - known)
    config_args = [a if not a.startswith("--config=") else "--config=" + str(REPO / a[9:])
                   for a in args if a.startswith("--config")]
    config = load(config_args)
    config_lib.validate(config)
    sweep = [a.split("=", 1)[1] for a in args if a.startswith("--sweep=")]
    if sweep:
      assert grid.cells(config, grid.load(str(REPO / sweep[0])))

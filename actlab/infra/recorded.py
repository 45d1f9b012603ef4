"""Paths a run records: none of the machine that wrote it. A run directory is copied, archived
and committed: config.json and provenance (provenance.json, summary.json) record an absolute path
relative to the run directory, the interpreter by its base name and an actlab entry point as
`-m <module>` (docs/running.md, "One run")."""

import json
import os
import pathlib
from typing import Any

import ml_collections

DATA_PATHS = ("data.dir", "data.manual_dir", "data.gpt2_dir")  # workdir.RUNTIME_FIELDS' paths
PATH_PREFIXES = ("hf:",)  # train.init_from=hf:<dir>
PACKAGE = pathlib.Path(__file__).parents[1]  # actlab/: its files run as `-m actlab.…`


def recorded_path(path: str, run_dir: "str | os.PathLike") -> str:
  """`path` (optionally `hf:<path>`) as a run directory records it: a relative path as it is; an
  absolute one relative to `run_dir` ("../../manual"; "." for `run_dir` itself) when the two
  share a directory below /, else its base name (a path relative to / would be the absolute one)."""
  prefix = next((p for p in PATH_PREFIXES if path.startswith(p)), "")
  body = path[len(prefix):]
  if not os.path.isabs(body):
    return path
  body, base = os.path.normpath(body), os.path.abspath(run_dir)
  if os.path.commonpath([body, base]) == os.sep:
    return prefix + (os.path.basename(body) or body)
  return prefix + os.path.relpath(body, base)


def recorded_paths(obj: Any, run_dir: "str | os.PathLike") -> Any:
  """A copy of a JSON value with every string in it that is an absolute path `recorded_path`."""
  if isinstance(obj, dict):
    return {k: recorded_paths(v, run_dir) for k, v in obj.items()}
  if isinstance(obj, list):
    return [recorded_paths(v, run_dir) for v in obj]
  return recorded_path(obj, run_dir) if isinstance(obj, str) else obj


def recorded_config(config: ml_collections.ConfigDict, run_dir: "str | os.PathLike") -> dict:
  """`config` as config.json (and provenance's `runtime`) records it: its DATA_PATHS made
  absolute against the working directory, then every absolute path `recorded_path`, so that the
  data paths are relative to the run directory (`run_config` reads them back against it)."""
  out = map_data_paths(json.loads(config.to_json()),
                       lambda path: os.path.abspath(os.path.expanduser(path)))
  return recorded_paths(out, run_dir)


def map_data_paths(config: dict, fn) -> dict:
  """`config` (a nested dict, changed in place) with `fn` applied to each DATA_PATHS value set."""
  for field in DATA_PATHS:
    section, key = field.split(".")
    if isinstance(config.get(section), dict) and config[section].get(key):
      config[section][key] = fn(config[section][key])
  return config


def recorded_command(argv: list[str], executable: str, run_dir: "str | os.PathLike",
                     package: "str | os.PathLike" = PACKAGE) -> list[str]:
  """The command line `executable` `argv` as a reader would type it: the interpreter by its base
  name, a script in `package` as `-m <module>`, every other absolute path (an argument, or the
  value of `--flag=`) `recorded_path`."""
  command, package = [os.path.basename(executable) or executable], pathlib.PurePath(package)
  script = pathlib.PurePath(argv[0]) if argv else None
  if script and script.is_absolute() and script.suffix == ".py" and script.is_relative_to(package):
    module = ".".join((package.name, *script.relative_to(package).with_suffix("").parts))
    command += ["-m", module.removesuffix(".__main__")]
    argv = argv[1:]
  for arg in argv:
    flag, eq, value = arg.partition("=")
    command.append(f"{flag}={recorded_path(value, run_dir)}" if arg.startswith("-") and eq
                   else recorded_path(arg, run_dir))
  return command

"""User-facing errors: one readable line on stderr and a non-zero exit, no traceback wall.

Command-line tools start with `errors.run(main)` and define a config file flag with
`errors.define_config_file`: then mistakes in the flags (an unknown flag or `--config.<field>`, a
bad value, a missing or broken config file) are reported like a UserError raised by `main`.
"""

import contextlib
import difflib
import importlib.util
import os
import pathlib
import re
import sys
import traceback

import ml_collections
from absl import app, flags
from ml_collections import config_flags

flags.disclaim_key_flags()  # A flag `define_config_file` defines belongs to its caller (--helpshort).


class UserError(Exception):
  """An error whose message tells the user what to fix (config, data, workdir, checkpoint)."""
  exit_code = 2


class DataError(UserError):
  """A data problem the user can fix; the message says how. main prints it and exits non-zero."""


def short_cause(e: BaseException, limit: int = 150) -> str:
  """'TypeName: first words of the message', for error messages."""
  msg = " ".join(str(e).split())
  return f"{type(e).__name__}: {msg[:limit]}{'...' if len(msg) > limit else ''}"


@contextlib.contextmanager
def reported():
  """Turns a UserError into `error: <message>` on stderr and its exit code. The process ends at
  once (`os._exit`): exit handlers of libraries whose writes failed (a full disk: TensorBoard's
  writer, Orbax's threads) would only print the same error again as tracebacks. Whatever actlab
  writes is complete or atomic by then."""
  try:
    yield
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(e.exit_code)


def run(main) -> None:
  """`app.run(main)`, with a UserError in flag parsing or in `main` reported by `reported`."""

  def reported_main(argv):
    with reported():
      return main(argv)

  app.run(reported_main, flags_parser=_parse_flags)


def _parse_flags(argv: list[str]) -> list[str]:
  """absl's flag parsing, with its errors (an unknown or missing flag, a bad value) as UserErrors."""
  with reported():
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      raise UserError(f"{e} (see --helpshort)") from None


def _closest(word: str, choices) -> str | None:
  """The choice most like `word`: its abbreviation (`lr` for `learning_rate`), else difflib's
  closest match, else None."""
  choices = list(choices)
  initials = "".join(part[:1] for part in word.split("_"))
  if "_" in word and initials in choices:
    return initials
  return next(iter(difflib.get_close_matches(word, choices, n=1)), None)


def call_file(path: str, function: str, *args, kind: str):
  """`function(*args)` of the Python file at `path` (a `kind` file: "config", "sweep").

  A missing file or function is a UserError, and so is an exception the file raises, naming the
  file and line; a UserError or ValueError it raises (its own refusal, e.g. of an unknown variant)
  passes unchanged.
  """
  file = pathlib.Path(path)
  if not file.is_file():
    sibling = _closest(file.name, (p.name for p in file.parent.glob("*.py")))
    hint = f"; did you mean {str(file.with_name(sibling))!r}?" if sibling else ""
    raise UserError(f"{kind} file {path!r} not found{hint}")
  try:
    spec = importlib.util.spec_from_file_location(f"actlab_{kind}_{file.stem}", file)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if not hasattr(module, function):
      raise UserError(f"{kind} file {path!r} defines no {function}()")
    return getattr(module, function)(*args)
  except (UserError, ValueError):
    raise
  except SyntaxError as e:
    raise UserError(f"{kind} file {e.filename}:{e.lineno}: SyntaxError: {e.msg}") from None
  except Exception as e:
    lines = [line for frame, line in traceback.walk_tb(e.__traceback__)
             if pathlib.Path(frame.f_code.co_filename).resolve() == file.resolve()]
    where = f"{path}:{lines[-1]}" if lines else path
    raise UserError(f"{kind} file {where}: {type(e).__name__}: {e}") from None


def unknown_field(config: ml_collections.ConfigDict, key: str) -> str | None:
  """Why the dotted `key` names no field of `config`, with the closest names; None if it does."""
  parts = key.split(".")
  node = config
  for depth, part in enumerate(parts):
    if not isinstance(node, ml_collections.ConfigDict) or not part.isidentifier():
      return None  # inside a field's value (a tuple, a dataclass): config_flags checks that
    if part not in node:
      names = list(node.keys())
      if depth < len(parts) - 1:
        problem = f"the config has no section {'.'.join(parts[:depth + 1])!r}"
        match = _closest(key, _dotted_fields(config))
      else:
        section = ".".join(parts[:-1])
        problem = f"{section or 'the config'} has no field {part!r}"
        match = _closest(part, names)
        match = match and (f"{section}.{match}" if section else match)
      return problem + (f"; did you mean {match!r}?" if match else f"; it has {', '.join(names)}")
    node = node[part]
  return None


def _dotted_fields(config: ml_collections.ConfigDict, prefix: str = ""):
  for name, value in config.items():
    if isinstance(value, ml_collections.ConfigDict):
      yield from _dotted_fields(value, f"{prefix}{name}.")
    else:
      yield prefix + name


class _ConfigFileParser(flags.ArgumentParser):
  """Parses `--<name>=path[:arg]` as config_flags' own parser does (`get_config(arg)`, then locks
  the config), with UserErrors for a missing or broken file and for `--<name>.<key>` overrides
  that name no field (config_flags fails on those with a traceback)."""

  def __init__(self, name: str):
    self.name = name

  def flag_type(self) -> str:
    return "config object"

  def parse(self, spec: str) -> ml_collections.ConfigDict:
    path, colon, arg = spec.partition(":")
    config = call_file(path, "get_config", *([arg] if colon else []), kind="config")
    if not isinstance(config, ml_collections.ConfigDict):
      raise UserError(f"config file {path!r}: get_config returned {type(config).__name__}, "
                      "not a ConfigDict")
    for key in override_keys(self.name):
      problem = unknown_field(config, key)
      if problem:
        raise UserError(f"--{self.name}.{key}: {problem}")
    config.lock()
    return config


def override_keys(name: str) -> list[str]:
  """The keys of the `--<name>.<key>` overrides on the command line (those config_flags applies
  to the config file's config): `--config.train.steps=30` → "train.steps"."""
  pattern = re.compile(rf"-{{1,2}}(no)?{re.escape(name)}\.([^=]+)")
  argv = flags.FLAGS.read_flags_from_files(sys.argv, force_gnu=False)
  return [match[2] for match in map(pattern.match, argv) if match]


def define_config_file(name: str, help_string: str,
                       flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagHolder:
  """`config_flags.DEFINE_config_file(name)` (no default) with `_ConfigFileParser`'s errors; its
  help (`--helpfull`) names the listing of every field."""
  help_string += (f" Override any field with --{name}.<section>.<field>=<value>; every field, its "
                  "default and meaning: python -m actlab.config.")
  holder = config_flags.DEFINE_config_file(name, None, help_string, flag_values=flag_values)
  flag_values[name].parser = _ConfigFileParser(name)
  return holder

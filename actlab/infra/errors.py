"""User-facing errors: one readable line on stderr and a non-zero exit, no traceback; with
`run(main)` and `define_config_file`, for mistakes in the flags and config files too."""

import contextlib
import difflib
import inspect
import logging
import os
import pathlib
import runpy
import sys
import traceback

import ml_collections
from absl import app, flags
from flax import traverse_util
from ml_collections import config_flags

flags.disclaim_key_flags()  # The flag `define_config_file` defines is its caller's (--helpshort).


class UserError(Exception):
  """An error whose message tells the user what to fix (config, data, workdir, checkpoint)."""
  exit_code = 2


class DataError(UserError):
  """A data problem the user can fix; the message says how."""


def short_cause(e: BaseException, limit: int = 150) -> str:
  """'TypeName: first words of the message', for error messages."""
  msg = " ".join(str(e).split())
  return f"{type(e).__name__}: {msg[:limit]}{'...' if len(msg) > limit else ''}"


@contextlib.contextmanager
def reported():
  """Turns a UserError into `error: <message>` on stderr and `os._exit` with its code (exit
  handlers of libraries whose writes failed would repeat it as tracebacks)."""
  try:
    yield
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(e.exit_code)


def orbax_noise(record: logging.LogRecord) -> bool:
  """Whether a log record is a warning of Orbax's or asyncio's (`run`)."""
  return record.levelno >= logging.WARNING and (
      "/orbax/" in record.pathname or record.name == "asyncio")


def run(main) -> None:
  """`app.run(main)` with `parse_flags`, a UserError in either `reported`; drops the warnings and
  unraisable errors Orbax's abandoned reads leave after a failed checkpoint read."""
  for name in ("absl", "asyncio"):
    logging.getLogger(name).addFilter(lambda record: not orbax_noise(record))

  def unraisablehook(unraisable, hook=sys.unraisablehook):
    value, read = unraisable.exc_value, unraisable.object
    closed_loop = isinstance(value, RuntimeError) and str(value) == "Event loop is closed"
    if not (closed_loop or inspect.iscoroutine(read) and "/orbax/" in read.cr_code.co_filename):
      hook(unraisable)

  sys.unraisablehook = unraisablehook
  app.run(reported()(main), flags_parser=reported()(parse_flags))


def parse_flags(argv: list[str], flag_values: flags.FlagValues = flags.FLAGS) -> list[str]:
  """absl's parsing of `argv` after `check_config_files`, its errors as UserErrors."""
  check_config_files(argv, flag_values)
  try:
    return flag_values(argv)
  except flags.Error as e:
    raise UserError(f"{e} (see --helpshort)") from None


def _closest(word: str, choices) -> str | None:
  """The choice most like `word`: its initials (`lr` for `learning_rate`), else difflib's."""
  choices = list(choices)
  initials = "".join(part[:1] for part in word.split("_"))
  if "_" in word and initials in choices:
    return initials
  return next(iter(difflib.get_close_matches(word, choices, n=1)), None)


def call_file(path: str, function: str, *args, kind: str):
  """`function(*args)` of the Python file at `path` (a `kind` file: "config", "sweep"); a missing
  file or function or an exception it raises is a UserError naming the file and line."""
  file = pathlib.Path(path)
  if not file.is_file():
    sibling = _closest(file.name, (p.name for p in file.parent.glob("*.py")))
    hint = f"; did you mean {str(file.with_name(sibling))!r}?" if sibling else ""
    raise UserError(f"{kind} file {path!r} not found{hint}")
  try:
    namespace = runpy.run_path(str(file), run_name=f"actlab_{kind}_{file.stem}")
    if function not in namespace:
      raise UserError(f"{kind} file {path!r} defines no {function}()")
    return namespace[function](*args)
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
        match = _closest(key, traverse_util.flatten_dict(config.to_dict(), sep="."))
      else:
        section = ".".join(parts[:-1])
        problem = f"{section or 'the config'} has no field {part!r}"
        match = _closest(part, names)
        match = match and (f"{section}.{match}" if section else match)
      return problem + (f"; did you mean {match!r}?" if match else f"; it has {', '.join(names)}")
    node = node[part]
  return None


def check_config_files(argv: list[str], flag_values: flags.FlagValues) -> None:
  """A UserError for a config file flag's missing or broken `path[:arg]` in `argv`, or an
  override `--<name>.<key>` that names no field (config_flags raises a bare KeyError)."""
  mine = [f.name for f in _config_file_flags if f.name in flag_values and flag_values[f.name] is f]
  for name in mine:
    as_string = flags.FlagValues()  # Only the config flag, as a plain string (known_only).
    flags.DEFINE_string(name, None, "", flag_values=as_string)
    unparsed = as_string(argv, known_only=True)[1:]
    if as_string[name].value is None:
      continue
    path, colon, arg = as_string[name].value.partition(":")
    config = call_file(path, "get_config", *([arg] if colon else []), kind="config")
    if not isinstance(config, ml_collections.ConfigDict):
      raise UserError(f"config file {path!r}: get_config returned {type(config).__name__}, "
                      "not a ConfigDict")
    for given in unparsed:
      flag = given.split("=", 1)[0].lstrip("-")
      key = next((flag[len(p):] for p in (f"{name}.", f"no{name}.") if flag.startswith(p)), None)
      if given.startswith("-") and key and (problem := unknown_field(config, key)):
        raise UserError(f"--{name}.{key}: {problem}")


def require(*names: str) -> None:
  """absl's required flags, a missing one named with its help."""
  for name in names:
    flags.register_validator(name, lambda value: value is not None,
                             f"--{name} is required: {flags.FLAGS[name].help}")


_config_file_flags: list[flags.Flag] = []  # Those `define_config_file` defined.


def define_config_file(name: str, help_string: str,
                       flag_values: flags.FlagValues = flags.FLAGS) -> flags.FlagHolder:
  """`config_flags.DEFINE_config_file(name)`, whose mistakes `parse_flags` reports in one line."""
  help_string += (f" Override any field with --{name}.<section>.<field>=<value>; every field, its "
                  "default and meaning: python -m actlab.config.")
  holder = config_flags.DEFINE_config_file(name, None, help_string, flag_values=flag_values)
  _config_file_flags.append(flag_values[name])
  return holder

"""The run directory (docs/design.md §3.4–§3.7): its `Lock`, the config that identifies its run,
atomic files, metrics.jsonl, and the paths it records (relative to it)."""

import contextlib
import dataclasses
import datetime
import errno
import fcntl
import json
import os
import pathlib
import re
import socket
import sys
import time
from typing import Any, Iterator

import jax
from flax import traverse_util

from actlab.infra.errors import UserError


class WorkdirError(UserError):
  """The workdir cannot hold this run (another run, another owner, not a directory)."""


# What a run directory holds (docs/design.md §3.5; `curves.png`: actlab.report's plot of a run)
# and `write_text`'s temporary files.
RUN_FILES = (".lock", "config.json", "provenance.json", "metrics.jsonl", "tb", "wandb",
             "checkpoints", "checkpoints.corrupt", "tokenizer", "summary.json", "curves.png")
_FROM_A_RUN = re.compile("|".join(map(re.escape, RUN_FILES)) + r"|process_\d+|\..+\.tmp-.+")
SHOWN_DIFFS = 3  # a config differing in more fields than this is named by its fields alone
DATA_PATHS = ("data.dir", "data.manual_dir", "data.gpt2_dir")  # recorded relative to the run
PACKAGE = pathlib.Path(__file__).parents[1]  # actlab/: its files run as `-m actlab.…`

# Fields a config gained after runs were written with it, at the value a config.json without one
# had: every field at its default, since a new field's default is what runs from before it did.
# Filled in where the fields are declared (actlab/config/schema.py), as actlab.config is imported.
ADDED_FIELDS: dict[tuple[str, str], Any] = {}


@dataclasses.dataclass(frozen=True)
class RunDir:
  """A run directory: `root` holds the shared checkpoints, `logdir` this process's files."""
  root: pathlib.Path
  logdir: pathlib.Path

  @classmethod
  def open(cls, workdir: "RunDir | str | os.PathLike") -> "RunDir":
    if isinstance(workdir, RunDir):
      return workdir
    root, i = pathlib.Path(workdir), jax.process_index()
    return cls(root, root / f"process_{i}" if i else root)

  def __fspath__(self) -> str:  # A RunDir stands for its directory: pathlib.Path(run_dir) works.
    return str(self.root)

  @property
  def checkpoints(self) -> pathlib.Path:
    return self.root / "checkpoints"

  @property
  def tokenizer(self) -> pathlib.Path:
    return self.logdir / "tokenizer"

  def lock(self) -> "Lock":
    return Lock(self.logdir)

  def summary(self) -> dict | None:
    return read_summary(self.logdir)

  def check_config(self, config: dict, runtime: tuple[str, ...] = ()) -> None:
    """Raises unless the directory is unused or holds a run of this config, `runtime` aside."""
    path = self.logdir / "config.json"
    if not path.exists():
      return
    old = read_json(path)
    if old is None:
      raise WorkdirError(f"{path} is unreadable; move it aside only if you know which config "
                         "this run used, or choose another --workdir")
    if not {"model", "train"} <= old.keys():
      raise WorkdirError(f"{path} is not an actlab run's config (it has no model and train "
                         "sections); choose another --workdir")
    # Compared as recorded, shown as config.json holds them and as given.
    recorded = (recorded_paths(c, self.root) for c in (old, config))
    differ = {d.partition(": ")[0] for d in diff_configs(*recorded, runtime)}
    diffs = [d for d in diff_configs(old, config, runtime) if d.partition(": ")[0] in differ]
    if len(diffs) > SHOWN_DIFFS:  # names only: another run altogether
      names = [d.partition(": ")[0] for d in diffs]
      diffs = [f"{len(names)} fields: {', '.join(names[:SHOWN_DIFFS])} and "
               f"{len(names) - SHOWN_DIFFS} more"]
    if diffs:
      raise WorkdirError(f"{self.logdir} holds a run with a different config ({'; '.join(diffs)}); "
                         "rerun with the same config to resume, or choose another --workdir")

  def write_config(self, config: dict) -> None:
    """Writes config.json once: a resumed run keeps the one it started with."""
    path = self.logdir / "config.json"
    if not path.exists():
      write_json(path, recorded_config(config, self.root))


def diff_configs(old: dict, new: dict, ignore: tuple[str, ...] = ()) -> list[str]:
  """"field: old → new" for each field two configs (nested or dotted) differ in, `ADDED_FIELDS`
  filled in, fields starting with an `ignore` prefix aside."""
  old, new = dotted(with_added_fields(old)), dotted(with_added_fields(new))
  pairs = {k: (old.get(k, "<absent>"), new.get(k, "<absent>")) for k in sorted(old | new)
           if not k.startswith(ignore)}
  return [f"{k}: {a!r} → {b!r}" for k, (a, b) in pairs.items() if a != b]


def with_added_fields(config: dict) -> dict:
  """A config (nested or dotted) as a new nested dict, with the `ADDED_FIELDS` its sections lack."""
  out = traverse_util.unflatten_dict(dotted(config), sep=".")
  for (section, field), value in ADDED_FIELDS.items():
    if isinstance(out.get(section), dict):
      out[section].setdefault(field, value)
  return out


def dotted(d: dict) -> dict:
  """A nested config dict as {"section.field": value} (a dotted one as it is)."""
  return traverse_util.flatten_dict(d, sep=".")


def first_diffs(diffs: list[str]) -> str:
  """Differences as a refusal names them: the first `SHOWN_DIFFS`, and how many more."""
  more = f"; and {len(diffs) - SHOWN_DIFFS} more" if len(diffs) > SHOWN_DIFFS else ""
  return "; ".join(diffs[:SHOWN_DIFFS]) + more


def run_config(workdir: pathlib.Path) -> dict | None:
  """`workdir`/config.json `with_added_fields`, its DATA_PATHS read against `workdir`, or None
  unless it is an actlab config (with `model` and `train` sections)."""
  config = read_json(workdir / "config.json")
  if not (config and {"model", "train"} <= config.keys()):
    return None
  return map_data_paths(with_added_fields(config),
                        lambda path: os.path.normpath(os.path.join(os.path.abspath(workdir), path)))


def check_unused(workdir: pathlib.Path) -> None:
  """Refuses a `--workdir` that holds no run but files a run does not write (`RUN_FILES`)."""
  if not workdir.is_dir() or is_run(workdir):
    return
  foreign = sorted(p.name for p in workdir.iterdir() if not _FROM_A_RUN.fullmatch(p.name))
  if foreign:
    named = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
    raise WorkdirError(f"--workdir {workdir} holds no run but other files ({named}); give a new "
                       "or empty directory, or a run's directory to resume it")


def is_run(path: pathlib.Path) -> bool:
  """Whether `path` is a run directory: it holds an actlab config.json or checkpoints/."""
  return run_config(path) is not None or (path / "checkpoints").is_dir()


def is_sweep(path: pathlib.Path) -> bool:
  """Whether `path` is a sweep directory: it holds sweep.json."""
  return (path / "sweep.json").is_file()


def in_run(path: pathlib.Path) -> str | None:
  """How `path` is placed in a run directory, as a refusal says it ("is", ...), or None."""
  resolved = path.resolve()
  run = next((p for p in (resolved, *resolved.parents) if is_run(p)), None)
  if run is None:
    return None
  return "is" if run == resolved else f"lies inside {run}, which is"


def check_usable(workdir: pathlib.Path, flag: str = "--workdir") -> None:
  """Refuses a directory to write (given as `flag`) that is a file or lies under one."""
  existing = next(path for path in (workdir, *workdir.parents) if path.exists())
  if not existing.is_dir():
    where = "is" if existing == workdir else f"lies under {existing}, which is"
    raise WorkdirError(f"{flag} {workdir} {where} a file, not a directory; choose another {flag}")


def write_text(path: pathlib.Path, text: str) -> None:
  """Writes `path` whole or not at all (the temp file named by host and pid)."""
  tmp = path.with_name(f".{path.name}.tmp-{socket.gethostname()}-{os.getpid()}")
  try:
    with open(tmp, "w") as f:
      f.write(text)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  finally:
    tmp.unlink(missing_ok=True)
  dir_fd = os.open(path.parent, os.O_RDONLY)
  try:
    os.fsync(dir_fd)  # The rename itself survives a power cut.
  finally:
    os.close(dir_fd)


def write_json(path: pathlib.Path, obj: Any) -> None:
  write_text(path, json.dumps(obj, indent=2) + "\n")


def read_json(path: pathlib.Path) -> dict | None:
  """The JSON object in `path`, or None when it is missing, empty, torn or not an object."""
  try:
    obj = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  return obj if isinstance(obj, dict) else None


def read_summary(logdir: pathlib.Path, warn: bool = True) -> dict | None:
  """The run's summary.json, or None while the run is not finished."""
  path = logdir / "summary.json"
  summary = read_json(path)
  if summary is None and path.exists() and warn:
    print(f"actlab: {path} is unreadable; treating the run as not finished", file=sys.stderr)
  return summary


_held: dict[pathlib.Path, list] = {}  # lock path -> [open file, depth]: this process's locks


class Lock:
  """`fcntl.flock` on `<workdir>/.lock` in a `with` block, re-entrant; another process: `Busy`."""

  class Busy(WorkdirError):
    """Another process holds the workdir; `holder`: its lock file's record ({} if unknown)."""

    def __init__(self, message: str, holder: dict):
      super().__init__(message)
      self.holder = holder

  def __init__(self, workdir: pathlib.Path):
    self.path = (pathlib.Path(workdir) / ".lock").absolute()

  def __enter__(self) -> "Lock":
    if self.path in _held:
      _held[self.path][1] += 1
      return self
    self.path.parent.mkdir(parents=True, exist_ok=True)
    f = open(self.path, "a+")
    try:
      fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
      f.close()
      deadline = time.monotonic() + 2.0  # Its file is empty or torn for a moment after it is taken.
      while not (holder := read_json(self.path)) and time.monotonic() < deadline:
        time.sleep(0.01)
      holder = holder or {}
      who = (f"pid {holder.get('pid')} on {holder.get('host')} (since {holder.get('since')})"
             if holder else "another process")
      raise Lock.Busy(f"{self.path.parent} is in use by {who}; wait for that run to end (or stop "
                      "it), or choose another --workdir", holder) from None
    f.truncate(0)  # Mode "a+" writes at the end: now the start.
    f.write(json.dumps({"pid": os.getpid(), "parent": os.getppid(), "host": socket.gethostname(),
                        "since": now()}))
    f.flush()
    _held[self.path] = [f, 1]
    return self

  def __exit__(self, *exc) -> None:
    entry = _held[self.path]
    entry[1] -= 1
    if not entry[1]:
      del _held[self.path]
      entry[0].close()  # Closing the file releases the lock.


def now() -> str:
  return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


# --- metrics.jsonl --------------------------------------------------------------------------------


def read_rows(path: pathlib.Path) -> tuple[list[dict], int]:
  """The readable rows of a metrics.jsonl and how many lines were torn or mangled (skipped)."""
  try:
    lines = path.read_text().splitlines()
  except OSError:
    return [], 0
  rows, bad = [], 0
  for line in filter(str.strip, lines):
    try:
      row = json.loads(line)
    except ValueError:
      row = None
    if isinstance(row, dict) and isinstance(row.get("step"), int):
      rows.append(row)
    else:
      bad += 1
  return rows, bad


class MetricsLog:
  """metrics.jsonl, starting as the `rows` up to `step` the checkpoint carries; a file that
  differs is rewritten, with a line saying what changed."""

  def __init__(self, path: pathlib.Path, rows: list[dict], step: int):
    self.path = path
    self.rows = list(rows)
    on_disk, bad = read_rows(path)
    if on_disk != self.rows:
      later = sum(r["step"] > step for r in on_disk)
      missing = sum(r not in on_disk for r in self.rows)
      news = [f"{n} {what}" for n, what in ((later, f"row(s) after step {step} dropped"),
                                            (bad, "unreadable line(s) dropped"),
                                            (missing, "row(s) restored")) if n]
      if news:
        print(f"actlab: {path} rebuilt from the checkpoint of step {step}: {', '.join(news)}",
              file=sys.stderr)
      write_text(path, "".join(json.dumps(r) + "\n" for r in self.rows))

  def write(self, row: dict) -> None:
    self.rows.append(row)
    with self.path.open("a") as f:
      f.write(json.dumps(row) + "\n")


# --- The paths a run records ----------------------------------------------------------------------


def recorded_path(path: str, run_dir: "str | os.PathLike") -> str:
  """`path` (or `hf:<path>`) as a run records it: a relative path as it is, an absolute one
  relative to `run_dir` where they share a directory below /, else its base name."""
  prefix = "hf:" if path.startswith("hf:") else ""
  body = path[len(prefix):]
  if not os.path.isabs(body):
    return path
  body, base = os.path.normpath(body), os.path.abspath(run_dir)
  if os.path.commonpath([body, base]) == os.sep:
    return prefix + (os.path.basename(body) or body)
  return prefix + os.path.relpath(body, base)


def recorded_paths(obj: Any, run_dir: "str | os.PathLike") -> Any:
  """A copy of a JSON value with each string `recorded_path`."""
  if isinstance(obj, dict):
    return {k: recorded_paths(v, run_dir) for k, v in obj.items()}
  if isinstance(obj, list):
    return [recorded_paths(v, run_dir) for v in obj]
  return recorded_path(obj, run_dir) if isinstance(obj, str) else obj


def recorded_config(config: dict, run_dir: "str | os.PathLike") -> dict:
  """A nested config as config.json records it: DATA_PATHS absolute, then `recorded_paths`."""
  out = map_data_paths(json.loads(json.dumps(config)),
                       lambda path: os.path.abspath(os.path.expanduser(path)))
  return recorded_paths(out, run_dir)


def map_data_paths(config: dict, fn) -> dict:
  """`config` (nested, changed in place) with `fn` applied to each DATA_PATHS value set."""
  for field in DATA_PATHS:
    section, key = field.split(".")
    if isinstance(config.get(section), dict) and config[section].get(key):
      config[section][key] = fn(config[section][key])
  return config


def recorded_command(argv: list[str], executable: str, run_dir: "str | os.PathLike",
                     package: "str | os.PathLike" = PACKAGE) -> list[str]:
  """The command line as a reader would type it: the interpreter by its base name, a script in
  `package` as `-m <module>`, other paths (arguments, `--flag=` values) `recorded_path`."""
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


_OS_ERROR_FULL = re.compile(r"\[os_error_code='(?:28|122)'\]")  # TensorStore's ENOSPC, EDQUOT


@contextlib.contextmanager
def full_disk_reported(workdir: pathlib.Path) -> Iterator[None]:
  """Turns a full disk (ENOSPC or EDQUOT in an exception's chain: an OSError, or TensorStore's in
  an Orbax write) into one line naming the file."""
  try:
    yield
  except Exception as e:
    cause, path = e, None
    while cause is not None and path is None:
      if isinstance(cause, OSError):
        if cause.errno in (errno.ENOSPC, errno.EDQUOT):
          path = cause.filename or str(workdir)
      elif _OS_ERROR_FULL.search(str(cause)):
        quoted = re.search(r'"([^"]+)"', str(cause))  # `Error writing local file "<path>": ...`
        path = quoted.group(1) if quoted else str(workdir)
      cause = cause.__cause__ or cause.__context__
    if path is None:
      raise
    raise WorkdirError(f"no space left on device writing {path}; free some space and rerun the "
                       "same command: it resumes from the last complete checkpoint (checkpoints "
                       "are written whole or not at all)") from None

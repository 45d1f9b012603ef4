"""A sweep file (docs/sweeps.md) and the grid of cells it defines (`cells`), with the command
line's flags over its fixed values (`with_flags`), shard i of N (`select`), and `sweep.json`,
which a sweep directory keeps while the same sweep resumes there (`check_manifest`)."""

import dataclasses
import itertools
import json
import pathlib
from typing import Any, Sequence

import ml_collections

from actlab import config as config_lib
from actlab.infra import errors
from actlab.infra import workdir as workdir_lib
from actlab.report import stats
from actlab.report.stats import SEED_KEY, fmt_value

# An axis of named cells: each value is a name whose config fields `fixed_by[ARM_KEY]` gives (a
# question's cells, actlab.ask); not a config field itself.
ARM_KEY = "arm"


@dataclasses.dataclass(frozen=True)
class Sweep:
  axes: dict[str, list]             # "section.field" -> values, in grid order
  seeds: list[int]
  fixed: dict[str, Any]             # overrides applied to every cell before the axes
  description: str = ""
  baseline: str | None = None       # the report's baseline activation (default: the first)
  pairs: list = dataclasses.field(default_factory=list)  # [A, B]: also compared, A − B, per LR
  equivalence_margin: float | None = None  # nats of final val loss, stated before running
  fixed_by: dict = dataclasses.field(default_factory=dict)  # axis -> its value -> overrides
  exclude: list = dataclasses.field(default_factory=list)  # [{axis: value}]: cells left out


@dataclasses.dataclass(frozen=True)
class Cell:
  name: str                         # the workdir name, e.g. "activation=relu,lr=0.001,seed=0"
  overrides: dict[str, Any]         # "section.field" -> value, axes then seed
  config: ml_collections.ConfigDict


def load(spec: str) -> Sweep:
  """`sweep.py[:arg]` (its `get_sweep(arg)`) or a `sweep.json` actlab.ask wrote → its Sweep."""
  path, _, arg = spec.partition(":")
  try:
    if path.endswith(".json"):
      return parse(json.loads(pathlib.Path(path).read_text()))
    return parse(errors.call_file(path, "get_sweep", arg or None, kind="sweep"))
  except ValueError as e:  # e.g. an unknown variant; ConfigError is a ValueError too
    raise config_lib.ConfigError(f"sweep {spec!r}: {e}") from None


KEYS = tuple(field.name for field in dataclasses.fields(Sweep))


def parse(d: dict) -> Sweep:
  """Checks a `get_sweep` result and turns it into a Sweep."""
  if unknown := set(d) - set(KEYS):
    raise config_lib.ConfigError(f"sweep: unknown keys {sorted(unknown)}; use {', '.join(KEYS)}")
  axes = {k: list(v) for k, v in d.get("axes", {}).items()}
  seeds = [int(s) for s in d.get("seeds", [0])]
  for key, values in {**axes, SEED_KEY: seeds}.items():
    if not values or len(set(map(repr, values))) != len(values):
      raise config_lib.ConfigError(f"sweep axis {key!r} needs distinct values, got {values}")
  if SEED_KEY in axes:
    raise config_lib.ConfigError(f"sweep: give seeds as 'seeds', not as the axis {SEED_KEY!r}")
  margin = d.get("equivalence_margin")
  if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))
                             or not stats.finite(margin) or margin <= 0):
    raise config_lib.ConfigError(f"sweep: equivalence_margin must be a number > 0 (nats of "
                                 f"final val loss), got {margin!r}")
  return Sweep(axes, seeds, dict(d.get("fixed", {})), d.get("description", ""),
               d.get("baseline"), _pairs(axes, d.get("pairs", [])),
               None if margin is None else float(margin), _fixed_by(axes, d.get("fixed_by", {})),
               _exclude(axes, seeds, d.get("exclude", [])))


def _fixed_by(axes: dict[str, list], fixed_by: dict) -> dict:
  """`fixed_by` ({axis: {value: {field: value}}}: e.g. each activation's own LR), checked."""
  for axis, by_value in fixed_by.items():
    if not isinstance(by_value, dict) or any(
        value not in axes.get(axis, []) or not isinstance(o, dict) or set(o) & {*axes, SEED_KEY}
        for value, o in by_value.items()):
      raise config_lib.ConfigError(f"sweep: fixed_by: {axis}: {by_value!r}: give values of that "
                                   "axis, each mapped to fields no axis varies")
  return {axis: {value: dict(o) for value, o in by_value.items()}
          for axis, by_value in fixed_by.items()}


def _exclude(axes: dict[str, list], seeds: list[int], exclude) -> list[dict]:
  """`exclude` ([{axis: value}]: cells with every value of one entry are left out), checked."""
  for entry in exclude:
    if not isinstance(entry, dict) or not entry or any(
        value not in {**axes, SEED_KEY: seeds}.get(axis, []) for axis, value in entry.items()):
      raise config_lib.ConfigError(f"sweep: exclude: {entry!r}: give {{axis: value}} with values "
                                   "of the sweep's axes")
  return [dict(entry) for entry in exclude]


def _pairs(axes: dict[str, list], pairs) -> list[list]:
  """The sweep's `pairs` as [A, B] lists, checked."""
  axis = stats.activation_axis({"axes": axes})
  out = []
  for pair in pairs:
    pair = list(pair) if isinstance(pair, (list, tuple)) else [pair]
    if len(pair) != 2 or pair[0] == pair[1] or any(v not in axes.get(axis, []) for v in pair):
      raise config_lib.ConfigError(f"sweep: pairs: {pair!r} is not two different values of the "
                                   f"activation axis {axis!r}")
    if pair in out or pair[::-1] in out:
      raise config_lib.ConfigError(f"sweep: pairs: {pair!r} is given twice")
    out.append(pair)
  return out


def with_flags(sweep: Sweep, base: ml_collections.ConfigDict,
               overridden: Sequence[str]) -> tuple[Sweep, list[str]]:
  """`sweep` with the `--config.<key>=` flags (`overridden`) winning over its fixed values, and a
  line for each value they change; a flag for a key the sweep varies is refused."""
  by_value = {k for values in sweep.fixed_by.values() for o in values.values() for k in o}
  for key in overridden:
    if key in sweep.axes or key == SEED_KEY or key in by_value:
      axis = ("its seeds" if key == SEED_KEY else f"its axis {key!r}" if key in sweep.axes
              else "per value of an axis: fixed_by")
      raise config_lib.ConfigError(f"--config.{key}: the sweep varies {key} ({axis}); drop the "
                                   "flag, or the axis from the sweep file")
  values = workdir_lib.dotted(base.to_dict())
  flagged = {k: values[k] for k in overridden if k in sweep.fixed}
  lines = [f"sweep: --config.{k}={fmt_value(v)} replaces the sweep's fixed "
           f"{k}={fmt_value(sweep.fixed[k])}" for k, v in flagged.items() if v != sweep.fixed[k]]
  return dataclasses.replace(sweep, fixed={**sweep.fixed, **flagged}), lines


def cells(base: ml_collections.ConfigDict, sweep: Sweep) -> list[Cell]:
  """The grid, in order; each cell's config is validated before anything runs."""
  keys = [*sweep.axes, SEED_KEY]
  last = [k.rsplit(".", 1)[-1] for k in keys]  # optim.lr → lr, where no other key ends in lr
  short = {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}
  out = []
  for values in itertools.product(*sweep.axes.values(), sweep.seeds):
    overrides = dict(zip(keys, values))
    if any(all(overrides[k] == v for k, v in entry.items()) for entry in sweep.exclude):
      continue
    name = ",".join(f"{short[k]}={fmt_value(v)}" for k, v in overrides.items())
    by_value = {field: value for axis, v in overrides.items()
                for field, value in sweep.fixed_by.get(axis, {}).get(v, {}).items()}
    fields = {k: v for k, v in overrides.items() if k != ARM_KEY}
    try:
      config = config_lib.override(base.copy_and_resolve_references(),
                                   {**sweep.fixed, **by_value, **fields})
      config_lib.validate(config)
    except config_lib.ConfigError as e:
      raise config_lib.ConfigError(f"sweep cell {name}: {e}") from None
    out.append(Cell(name, overrides, config))
  if len({c.name for c in out}) != len(out):
    raise config_lib.ConfigError("sweep: two cells get the same workdir name; use values that "
                                 "differ in their first 6 significant digits")
  return out


def parse_shard(spec: str) -> tuple[int, int]:
  """`--shard=i/N` → (i, N); a UserError unless 0 <= i < N."""
  try:
    i, n = map(int, spec.split("/"))
  except ValueError:
    i = n = 0
  if not 0 <= i < n:
    raise errors.UserError(f"--shard={spec}: give i/N, shard i of N with 0 <= i < N (e.g. "
                           "--shard=0/4, or $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)")
  return i, n


def write_manifest(workdir: pathlib.Path, spec: str, sweep: Sweep, cells_: Sequence[Cell]) -> None:
  """`sweep.json`: the grid and its cells' configs (shared `config`, each cell's other fields)."""
  recorded = lambda c: workdir_lib.dotted(workdir_lib.recorded_paths(json.loads(c.to_json()),
                                                                      workdir))
  identities = {c.name: {k: v for k, v in recorded(c.config).items()
                         if not k.startswith(config_lib.RUNTIME_FIELDS)} for c in cells_}
  first = next(iter(identities.values()), {})
  shared = {k: v for k, v in first.items() if all(i.get(k) == v for i in identities.values())}
  listed = [{"name": c.name, "overrides": c.overrides} for c in cells_]
  manifest = json.loads(json.dumps({  # As it reads back: JSON's keys are strings.
      "sweep": spec, **dataclasses.asdict(sweep), "cells": listed, "config": _nested(shared),
      "cell_configs": {name: {k: v for k, v in i.items() if k not in shared}
                       for name, i in identities.items()}}))
  check_manifest(workdir, manifest)
  workdir.mkdir(parents=True, exist_ok=True)
  workdir_lib.write_json(workdir / "sweep.json", manifest)


def check_manifest(workdir: pathlib.Path, manifest: dict) -> None:
  """Refuses a sweep whose `manifest` differs from the sweep.json in `workdir` but at runtime."""
  path = workdir / "sweep.json"
  if not path.exists():
    return
  old = workdir_lib.read_json(path)
  if old is None:
    raise errors.UserError(f"{path} is unreadable; move it aside only if you know which sweep "
                           "this directory holds, or give this sweep a new --workdir")
  diffs = list({d.partition(": ")[0]: d for d in manifest_diffs(old, manifest)}.values())
  if diffs:
    raise errors.UserError(f"--workdir {workdir} holds another sweep "
                           f"({workdir_lib.first_diffs(diffs)}); rerun the command that started it "
                           "(its --sweep, --config and flags) to resume it, or give this sweep a "
                           "new --workdir")


def manifest_diffs(old: dict, new: dict) -> list[str]:
  """How the sweep.json `new` differs from `old`, as "key: old → new" (not at runtime)."""
  short = lambda v: (r if len(r := repr(v)) <= 40 else r[:39] + "…")
  at = lambda d, k: short(d[k]) if k in d else "<absent>"
  out = []
  if _spec_name(old.get("sweep", "")) != _spec_name(new["sweep"]):
    out.append(f"sweep: {old.get('sweep')} → {new['sweep']}")
  defaults, absent = dataclasses.asdict(parse({})), object()
  # A fixed field the config gained after `old` was written had its added value there.
  added = {f"{section}.{field}": v for (section, field), v in workdir_lib.ADDED_FIELDS.items()}
  for key in KEYS:
    a, b = old.get(key, defaults[key]), new[key]
    if key in ("axes", "fixed"):  # The fixed fields named as the cells' configs name them.
      was = {**added, **a} if key == "fixed" else a
      out += [f"{'axes.' * (key == 'axes')}{k}: {at(a, k)} → {at(b, k)}" for k in {**a, **b}
              if was.get(k, absent) != b.get(k, absent)
              and not (key == "fixed" and k.startswith(config_lib.RUNTIME_FIELDS))]
    elif a != b:
      out.append(f"{key}: {short(a)} → {short(b)}")
  if "config" in old:
    config = lambda m, cell: {**workdir_lib.dotted(m["config"]), **m["cell_configs"][cell]}
    out += [d for cell in new["cell_configs"] if cell in old.get("cell_configs", {})
            for d in config_lib.identity_diffs(config(old, cell), config(new, cell))]
  return out


def _spec_name(spec: str) -> str:
  """A sweep's `path/to/sweep.py[:arg]` as `sweep.py[:arg]`: the same file from any directory."""
  path, colon, arg = spec.partition(":")
  return pathlib.PurePath(path).name + colon + arg


def _nested(fields: dict) -> dict:
  """{"section.field": value} as {"section": {"field": value}}."""
  out = {}
  for key, value in fields.items():
    *sections, field = key.split(".")
    node = out
    for section in sections:
      node = node.setdefault(section, {})
    node[field] = value
  return out

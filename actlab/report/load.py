"""Reads sweep directories into one manifest and its runs for `actlab.report`; how several
merge (`load_many`): docs/metrics.md §9, "Several sweeps"."""

import json
import pathlib
from typing import Sequence

from actlab import config as config_lib, core
from actlab.infra import workdir
from actlab.infra.errors import UserError
from actlab.report.stats import LR_KEY, Run, SEED_KEY

_COMPLETE = {"done": 0, "incomplete": 1, "missing": 2}


def _order(value):
  """Numbers in numeric order, then everything else as text."""
  number = isinstance(value, (int, float)) and not isinstance(value, bool)
  return (0, value, "") if number else (1, 0, str(value))


def _configs(root: pathlib.Path) -> dict[str, dict]:
  """Cell name -> its config.json (nested), for the cells that have a readable one."""
  return {p.parent.name: c for p in sorted(root.glob("*/config.json"))
          if (c := workdir.read_json(p)) is not None}


# The block's fields a report names (`config.BLOCK_FIELDS`) at their defaults, GPT-2's block.
GPT2_BLOCK = {f"model.{k}": getattr(core.Spec, k) for k in config_lib.BLOCK_FIELDS}


def block(roots: Sequence) -> dict:
  """The block fields every run of the sweep directories `roots` sets alike, not as GPT-2's."""
  seen: dict[str, set] = {}
  for root in roots:
    for config in _configs(pathlib.Path(root)).values():
      fields = workdir.dotted(workdir.with_added_fields(config))
      for key in GPT2_BLOCK:
        seen.setdefault(key, set()).add(json.dumps(fields.get(key)))
  alike = {key: json.loads(next(iter(v))) for key, v in seen.items() if len(v) == 1}
  return {key: value for key, value in alike.items() if value != GPT2_BLOCK[key]}


def load(root) -> tuple[dict, list[Run]]:
  """The sweep manifest (or one inferred from the cell configs) and every cell's Run."""
  root = pathlib.Path(root)
  manifest = workdir.read_json(root / "sweep.json")
  if manifest is None:
    configs = {n: workdir.dotted(c) for n, c in _configs(root).items()}
    if not configs:
      what = "does not exist" if not root.exists() else "has no sweep.json and no */config.json"
      raise UserError(f"{root} {what}: not a sweep directory (the --workdir of actlab.sweep)")
    keys = sorted({k for c in configs.values() for k in c})
    axes = [k for k in keys if k != SEED_KEY
            and len({json.dumps(c.get(k)) for c in configs.values()}) > 1]
    values = lambda k: sorted({c.get(k) for c in configs.values()}, key=_order)
    manifest = {"sweep": str(root), "description": "", "seeds": values(SEED_KEY),
                "axes": {k: values(k) for k in axes},
                "cells": [{"name": n, "overrides": {k: c.get(k) for k in [*axes, SEED_KEY]}}
                          for n, c in configs.items()]}
  runs = []
  for cell in manifest["cells"]:
    d = root / cell["name"]
    rows, torn = workdir.read_rows(d / "metrics.jsonl")
    unreadable = [f"{torn} unreadable line(s) in metrics.jsonl"] if torn else []
    summary = workdir.read_summary(d, warn=False)
    if summary is None and (d / "summary.json").exists():
      unreadable.append("summary.json unreadable")
    state = "done" if summary is not None else "incomplete" if rows else "missing"
    runs.append(Run(cell["name"], cell["overrides"], state, summary or {}, rows, unreadable))
  return manifest, runs


def _check_mergeable(roots, configs: list[dict[str, dict]], axes: Sequence[str]) -> None:
  """Refuses directories whose runs differ in a field that is neither an axis nor runtime."""
  reps = [(root, {**workdir.dotted(next(iter(c.values()))), **dict.fromkeys([*axes, SEED_KEY])})
          for root, c in zip(roots, configs) if c]
  first, first_rep = reps[0]
  for root, rep in reps[1:]:
    diffs = config_lib.identity_diffs(first_rep, rep)
    if diffs:
      field = diffs[0].split(":")[0]
      raise UserError(f"cannot merge {first} and {root}: their runs differ in {diffs[0]}, which "
                      f"neither sweeps as an axis; report them separately, or compare them along "
                      f"it with --axis={field}")


def load_many(roots: Sequence, also: Sequence[str] = ()) -> tuple[dict, list[Run], list[str]]:
  """The merged manifest, runs, and names of the runs held twice (counted once); `also`: fields
  the directories fix at different values."""
  roots = [pathlib.Path(r) for r in roots]
  loaded = [load(r) for r in roots]
  if len(roots) == 1:
    return (*loaded[0], [])
  manifests = [m for m, _ in loaded]
  configs = [_configs(r) for r in roots]
  axes = list(dict.fromkeys([*(k for m in manifests for k in m["axes"]), *also]))
  _check_mergeable(roots, configs, axes)
  merged: dict[tuple, Run] = {}
  duplicates = []
  for root, (manifest, runs), cfgs in zip(roots, loaded, configs):
    fixed = workdir.dotted(next(iter(cfgs.values()), {}))  # the sweep's values of other axes
    fixed.update(manifest.get("fixed", {}))
    for run in runs:
      own = workdir.dotted(cfgs.get(run.name, {}))
      overrides = {k: run.overrides[k] if k in run.overrides else own.get(k, fixed.get(k))
                   for k in [*axes, SEED_KEY]}
      run = Run(f"{root.name}/{run.name}", overrides, run.state, run.summary, run.rows,
                run.unreadable)
      key = tuple(json.dumps(overrides[k]) for k in [*axes, SEED_KEY])
      if key in merged:
        duplicates.append(run.name)
        if _COMPLETE[run.state] >= _COMPLETE[merged[key].state]:
          continue
      merged[key] = run
  runs = list(merged.values())
  values = lambda k: list(dict.fromkeys(r.overrides[k] for r in runs))
  margins = {m["equivalence_margin"] for m in manifests if m.get("equivalence_margin")}
  if len(margins) > 1:
    raise UserError(f"cannot merge {', '.join(map(str, roots))}: their sweep files state "
                    f"different equivalence margins {sorted(margins)}; report them separately")
  pairs = []
  for a, b in (p for m in manifests for p in m.get("pairs") or []):
    if [a, b] not in pairs and [b, a] not in pairs:
      pairs.append([a, b])
  first_set = lambda field, default: next((m[field] for m in manifests if m.get(field)), default)
  manifest = {
      "sweep": " + ".join(m["sweep"] for m in manifests),
      "description": first_set("description", ""), "seeds": sorted(values(SEED_KEY), key=_order),
      "axes": {k: sorted(values(k), key=_order) if k == LR_KEY else list(dict.fromkeys(
          [*(v for m in manifests for v in m["axes"].get(k, [])), *values(k)])) for k in axes},
      "baseline": first_set("baseline", None), "pairs": pairs,
      "equivalence_margin": next(iter(margins), None),
  }
  return manifest, runs, duplicates

"""A field of the core's dataclasses (`Spec`, `Execution`, `OptimSpec`) with what a config needs
of it, written with the field once: its default, the rule its values keep, its help text and its
marks (`option`, `choice`, `MARKS`). The config's `model` and `optim` sections are these fields
(actlab/config/schema.py), checked by these rules and listed with this help
(`python -m actlab.config`); the harness's sections are written the same way. A rule is
`(key, value) -> None` and raises ValueError with one line that names the key and says what to
fix (`check`).
"""

import dataclasses
from typing import Any, Callable

from actlab.core import activations

Rule = Callable[[str, Any], None]

# What a field is, marked where it is written (`option(..., init_from="refuse")`), each mark one of
# its values; every list of fields derives from them (config/schema.py, `marked`): `block`, the
# block's "form" (GPT-2's or the LLaMA-style; the encoder keeps GPT-2's) or an "option" any block
# takes; `init_from`, another value in the run started from is refused, or said in the first line;
# `runtime`, how or where a run executes, not what it computes: in its compiled programs, or not.
MARKS = {"block": ("form", "option"), "init_from": ("refuse", "say"),
         "runtime": ("program", "harness")}


def option(default, rule: Rule | None = None, help: str = "", **marks):
  """A field: its default, the rule its values keep (None: any value of its type), its help and
  its `MARKS`."""
  assert all(v in MARKS.get(k, ()) for k, v in marks.items()), marks
  return dataclasses.field(default=default, metadata={"rule": rule, "help": help, **marks})


def choice(*values: str, help: str = "", **marks):
  """A field that takes one of `values`, the first its default."""
  field = option(values[0], one_of(*values), help, **marks)
  return dataclasses.field(default=field.default, metadata={**field.metadata, "choices": values})


def check(ok: bool, message: str, error: type[Exception] = ValueError) -> None:
  if not ok:
    raise error(message)


def choices(names) -> str:  # "'a', 'b', 'c'"
  return ", ".join(repr(n) for n in names)


def positive(k, v):
  check(v > 0, f"{k}={v} must be positive")


def boolean(k, v):
  check(isinstance(v, bool), f"{k}={v!r} must be true or false")


def auto_or_boolean(k, v):
  """"auto", "true" or "false" (in any case), or a bool: what the field held before "auto"."""
  check(str(v).lower() in ("auto", "true", "false"),
        f"{k}={v!r}: choose 'auto', 'true' or 'false'")


def non_negative(zero: str = "") -> Rule:
  """>= 0; `zero` says what 0 means, where it means something."""
  return lambda k, v: check(v >= 0, f"{k}={v} must be >= 0{zero}")


def within(low, high, ends: str = "[)", note: str = "") -> Rule:
  """In the interval from `low` to `high`, each end closed or open as `ends` says."""
  above = (lambda v: v >= low) if ends[0] == "[" else (lambda v: v > low)
  below = (lambda v: v <= high) if ends[1] == "]" else (lambda v: v < high)
  return lambda k, v: check(above(v) and below(v),
                            f"{k}={v} must be in {ends[0]}{low}, {high}{ends[1]}{note}")


def at_least(n) -> Rule:
  return lambda k, v: check(v >= n, f"{k}={v} must be at least {n}")


def text(what: str) -> Rule:
  return lambda k, v: check(isinstance(v, str), f"{k} must be {what}")


def listed(options) -> Rule:
  """One of a registry's names (`options`)."""
  return lambda k, v: check(v in options, f"{k}={v!r}: choose one of {choices(options)}")


def one_of(*options) -> Rule:
  return lambda k, v: check(v in options,
                            f"{k}={v!r}: choose {choices(options[:-1])} or {options[-1]!r}")


def parsed(parse: Callable) -> Rule:
  """A value `parse` takes; its ValueError names the key."""
  def rule(k, v):
    try:
      parse(v)
    except ValueError as e:
      raise ValueError(f"{k}: {e}") from None
  return rule


def activation_name(plain: bool = False) -> Rule:
  """An activation name of `activations` (with `plain`, not a gated one)."""
  def rule(k, v):
    parsed(activations.get)(k, v)
    check(not (activations.get(v).gated and plain),
          f"{k}={v!r} is gated; the pooler takes a plain activation (tanh, gelu, identity, ...)")
  return rule

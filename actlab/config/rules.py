"""The rules a config field's value keeps: each is a check `(key, value) -> None` that raises
`ConfigError` with one readable line saying what to fix (schema.py gives a field its rule)."""

from typing import Callable

from actlab.core import activations
from actlab.infra import errors


class ConfigError(errors.UserError, ValueError):
  """An inconsistent or invalid config; the message says what to fix."""


def choices(names) -> str:  # "'a', 'b', 'c'"
  return ", ".join(repr(n) for n in names)


def check(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def parsed(key: str, parse: Callable, value):
  """`parse(value)`, its ValueError raised as a ConfigError about `key`."""
  try:
    return parse(value)
  except ValueError as e:
    raise ConfigError(f"{key}: {e}") from None


def positive(k, v):
  check(v > 0, f"{k}={v} must be positive")


def boolean(k, v):
  check(isinstance(v, bool), f"{k}={v!r} must be true or false")


def non_negative(zero: str = ""):
  """>= 0; `zero` says what 0 means, where it means something."""
  return lambda k, v: check(v >= 0, f"{k}={v} must be >= 0{zero}")


def within(low, high, ends: str = "[)", note: str = ""):
  """In the interval from `low` to `high`, each end closed or open as `ends` says."""
  above = (lambda v: v >= low) if ends[0] == "[" else (lambda v: v > low)
  below = (lambda v: v <= high) if ends[1] == "]" else (lambda v: v < high)
  return lambda k, v: check(above(v) and below(v),
                            f"{k}={v} must be in {ends[0]}{low}, {high}{ends[1]}{note}")


def at_least(n):
  return lambda k, v: check(v >= n, f"{k}={v} must be at least {n}")


def text(what: str):
  return lambda k, v: check(isinstance(v, str), f"{k} must be {what}")


def listed(options):
  """One of a registry's names (`options`)."""
  return lambda k, v: check(v in options, f"{k}={v!r}: choose one of {choices(options)}")


def one_of(*options):
  return lambda k, v: check(v in options,
                            f"{k}={v!r}: choose {choices(options[:-1])} or {options[-1]!r}")


def activation_name(plain: bool = False):
  """An activation name of `core.activations` (with `plain`, not a gated one)."""
  def rule(k, v):
    check(not (parsed(k, activations.get, v).gated and plain),
          f"{k}={v!r} is gated; the pooler takes a plain activation (tanh, gelu, identity, ...)")
  return rule

"""`ConfigError`, the one-line error of a config. The rules a field's values keep are written with
the field (actlab/core/options.py: `positive`, `one_of`, `within`, ..., and `check`) and raise
ValueError; `validate` raises each as a `ConfigError`."""

from typing import Callable

from actlab.core.options import choices
from actlab.infra import errors

__all__ = ["ConfigError", "choices", "parsed"]


class ConfigError(errors.UserError, ValueError):
  """An inconsistent or invalid config; the message says what to fix."""


def parsed(key: str, parse: Callable, value):
  """`parse(value)`, its ValueError raised as a ConfigError about `key`."""
  try:
    return parse(value)
  except ValueError as e:
    raise ConfigError(f"{key}: {e}") from None

"""`ConfigError`, the one-line error of a config, and its checks. The rules a field's values keep
are written with the field (actlab/core/options.py: `positive`, `one_of`, `within`, ...);
schema.py makes each raise a `ConfigError`."""

from typing import Callable

from actlab.core.options import choices
from actlab.infra import errors

__all__ = ["ConfigError", "check", "choices", "parsed"]


class ConfigError(errors.UserError, ValueError):
  """An inconsistent or invalid config; the message says what to fix."""


def check(ok: bool, message: str) -> None:
  if not ok:
    raise ConfigError(message)


def parsed(key: str, parse: Callable, value):
  """`parse(value)`, its ValueError raised as a ConfigError about `key`."""
  try:
    return parse(value)
  except ValueError as e:
    raise ConfigError(f"{key}: {e}") from None

"""User-facing errors: one readable line on stderr and a non-zero exit, no traceback wall."""

import contextlib
import sys


class UserError(Exception):
  """An error whose message tells the user what to fix (config, data, workdir, checkpoint)."""
  exit_code = 2


@contextlib.contextmanager
def reported():
  """Turns a UserError into `error: <message>` on stderr and its exit code."""
  try:
    yield
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(e.exit_code)

"""Orbax `CheckpointManager` wrapper: save every N steps, keep the last K, restore the latest.

Orbax writes each checkpoint to a temporary directory and renames it when complete, and prunes
old ones only after a new one is finalised, so a crash mid-save never costs a good checkpoint.
"""

import jax
import orbax.checkpoint as ocp

from actlab.errors import UserError


class CheckpointError(UserError):
  """A checkpoint exists but cannot be restored; the message says what to do."""


class Checkpoints:
  def __init__(self, directory, keep: int):
    self.directory = directory
    self._manager = ocp.CheckpointManager(
        directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def save(self, step: int, state) -> None:
    """Starts an asynchronous save (device → host copy happens before this returns)."""
    self._manager.save(step, args=ocp.args.StandardSave(state), force=True)

  def restore(self, step: int, like):
    """Restores checkpoint `step` into the structure, shapes and shardings of `like`."""
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    try:
      return self._manager.restore(step, args=ocp.args.StandardRestore(abstract))
    except Exception as e:  # Orbax raises many types for truncated or mismatched data.
      older = [s for s in self._manager.all_steps() if s < step]
      hint = (f"move it aside to resume from step {max(older)}" if older
              else "use a fresh --workdir to start over")
      reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
      raise CheckpointError(
          f"checkpoint {self.directory}/{step} could not be restored ({reason[:300]}); "
          f"{hint}. Nothing was deleted.") from e

  def close(self) -> None:
    self._manager.wait_until_finished()
    self._manager.close()

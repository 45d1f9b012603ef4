"""Orbax checkpoints that know whether they are intact: each `<dir>/<step>/` holds the train
`state` and a JSON `meta` with a checksum per array (docs/design.md §3.9). Orbax is imported at
first use, not at a run's start."""

import copy
import functools
import gc
import pathlib
import sys
import warnings
from typing import Any

import jax
import jax.numpy as jnp

from actlab.infra.errors import UserError, short_cause


class CheckpointError(UserError):
  """No checkpoint can be restored; the message says what to do."""


def _root_cause(e: BaseException) -> str:
  """The error at the end of `e`'s chain (TensorStore's, not Orbax's dump of its spec), short."""
  while e.__cause__ is not None:
    e = e.__cause__
  return short_cause(e, limit=300)


@jax.jit
def sums(tree) -> list[jax.Array]:
  """Two wrapping uint32 sums per array, of its words and of each word times its position."""
  out = []
  for x in jax.tree.leaves(tree):
    if jnp.issubdtype(x.dtype, jax.dtypes.prng_key):
      x = jax.random.key_data(x)
    if x.dtype.itemsize == 4:
      words = jax.lax.bitcast_convert_type(x, jnp.uint32)
    elif x.dtype.itemsize == 2:
      words = jax.lax.bitcast_convert_type(x, jnp.uint16).astype(jnp.uint32)
    else:
      words = x.astype(jnp.uint32)
    words = words.reshape(-1)
    position = jnp.arange(1, words.size + 1, dtype=jnp.uint32)
    out.append(jnp.stack([words.sum(dtype=jnp.uint32), (words * position).sum(dtype=jnp.uint32)]))
  return out


_compiled: dict = {}  # a tree's abstract arrays -> `sums` compiled for trees like it


def _signature(tree) -> tuple:
  """A tree's structure, shapes, dtypes (as JAX holds them) and shardings."""
  return jax.tree.structure(tree), tuple(
      (x.shape, jax.dtypes.canonicalize_dtype(x.dtype), getattr(x, "sharding", None))
      for x in jax.tree.leaves(tree))


def use_compiled(like, compiled) -> None:
  """`checksums` of trees like `like` run `compiled`, `sums` compiled ahead for them."""
  _compiled[_signature(like)] = compiled


def checksums(tree) -> dict[str, str]:
  """{path of each array: its checksum as 16 hex digits} (`sums`)."""
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(tree)[0]]
  program = _compiled.get(_signature(tree), sums)
  return {p: f"{int(a):08x}{int(b):08x}" for p, (a, b) in zip(paths, jax.device_get(program(tree)))}


class Checkpoints:
  """A run's checkpoint directory, closed at the end of a `with` block; `read_only`: nothing is
  created, moved or written."""

  def __init__(self, directory, keep: int, read_only: bool = False):
    self.directory = pathlib.Path(directory).absolute()
    self.read_only, self.keep = read_only, keep
    self._failed = False  # a restore or a save failed: its tasks are freed at the close

  @functools.cached_property
  def _manager(self):
    """Orbax's manager of the directory, made on first use."""
    import orbax.checkpoint as ocp
    options = (ocp.CheckpointManagerOptions(read_only=True, create=False, max_to_keep=None,
                                            save_interval_steps=0) if self.read_only else
               ocp.CheckpointManagerOptions(max_to_keep=self.keep, create=True))
    return ocp.CheckpointManager(self.directory, item_names=("state", "meta"), options=options)

  def latest_step(self) -> int | None:
    return self._manager.latest_step() if self.directory.is_dir() else None

  def save(self, step: int, state, meta: dict) -> None:
    """Starts an asynchronous save of `state`, and of a copy of `meta` with its checksums."""
    import orbax.checkpoint as ocp
    meta = {**copy.deepcopy(meta), "checksums": checksums(state)}
    self._manager.save(step, args=ocp.args.Composite(
        state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta)), force=True)

  def restore(self, step: int, like) -> tuple[Any, dict]:
    """Checkpoint `step`, shaped and sharded as `like`, and its meta; a CheckpointError if it
    cannot be read or does not match its checksums."""
    import orbax.checkpoint as ocp
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
    try:
      restored = self._manager.restore(step, args=ocp.args.Composite(
          state=ocp.args.StandardRestore(abstract), meta=ocp.args.JsonRestore()))
    except Exception as e:  # Orbax raises many types for truncated or mismatched data.
      self._failed = True
      if (self.directory / str(step) / "default").is_dir():
        raise CheckpointError(f"checkpoint {self.directory}/{step} was written by an older actlab "
                              "without checksums; resume it with that version, or start a fresh "
                              "--workdir") from None
      raise CheckpointError(f"checkpoint {self.directory}/{step} could not be read "
                            f"({_root_cause(e)})") from None
    expected = restored.meta.get("checksums") if isinstance(restored.meta, dict) else None
    actual = checksums(restored.state)
    if expected != actual:
      bad = [p for p in actual if (expected or {}).get(p) != actual[p]]
      raise CheckpointError(f"checkpoint {self.directory}/{step} does not match its checksums "
                            f"({len(bad)} of {len(actual)} arrays differ, first {bad[0]})")
    return restored.state, restored.meta

  def restore_latest(self, like) -> tuple[int, Any, dict] | None:
    """(step, state, meta) of the newest intact checkpoint, or None; newer broken ones are named
    on stderr and, unless `read_only`, moved aside."""
    if not self.directory.is_dir():  # A new run: nothing to restore, and no Orbax to import yet.
      return None
    failed = []
    for step in sorted(self._manager.all_steps(), reverse=True):
      try:
        state, meta = self.restore(step, like)
      except CheckpointError as e:
        failed.append((step, str(e)))
        continue
      for bad, why in failed:
        where = "" if self.read_only else f"; moved aside to {self._move_aside(bad)}"
        print(f"actlab: {why}{where}; using step {step}", file=sys.stderr)
      return step, state, meta
    if failed:
      raise CheckpointError(
          "no checkpoint can be restored: " + "; ".join(why for _, why in failed)
          + ". Nothing was moved or deleted; start a fresh --workdir (or restore the files)")
    return None

  def _move_aside(self, step: int) -> pathlib.Path:
    """Moves checkpoint `step` to `<dir>.corrupt/<step>[-n]` and returns where."""
    root = self.directory.with_name(self.directory.name + ".corrupt")
    root.mkdir(exist_ok=True)
    dest, n = root / str(step), 1
    while dest.exists():
      dest, n = root / f"{step}-{n}", n + 1
    (self.directory / str(step)).rename(dest)
    self._manager.reload()
    return dest

  def close(self) -> None:
    try:
      if "_manager" in self.__dict__:  # Opened (`cached_property` keeps it there).
        self._manager.wait_until_finished()
        self._manager.close()
    except BaseException:
      self._failed = True
      raise
    finally:
      if self._failed:
        # Frees the failed tasks now, without "coroutine ... was never awaited" warnings.
        with warnings.catch_warnings():
          warnings.simplefilter("ignore")
          gc.collect()

  def __enter__(self) -> "Checkpoints":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

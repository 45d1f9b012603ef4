"""Train state, the pure `train_step` / `eval_step`, and the loop (logging, eval, checkpoints)."""

import concurrent.futures
import dataclasses
import json
import pathlib
import signal
import time
from typing import Any

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm

from actlab import config as config_lib
from actlab import data, models, objectives, optim
from actlab.checkpoint import Checkpoints
from actlab.errors import UserError


class WorkdirError(UserError):
  """The workdir holds a different run; the message lists what differs."""


@flax.struct.dataclass
class TrainState:
  step: jax.Array       # completed optimizer steps
  params: Any
  opt_state: Any
  rng: jax.Array        # root key; the key of step k is fold_in(rng, k)


@dataclasses.dataclass(frozen=True)
class Task:
  """Everything the steps close over: the model, its objective and the optimizer."""
  model: flax.linen.Module
  tx: optax.GradientTransformation
  objective: Any
  config: ml_collections.ConfigDict

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, vocab_size: int) -> "Task":
    return cls(models.build(config.model, vocab_size), optim.make(config.optim, config.train.steps),
               objectives.get(config.model.kind), config)

  def init(self, seed) -> TrainState:
    """The initial state; `seed` may be traced, so one compiled init serves every seed."""
    root = jax.random.PRNGKey(seed)
    init_key, run_key = jax.random.split(root)
    tokens = jnp.zeros((1, self.config.data.seq_len), jnp.int32)
    params = self.model.init(init_key, tokens)["params"]
    return TrainState(jnp.zeros((), jnp.int32), params, self.tx.init(params), run_key)

  def train_step(self, state: TrainState, batch) -> tuple[TrainState, dict]:
    """One optimizer step; pure, so it runs under `jax.jit` with the state donated."""
    key = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      out = self.objective(self.model, params, batch, key, train=True)
      return out["loss_sum"] / out["count"], out

    (loss, _), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    updates, opt_state = self.tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    metrics = {
        "train_loss": loss,
        "lr": optim.learning_rate(self.config.optim, self.config.train.steps,
                                  state.opt_state, state.step),
        "grad_norm": optax.global_norm(grads),
        "update_norm": optax.global_norm(updates),
        "param_norm": optax.global_norm(params),
    }
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  def eval_step(self, params, batch) -> dict:
    """Loss sums over one validation batch (deterministic: no dropout)."""
    return self.objective(self.model, params, batch, jax.random.PRNGKey(0), train=False)


def evaluate(eval_step, params, batches) -> float:
  """Mean validation loss, pooled over all fixed validation windows."""
  outs = jax.device_get([eval_step(params, b) for b in batches])
  return float(sum(o["loss_sum"] for o in outs) / sum(o["count"] for o in outs))


def diff_configs(old: dict, new: dict, prefix: str = "") -> list[str]:
  """Human-readable differences between two nested config dicts."""
  out = []
  for key in sorted(set(old) | set(new)):
    a, b = old.get(key, "<absent>"), new.get(key, "<absent>")
    if isinstance(a, dict) and isinstance(b, dict):
      out += diff_configs(a, b, f"{prefix}{key}.")
    elif a != b:
      out.append(f"{prefix}{key}: {a!r} → {b!r}")
  return out


def prepare_workdir(workdir: pathlib.Path, config: ml_collections.ConfigDict) -> None:
  """Writes config.json, or checks that a used workdir holds the same config."""
  path = workdir / "config.json"
  new = json.loads(config.to_json())
  if path.exists():
    diffs = diff_configs(json.loads(path.read_text()), new)
    if diffs:
      raise WorkdirError(
          f"{workdir} holds a run with a different config ({'; '.join(diffs)}); "
          "rerun with the same config to resume, or choose another --workdir")
  else:
    workdir.mkdir(parents=True, exist_ok=True)
    path.write_text(config.to_json(indent=2) + "\n")


class MetricsLog:
  """metrics.jsonl: one JSON object per log step, truncated to the resumed step."""

  def __init__(self, path: pathlib.Path, resume_step: int):
    self.path = path
    rows = [json.loads(l) for l in path.read_text().splitlines()] if path.exists() else []
    self.rows = [r for r in rows if r["step"] <= resume_step]
    path.write_text("".join(json.dumps(r) + "\n" for r in self.rows))

  def write(self, row: dict) -> None:
    self.rows.append(row)
    with self.path.open("a") as f:
      f.write(json.dumps(row) + "\n")

  def val_losses(self) -> list[tuple[int, float]]:
    return [(r["step"], r["val_loss"]) for r in self.rows if "val_loss" in r]


class StopRequest:
  """SIGINT/SIGTERM set a flag the loop checks between steps (it then checkpoints and exits)."""

  def __init__(self):
    self.signum = None
    self._previous = {s: signal.signal(s, self._handle) for s in (signal.SIGINT, signal.SIGTERM)}

  def _handle(self, signum, frame):
    self.signum = signum

  def restore(self):
    for s, handler in self._previous.items():
      signal.signal(s, handler)


class Interrupted(UserError):
  """Raised after SIGINT/SIGTERM, once the checkpoint is written."""
  exit_code = 130


def run(config: ml_collections.ConfigDict, workdir) -> dict:
  """Trains (or resumes) the run of `config` in `workdir`; returns the summary."""
  config_lib.validate(config)
  workdir = pathlib.Path(workdir)
  dataset = data.load(config)
  prepare_workdir(workdir, config)
  task = Task.create(config, dataset.tokenizer.vocab_size)
  t = config.train

  state = jax.jit(task.init)(t.seed)
  checkpoints = Checkpoints((workdir / "checkpoints").absolute(), t.keep_checkpoints)
  start = checkpoints.latest_step() or 0
  if start:
    state = checkpoints.restore(start, state)
  counts = models.count_params(state.params)
  log = MetricsLog(workdir / "metrics.jsonl", start)

  train_step = jax.jit(task.train_step, donate_argnums=0)
  eval_step = jax.jit(task.eval_step)
  val_batches = dataset.val_batches()
  tokens_per_step = t.batch_size * config.data.seq_len

  if start == 0:
    log.write({"step": 0, "val_loss": evaluate(eval_step, state.params, val_batches)})
  print(f"actlab: {config.model.kind} {config.model.activation}, "
        f"{counts['non_embedding'] / 1e6:.2f}M parameters without the token embedding "
        f"({counts['total'] / 1e6:.2f}M total); {'resuming at step %d' % start if start else 'fresh run'}",
        flush=True)

  stop = StopRequest()
  prefetch = concurrent.futures.ThreadPoolExecutor(max_workers=1)
  fetch = lambda k: prefetch.submit(lambda: jax.device_put(dataset.train_batch(k)))
  bar = tqdm.tqdm(total=t.steps, initial=start, unit="step", disable=not t.progress,
                  dynamic_ncols=True)
  pending, rates, train_time = [], [], 0.0
  t0 = wall0 = time.perf_counter()
  next_batch = fetch(start)
  try:
    for step in range(start, t.steps):
      batch = next_batch.result()
      if step + 1 < t.steps:
        next_batch = fetch(step + 1)
      state, metrics = train_step(state, batch)
      pending.append(metrics)
      done = step + 1
      is_last = done == t.steps
      evaluate_now = done % t.eval_every == 0 or is_last
      if done % t.log_every == 0 or evaluate_now or stop.signum:
        rows = jax.device_get(pending)  # The only host sync of the loop: once per log step.
        elapsed = time.perf_counter() - t0
        train_time += elapsed
        rates.append(len(rows) * tokens_per_step / elapsed)
        row = {"step": done, **{k: float(v) for k, v in rows[-1].items()},
               "train_loss": float(np.mean([r["train_loss"] for r in rows])),
               "tokens_per_sec": rates[-1]}
        if evaluate_now:
          row["val_loss"] = evaluate(eval_step, state.params, val_batches)
        log.write(row)
        bar.set_postfix(loss=f"{row['train_loss']:.3f}", tok_s=f"{rates[-1]:,.0f}", refresh=False)
        bar.update(len(rows))
        pending = []
      if done % t.checkpoint_every == 0 or is_last or stop.signum:
        checkpoints.save(done, state)
      if stop.signum:
        raise Interrupted(f"stopped by signal {stop.signum} at step {done}; checkpoint saved; "
                          "rerun the same command to resume")
      if not pending:  # Restart the clock after host work (logging, eval, checkpoint).
        t0 = time.perf_counter()
  finally:
    bar.close()
    prefetch.shutdown(wait=True)
    checkpoints.close()
    stop.restore()

  val = log.val_losses()
  # Steady-state rate: the first interval includes compilation.
  steady = rates[1:] or rates
  summary = {
      "steps": t.steps,
      "final_val_loss": val[-1][1],
      "best_val_loss": min(v for _, v in val),
      "initial_val_loss": val[0][1],
      "wall_time_sec": time.perf_counter() - wall0,
      "train_time_sec": train_time,
      "tokens_per_sec": float(np.median(steady)) if steady else None,
      "params": counts["total"],
      "params_non_embedding": counts["non_embedding"],
  }
  (workdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
  return summary

"""Train state, the pure `train_step` / `eval_step`, and the loop (logging, eval, checkpoints).

`train_lanes` is the one training loop: `run` trains one run with it (`Compiled`), and
`vectorized.train_group` R runs stacked into one vmapped program (`vectorized.Group`)."""

import concurrent.futures
import contextlib
import dataclasses
import functools
import json
import pathlib
import signal
import time
from typing import Any, Callable

import flax
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import tqdm

from actlab import config as config_lib
from actlab import data, models, objectives, optim, parallel
from actlab import metrics as metrics_lib
from actlab import workdir as workdir_lib
from actlab.checkpoint import Checkpoints
from actlab.errors import UserError
from actlab.workdir import WorkdirError, logdir


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
               objectives.get(config, vocab_size), config)

  def init(self, seed, peak_lr=None) -> TrainState:
    """The initial state; `seed` and `peak_lr` (default `optim.lr`) may be traced, so one
    compiled init serves every seed and learning rate: the peak LR lives in the optimizer state."""
    root = jax.random.PRNGKey(seed)
    init_key, run_key = jax.random.split(root)
    tokens = jnp.zeros((1, self.config.data.seq_len), jnp.int32)
    params = self.model.init(init_key, tokens)["params"]
    opt_state = self.tx.init(params)
    if peak_lr is not None:
      opt_state = opt_state._replace(hyperparams={
          **opt_state.hyperparams, "peak_lr": jnp.asarray(peak_lr, jnp.float32)})
    return TrainState(jnp.zeros((), jnp.int32), params, opt_state, run_key)

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
        "grad_norm": optax.tree.norm(grads),
        "update_norm": optax.tree.norm(updates),
        "param_norm": optax.tree.norm(params),
    }
    return state.replace(step=state.step + 1, params=params, opt_state=opt_state), metrics

  def eval_step(self, params, batch, stats: bool = False) -> dict:
    """Loss sums over one validation batch (deterministic: no dropout). With `stats`, the model
    runs with its "stats" collection mutable and `out["stats"]` holds the batch's activation
    statistic sums (`metrics.batch_sums`)."""
    model = metrics_lib.Recording(self.model) if stats else self.model
    out = self.objective(model, params, batch, jax.random.PRNGKey(0), train=False)
    if stats:
      out["stats"] = metrics_lib.batch_sums(model.stats)
    return out

  def sharpness(self, params, batch) -> jax.Array:
    """Top Hessian eigenvalue of the training loss on `batch`, without dropout (metrics.py)."""
    def loss_fn(p):
      out = self.objective(self.model, p, batch, jax.random.PRNGKey(0), train=False)
      return out["loss_sum"] / out["count"]
    return metrics_lib.top_hessian_eigenvalue(loss_fn, params, jax.random.PRNGKey(1),
                                              self.config.metrics.sharpness_iters)


@dataclasses.dataclass(frozen=True)
class Compiled:
  """A Task's jitted functions, the program of a single run in `train_lanes`. Runs whose configs
  differ only in `optim.lr` and `train.seed` share one: both live in the train state, not in the
  compiled programs (see `compiled`)."""
  task: Task
  init: Callable        # (seed, peak_lr) -> TrainState
  train_step: Callable  # (state, batch) -> (state, metrics); donates the state
  eval_step: Callable   # (params, batch) -> loss sums (+ "stats" if metrics.act_stats)
  sharpness: Callable   # (params, batch) -> top Hessian eigenvalue
  plan: Any = None      # parallel.Plan: the mesh and where state and batches live

  @classmethod
  def create(cls, config: ml_collections.ConfigDict, vocab_size: int,
             plan: "parallel.Plan | None" = None) -> "Compiled":
    task = Task.create(config, vocab_size)
    # Explicit shardings (parallel.py): the batch split across the devices; the state replicated
    # (data parallel) or split (FSDP). On one device this is plain jit on that device.
    plan = plan or parallel.plan(config)
    state_sh = plan.state_shardings(jax.eval_shape(task.init, 0, 1.0))
    batch_sh = plan.batch_sharding(1)  # A prefix: every array of the batch, split on axis 0.
    return cls(task, jax.jit(task.init, out_shardings=state_sh),
               jax.jit(task.train_step, donate_argnums=0, in_shardings=(state_sh, batch_sh),
                       out_shardings=(state_sh, plan.replicated)),
               jax.jit(functools.partial(task.eval_step, stats=config.metrics.act_stats),
                       in_shardings=(state_sh.params, batch_sh)),
               jax.jit(task.sharpness, in_shardings=(state_sh.params, batch_sh)), plan)

  def shard_batches(self, batches: list) -> Any:
    """`train_lanes`' batch: the one run's host batch (a list of one) → devices."""
    (batch,) = batches
    return self.plan.shard_batch(batch)

  @staticmethod
  def unstack(tree: Any, r: int) -> Any:
    """`train_lanes`' lane r of a state or a result: all of it (one run, r = 0)."""
    return tree


def compile_key(config: ml_collections.ConfigDict, vocab_size: int) -> str:
  """The config as the compiled functions see it: everything but the peak LR, the seed and where
  the initial parameters come from (`train.init_from`)."""
  c = config.to_dict()
  c["optim"]["lr"] = c["train"]["seed"] = None
  c["train"].pop("init_from", None)
  return json.dumps({"config": c, "vocab_size": vocab_size}, sort_keys=True, default=str)


def compiled(config: ml_collections.ConfigDict, vocab_size: int,
             cache: dict | None = None) -> Compiled:
  """`Compiled.create`, reused from `cache` (a plain dict the caller owns) when a run with the
  same `compile_key` made one: a sweep passes one cache to all its runs."""
  if cache is None:
    return Compiled.create(config, vocab_size)
  key = compile_key(config, vocab_size)
  if key not in cache:
    cache[key] = Compiled.create(config, vocab_size)
  return cache[key]


def evaluate_metrics(eval_step, params, batches) -> dict[str, float]:
  """`val_loss`, pooled over all fixed validation windows, `val_accuracy` when the objective
  counts `correct` predictions (MLM, classification), and the activation statistics
  (`metrics.pool`) when `eval_step` returns them."""
  return pool_eval(jax.device_get([eval_step(params, b) for b in batches]))


def pool_eval(outs: list[dict]) -> dict[str, float]:
  """`evaluate_metrics` of the `eval_step` outputs of every validation batch, on the host."""
  count = sum(o["count"] for o in outs)
  result = {"val_loss": float(sum(o["loss_sum"] for o in outs) / count)}
  if "correct" in outs[0]:
    result["val_accuracy"] = float(sum(o["correct"] for o in outs) / count)
  if "stats" in outs[0]:
    result.update(metrics_lib.pool([o["stats"] for o in outs]))
  return result


def evaluate(eval_step, params, batches) -> float:
  """Mean validation loss, pooled over all fixed validation windows."""
  return evaluate_metrics(eval_step, params, batches)["val_loss"]


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


# Fields that must agree between a run and the run it is initialised from (`train.init_from`).
INIT_FROM_FIELDS = {"model": ("kind", "activation", "num_layers", "d_model", "num_heads", "d_ff",
                              "gated_match_params", "max_len", "vocab_size", "norm",
                              "type_vocab_size"),
                    "data": ("source", "tokenizer", "tinystories_version")}


def init_from_config(config: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
  """The config of the run `train.init_from` names; raises unless it is the same model and
  tokenizer and has a checkpoint (checked before the workdir is touched)."""
  source = pathlib.Path(config.train.init_from)
  old = workdir_lib.read_json(source / "config.json")
  if old is None:
    raise WorkdirError(f"train.init_from={str(source)!r} holds no run (no readable config.json); "
                       "train the model to start from there first (e.g. the :smoke MLM config)")
  diffs = [f"{section}.{k}: {old[section].get(k)!r} there, {config[section].get(k)!r} here"
           for section, keys in INIT_FROM_FIELDS.items() for k in keys
           if old[section].get(k) != config[section].get(k)]
  if diffs:
    raise WorkdirError(f"train.init_from={str(source)!r} is a different model or tokenizer: "
                       + "; ".join(diffs))
  old_config = ml_collections.ConfigDict(old)
  if Checkpoints(source / "checkpoints", 1, read_only=True).latest_step() is None:
    raise WorkdirError(f"train.init_from={str(source)!r} has no checkpoint yet")
  return old_config


def pretrained_params(config: ml_collections.ConfigDict, params, vocab_size: int):
  """`params` with every parameter that the latest intact checkpoint of the workdir
  `train.init_from` has under the same path and shape (for an MLM → classification run: the
  embeddings and blocks; the pooler and classifier keep their fresh initialisation, the MLM head
  is dropped)."""
  source = pathlib.Path(config.train.init_from)
  old_config = init_from_config(config)
  checkpoints = Checkpoints(source / "checkpoints", 1, read_only=True)
  try:
    like = jax.eval_shape(Task.create(old_config, vocab_size).init, 0, old_config.optim.lr)
    step, restored, _ = checkpoints.restore_latest(like)
  finally:
    checkpoints.close()
  flat_old = flax.traverse_util.flatten_dict(flax.core.unfreeze(restored.params))
  flat = flax.traverse_util.flatten_dict(flax.core.unfreeze(params))
  copied = [k for k, v in flat.items() if k in flat_old and flat_old[k].shape == v.shape]
  if not copied:
    raise WorkdirError(f"train.init_from={str(source)!r}: no parameter matches this model's")
  for k in copied:
    flat[k] = jax.device_put(flat_old[k], flat[k].sharding)
  fresh = sorted({k[0] for k in flat if k not in copied})
  print(f"actlab: initialised {len(copied)} of {len(flat)} parameter arrays from {source} "
        f"step {step}" + (f"; new: {', '.join(fresh)}" if fresh else ""), flush=True)
  return flax.traverse_util.unflatten_dict(flat)


class Interrupted(UserError):
  """Raised after SIGINT/SIGTERM, once the checkpoint is written; exits with 128 + signal."""

  def __init__(self, message: str, signum: int):
    super().__init__(message)
    self.exit_code = 128 + signum


def open_checkpoints(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> Checkpoints:
  """The run's checkpoints, written by all hosts together (Orbax)."""
  return Checkpoints(workdir / "checkpoints", config.train.keep_checkpoints)


def _host_rows(rows: list[dict]) -> list[dict]:
  """Per-step metrics as a checkpoint's JSON keeps them (float32 values are exact as floats)."""
  return [{k: float(v) for k, v in row.items()} for row in rows]


def _device_rows(rows: list[dict]) -> list[dict]:
  """`_host_rows` back as the float32 scalars the train step returns, so the means that include
  them are computed exactly as without the interruption."""
  return [{k: np.float32(v) for k, v in row.items()} for row in rows]


@dataclasses.dataclass
class Lane:
  """One run in `train_lanes`: its files and what its summary reports. Everything here but the
  files is kept in each checkpoint (`meta`), so a resumed lane continues where it stopped."""
  config: ml_collections.ConfigDict
  logdir: pathlib.Path
  dataset: Any            # the run's own training batches (its seed)
  checkpoints: Checkpoints
  log: workdir_lib.MetricsLog
  tb: metrics_lib.TensorBoard | None
  segments: list          # provenance.json: one entry per start of the run
  carried: list = dataclasses.field(default_factory=list)  # step metrics since the last row
  rates: list = dataclasses.field(default_factory=list)    # tokens/s of each logged interval
  train_time: float = 0.0
  diverged_at: int | None = None
  stopped: bool = False   # diverged and logged: no more rows, no more checkpoints

  @classmethod
  def open(cls, config: ml_collections.ConfigDict, workdir: pathlib.Path, dataset,
           ckpts: Checkpoints, start: int, meta: dict | None) -> "Lane":
    """The run of `config` in `workdir`, resuming at `start` with the restored checkpoint's
    `meta` (None for a fresh run)."""
    meta = meta or {}
    path = logdir(workdir)
    segments = workdir_lib.append_segment(path, workdir_lib.segment(config, start))
    return cls(config, path, dataset, ckpts,
               workdir_lib.MetricsLog(path / "metrics.jsonl", meta.get("rows", []), start),
               metrics_lib.TensorBoard(path / "tb", purge_step=start)
               if config.metrics.tensorboard else None,
               segments, _device_rows(meta.get("pending", [])), list(meta.get("rates", [])),
               meta.get("train_time", 0.0))

  def write(self, row: dict) -> None:
    row = metrics_lib.jsonable(row)
    self.log.write(row)
    if self.tb:
      self.tb.write(row)

  def save(self, step: int, state, pending: list[dict]) -> None:
    """Checkpoints `state` with the lane: its rows, the step metrics not yet in a row, rates."""
    self.checkpoints.save(step, state, {"rows": self.log.rows, "pending": _host_rows(pending),
                                        "rates": self.rates, "train_time": self.train_time})

  def close(self) -> None:
    try:
      self.checkpoints.close()  # Waits for the checkpoint being written (and raises its error).
    finally:
      if self.tb:
        self.tb.close()

  def finish(self, counts: dict, vocab_size: int, wall_time: float, runs: int) -> dict:
    """Writes summary.json (with `vectorized_runs` when `runs` > 1) and returns it."""
    steady = self.rates[1:] or self.rates  # Steady state: the first interval includes compilation.
    verdict = metrics_lib.verdict_for(self.log.rows, self.config, vocab_size)
    steps = self.config.train.steps
    summary = metrics_lib.jsonable({
        "status": verdict["status"],
        "status_reasons": verdict["reasons"],
        "diverged_at": self.diverged_at if self.diverged_at is not None else verdict["diverged_at"],
        "spike_steps": verdict["spike_steps"],
        "steps": steps,
        "last_step": self.log.rows[-1]["step"],
        **metrics_lib.summarize(self.log.rows, steps),
        "wall_time_sec": wall_time,
        "train_time_sec": self.train_time,
        "tokens_per_sec": float(np.median(steady)) if steady else None,
        "params": counts["total"],
        "params_non_embedding": counts["non_embedding"],
        "vocab_size": vocab_size,
        **({"vectorized_runs": runs} if runs > 1 else {}),
    })
    summary["provenance"] = self.segments
    workdir_lib.write_json(self.logdir / "summary.json", summary)
    return summary


def train_lanes(program, lanes: list[Lane], state, start: int, vocab_size: int) -> list[dict]:
  """The training loop: trains `lanes` from step `start` (all at the same step, with the same
  schedule) and writes and returns their summaries, in order.

  `program` is a `Compiled` (one lane) or a `vectorized.Group` (a lane per stacked run): its
  `train_step`, `eval_step` and `sharpness` act on `state` (all lanes at once), `shard_batches`
  puts one host batch per lane on the devices and `unstack(tree, r)` is lane r's part of a result.
  A lane that diverges stops being logged and checkpointed (see `run`); the others go on.
  SIGINT/SIGTERM: the step under way finishes, is checkpointed, and `Interrupted` says which.
  """
  config = lanes[0].config
  t, m = config.train, config.metrics
  plan = program.plan
  counts = models.count_params(program.unstack(state.params, 0))
  val_batches = [plan.shard_batch(b) for b in lanes[0].dataset.val_batches()]  # Placed once.
  # The sharpness batch: training batch 0 of seed 0, the same for every run of a sweep.
  sharpness_batch = (plan.shard_batch(dataclasses.replace(lanes[0].dataset, seed=0).train_batch(0))
                     if m.sharpness_every else None)
  tokens_per_step = t.batch_size * config.data.seq_len

  def evaluate(params) -> list[dict]:
    """Every lane's `evaluate_metrics`, from one pass over the validation set."""
    outs = jax.device_get([program.eval_step(params, b) for b in val_batches])
    return [pool_eval([program.unstack(o, r) for o in outs]) for r in range(len(lanes))]

  def sharpness(params):
    return jax.device_get(program.sharpness(params, sharpness_batch))

  if start == 0:
    evals = evaluate(state.params)
    sharp = sharpness(state.params) if m.sharpness_every else None
    for r, lane in enumerate(lanes):
      row = {"step": 0, **evals[r]}
      if sharp is not None:
        row["sharpness"] = float(program.unstack(sharp, r))
      lane.write(row)
  print(start_line(lanes, counts, start), flush=True)

  stop = StopRequest()
  prefetch = concurrent.futures.ThreadPoolExecutor(max_workers=1)
  # The next batch is built and sent to the devices (this host's rows only) while a step runs.
  fetch = lambda k: prefetch.submit(
      lambda: program.shard_batches([lane.dataset.train_batch(k) for lane in lanes]))
  bar = tqdm.tqdm(total=t.steps, initial=start, unit="step", dynamic_ncols=True,
                  disable=not t.progress or len(lanes) > 1)  # A bar for a single run.
  pending = []
  stopped_at = None  # the step a signal stopped the loop at
  t0 = wall0 = time.perf_counter()
  next_batch = fetch(start)
  try:
    for step in range(start, t.steps):
      batch = next_batch.result()
      if step + 1 < t.steps:
        next_batch = fetch(step + 1)
      state, metrics = program.train_step(state, batch)
      if plan.sync_each_step:  # simulated CPU devices: see parallel.Plan.sync_each_step
        jax.block_until_ready(metrics)
      pending.append(metrics)
      done = step + 1
      is_last = done == t.steps
      evaluate_now = done % t.eval_every == 0 or is_last
      sharpness_now = bool(m.sharpness_every) and done % m.sharpness_every == 0
      save_now = done % t.checkpoint_every == 0 or is_last or stop.signum
      log_now = done % t.log_every == 0 or evaluate_now or sharpness_now
      if not (log_now or save_now):
        continue
      fetched = jax.device_get(pending)  # The loop's only host sync: log and save steps.
      elapsed = time.perf_counter() - t0
      since_row, logged = {}, {}  # lane -> its step metrics since its last row; those to log now
      for r, lane in enumerate(lanes):
        if lane.stopped:
          continue
        rows = since_row[r] = lane.carried + [program.unstack(x, r) for x in fetched]
        bad = metrics_lib.first_nonfinite(rows)
        if bad is not None:  # Log the rows up to the first bad step, then stop.
          lane.diverged_at, logged[r] = done - len(rows) + bad + 1, rows[:bad + 1]
        elif log_now:
          logged[r] = rows
      healthy = any(lanes[r].diverged_at is None for r in logged)
      evals = evaluate(state.params) if evaluate_now and healthy else None
      sharp = sharpness(state.params) if sharpness_now and healthy else None
      for r, rows in logged.items():
        lane = lanes[r]
        lane.train_time += elapsed
        # Each run's rate as it experiences it: its tokens over the loop's wall time.
        lane.rates.append(len(fetched) * tokens_per_step / elapsed)
        row = {"step": lane.diverged_at or done, **{k: float(v) for k, v in rows[-1].items()},
               "train_loss": float(np.mean([x["train_loss"] for x in rows])),
               "tokens_per_sec": lane.rates[-1]}
        if evaluate_now and lane.diverged_at is None:
          row.update(evals[r])
          if not metrics_lib.finite(row["val_loss"]):
            lane.diverged_at = done
        if sharpness_now and lane.diverged_at is None:
          row["sharpness"] = float(program.unstack(sharp, r))
        lane.write(row)
        lane.carried = []
        bar.set_postfix(loss=f"{row['train_loss']:.3f}", tok_s=f"{lane.rates[-1]:,.0f}",
                        refresh=False)
        bar.update(len(fetched))
      if log_now:
        pending = []
      for r, lane in enumerate(lanes):
        if lane.diverged_at is not None:
          lane.stopped = True  # The last good checkpoint stays the latest one.
        elif save_now:
          lane.save(done, program.unstack(state, r), [] if log_now else since_row[r])
      if all(lane.stopped for lane in lanes):
        break
      if stop.signum:
        stopped_at = done
        break
      if not pending:  # Restart the clock after host work (logging, eval, checkpoint).
        t0 = time.perf_counter()
  finally:
    bar.close()
    prefetch.shutdown(wait=True)
    stop.restore()
    with contextlib.ExitStack() as closing:  # Every lane, whatever one of them raises.
      for lane in lanes:
        closing.callback(lane.close)

  if stopped_at is not None:
    saved = {lane.checkpoints.latest_step() for lane in lanes if not lane.stopped}
    what = (f"checkpoint of step {stopped_at} saved" if saved == {stopped_at}
            else f"latest checkpoints: {sorted(saved)}")
    raise Interrupted(f"stopped by signal {stop.signum} after step {stopped_at}; {what}; "
                      "rerun the same command to resume", stop.signum)
  wall_time = time.perf_counter() - wall0
  return [lane.finish(counts, vocab_size, wall_time, len(lanes)) for lane in lanes]


def start_line(lanes: list[Lane], counts: dict, start: int) -> str:
  """What `train_lanes` prints first: the model, its size, the runs and where they start."""
  c = lanes[0].config
  model = f"{c.model.kind} {c.model.activation}"
  size = (f"{counts['non_embedding'] / 1e6:.2f}M parameters without the token embedding "
          f"({counts['total'] / 1e6:.2f}M total)")
  resuming = f"resuming at step {start}" if start else None
  if len(lanes) == 1:
    return f"actlab: {model}, {size}; {resuming or 'fresh run'}"
  return (f"actlab: {len(lanes)} vectorized runs of {model}, {size}; "
          f"lr {', '.join(f'{l.config.optim.lr:g}' for l in lanes)}; "
          f"seeds {', '.join(str(l.config.train.seed) for l in lanes)}; {resuming or 'fresh runs'}")


def finished(config: ml_collections.ConfigDict, workdir: pathlib.Path) -> dict | None:
  """The summary of the run of `config` in `workdir` if it has ended (trained to the end or
  diverged), else None; raises if the workdir holds another run."""
  path = logdir(workdir)
  workdir_lib.check_config(path, config)
  return workdir_lib.read_summary(path)


def run(config: ml_collections.ConfigDict, workdir, cache: dict | None = None) -> dict:
  """Trains (or resumes) the run of `config` in `workdir`; returns the summary.

  Everything that can refuse the run (config, devices, data, `train.init_from`, the workdir's
  config and owner) is checked before anything is written. A finished run returns its summary
  without touching its files. A non-finite training loss (or parameters, or validation loss) is a
  result, not a crash: the run stops at the next log step, never checkpoints the bad state, and
  its summary says `status: diverged` with `diverged_at`.
  `cache` (a dict the caller owns, e.g. a sweep) reuses compiled functions across runs (`compiled`).
  """
  config_lib.validate(config)
  workdir = pathlib.Path(workdir)
  workdir_lib.check_usable(workdir)
  summary = finished(config, workdir)
  if summary is not None:
    return summary
  parallel.initialize(config)  # CPU devices, several hosts: before anything touches a device.
  dataset = data.load(config)
  vocab_size = dataset.tokenizer.vocab_size
  fns = compiled(config, vocab_size, cache)  # Checks the devices (parallel.plan).
  fine_tune = bool(config.train.get("init_from"))
  if fine_tune:
    init_from_config(config)
  with workdir_lib.Lock(logdir(workdir)), workdir_lib.full_disk_reported(workdir):
    summary = finished(config, workdir)  # Another process may have finished it meanwhile.
    if summary is not None:
      return summary
    workdir_lib.write_config(logdir(workdir), config)
    # Committed to the plan's shardings like a restored checkpoint, so that fresh and resumed
    # runs (and the cells of a sweep) hit the same compiled functions instead of compiling twice.
    state = fns.init(config.train.seed, config.optim.lr)
    ckpts = open_checkpoints(config, workdir)
    start, meta = 0, None
    try:
      restored = ckpts.restore_latest(state)
    except BaseException:
      ckpts.close()
      raise
    if restored:
      start, state, meta = restored
    elif fine_tune:  # The trunk from another run (e.g. MLM).
      state = state.replace(params=pretrained_params(config, state.params, vocab_size))
    lane = Lane.open(config, workdir, dataset, ckpts, start, meta)
    return train_lanes(fns, [lane], state, start, vocab_size)[0]

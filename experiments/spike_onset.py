"""Where the spike starts: per-parameter-group gradient norms at every warm-up step, beside the FFN
pre-activation statistics, along actlab's real training trajectory (RESULTS.md, test 1: GELU's
gradient norm climbs to 12–56× its initial value by step 30–40 of warm-up in 14 of 39 seeds).

    python experiments/spike_onset.py --seeds=101,102,107,100,103,105 --steps=60 \\
        --out=results/spike_onset --manual_dir=<dir with TinyStories-{train,valid}.txt>

For each activation (`--activations`, default gelu,relu) and seed, the run's config is built as
the committed runs' was (`configs/tinystories_<act>.py`, the decoder size "cpu_epoch", LR 3e-3,
TinyStories v1; compared with the committed run's `config.json` where there is one), and
the run trains for `--steps` steps through actlab's own state init, batches
(`Dataset.train_batch(k)`) and jitted train step (`program.Program`: its `log_step` on the steps
the loop logs, its `train_step` on the others, exactly as `run/loop.py` chooses). Before step
k's update, one extra jitted `jax.grad` of the same loss at the same parameters, batch and
dropout key measures, without changing the trajectory (the real step is then applied unchanged):

- the gradient norm of each parameter group: per layer the attention's query, key, value and out
  projections (kernel and bias together), the FFN's up (and gate, where gated) and down, and each
  LayerNorm's scale and bias apart; the token (`wte`) and position (`wpe`) embeddings; the final
  LayerNorm (`ln_f`) scale and bias. Their root-sum-square is the global gradient norm;
- per layer, the FFN pre-activation z = W₁x + b₁ (the gate's, where gated) on step k's batch: its
  mean, sd, fraction negative and max |z|; and the largest attention logit.

Each step's row also holds what the real train step reported: `grad_norm` (before clipping; the
cpu_epoch runs clip nothing), `train_loss` and `lr`. The script checks the trajectory against the
committed run (`--committed`, results/primary_relu_gelu by default): `grad_norm` at every logged
step, `grad_norm_max` over every logged interval and `grad_norm_init`, as relative differences.

Outputs under `--out`: `activation=<act>,seed=<seed>.csv` (one row per step 0 … steps−1) and
`summary.json` (per run: the onset step, where the global norm first exceeds `--onset_rel` × its
step-0 value; the peak; the groups that grew most relative to their own step-0 norms there; each
group's first step past `--onset_rel` × its step-0 norm; the check against the committed run).
It prints a compact table of the same (`--table`: again, from `summary.json`, without training).

This is a description, not an explanation: it records which gradients grow when, along runs
that are left as they were. No intervention was made, so it claims no cause.

By default the process is pinned to one CPU (`--cpus=1`), as each of the committed runs was
(`actlab.sweep --workers=2` pins each worker to one core): XLA:CPU sizes its thread pools by the
CPUs it may use, and splits reductions over them, so the float order follows the CPU count.
"""

import argparse
import csv
import dataclasses
import json
import math
import os
import pathlib
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
ONSET_REL = 3.0
COMMITTED = "results/primary_relu_gelu"
LR = 3e-3  # test 1's LR for both arms, chosen by their pilot (RESULTS.md)
LEADERS = 3  # groups named per run in the table


def pin_cpus(n: int) -> None:
  """This process on its first `n` allowed CPUs (0: as it is). Before JAX makes its backend."""
  if n:
    os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:n])


# --- The config and the trajectory --------------------------------------------------------------

def run_config(activation: str, seed: int, manual_dir: str = "", lr: float = LR):
  """The config of test 1's run of `activation` and `seed`, built as the sweep built it:
  `configs/tinystories_<act>.py` (its default size) with the sweep's fixed "cpu_epoch" size, the
  LR, the seed, and the command line's TinyStories v1 and manual dir."""
  from actlab import config as config_lib
  from actlab.config import sizes
  config = config_lib.decoder(activation)  # configs/tinystories_<activation>.py:get_config()
  overrides = {**sizes.SIZES["cpu_epoch"], "model.activation": activation, "optim.lr": lr,
               "train.seed": seed, "data.tinystories_version": "v1", "train.progress": False}
  if manual_dir:
    overrides["data.manual_dir"] = manual_dir
  config = config_lib.override(config, overrides)
  config_lib.validate(config)
  return config


def group_of(path: tuple[str, ...]) -> str:
  """A parameter's group: its module (kernel and bias together), or for a LayerNorm its scale or
  bias apart; "block_0.attn.query", "block_1.ln_ffn.scale", "wte", "ln_f.bias"; a parameter of
  the model itself, its own name."""
  *module, leaf = path
  norm = module and (module[-1].startswith("ln") or module[-1].endswith("_norm"))
  return ".".join(path if norm or not module else module)


def _keys(path) -> tuple[str, ...]:
  return tuple(getattr(k, "key", str(k)) for k in path)


def group_squares(grads) -> dict:
  """Each group's sum of squared gradient entries (traced). Under `model.scan_layers` the stacked
  `blocks` split into `block_<i>` along their layer axis."""
  import jax
  import jax.numpy as jnp
  out = {}
  for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]:
    keys = _keys(path)
    g = g.astype(jnp.float32)
    if keys[0] == "blocks":
      per_layer = jnp.sum(jnp.square(g).reshape(g.shape[0], -1), axis=1)
      for i in range(g.shape[0]):
        name = group_of((f"block_{i}", *keys[1:]))
        out[name] = out.get(name, 0.0) + per_layer[i]
      continue
    name = group_of(keys)
    out[name] = out.get(name, 0.0) + jnp.sum(jnp.square(g))
  return out


def make_measure(program):
  """A jitted `(state, batch) -> measures` for a single run of `program`: the gradient of the train
  step's own loss (`core.Step.train_step`'s: objective, dropout key fold_in(rng, step)) at the
  state's parameters, as group sums of squares, with the training forward's FFN pre-activation
  and attention statistics. It reads the state and changes nothing."""
  import jax
  import jax.numpy as jnp
  from actlab import core
  s = program.step

  def one(state, batch):
    key = jax.random.fold_in(state.rng, state.step)

    def loss_fn(params):
      out = s.objective(params, batch, key, train=True, stats=True)
      return out.loss_sum / out.count, out

    (loss, out), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
    m = {"loss": loss, "groups": group_squares(grads), "ffn": [], "attn_logit_max": []}
    for st in core.per_layer(out.sown, core.FFNStats):
      z = st.z.astype(jnp.float32)
      m["ffn"].append({"mean": z.mean(), "sd": z.std(), "neg": jnp.mean(z < 0),
                       "absmax": jnp.max(jnp.abs(z))})
    m["attn_logit_max"] = [a.logit_max for a in
                           core.per_layer(out.sown, core.AttentionStats)]
    return m

  return jax.jit(one)


@dataclasses.dataclass
class Trace:
  rows: list          # one dict per step
  groups: list        # the group names, in the parameters' order
  final_state: object


def trace(config, n_steps: int, measure: bool = True, cache: dict | None = None) -> Trace:
  """Trains `config`'s run for its first `n_steps` steps as `run/loop.py` does (its init, its
  batches, its `train_step` / `log_step` choice), without writing a run directory; with
  `measure`, each step's row also holds the extra gradient's group norms and the FFN statistics,
  measured before the step's update."""
  import jax
  from actlab import core, tasks
  from actlab.run import loop, program as program_lib, train
  config = train.initialize(config)
  task = tasks.get(config)
  dataset = task.dataset(config)
  dataset = dataclasses.replace(dataset, seed=int(config.train.seed))  # as train.run_group
  program = program_lib.get(config, dataset.tokenizer.vocab_size, 1, cache)
  state = program.start([config])
  measure_fn = None
  if measure:
    key = ("spike_onset.measure", program_lib.compile_key(config, dataset.tokenizer.vocab_size))
    if cache is None or key not in cache:
      measure_fn = make_measure(program)
      if cache is not None:
        cache[key] = measure_fn
    else:
      measure_fn = cache[key]
  t = config.train
  rows, groups = [], []
  for k in range(n_steps):
    batch = program.put_batches([dataset.train_batch(k)])
    log_now = loop.Due.at(k + 1, t, program.evaluators.sharpness).row
    row = {"step": k}
    if measure_fn is not None:
      m = jax.device_get(measure_fn(state, batch))  # before the step: it donates the state
      groups = list(m["groups"])
      row["measure_loss"] = float(m["loss"])
      row["grad_rss"] = math.sqrt(sum(float(v) for v in m["groups"].values()))
      row.update({f"g.{name}": math.sqrt(float(v)) for name, v in m["groups"].items()})
      for i, f in enumerate(m["ffn"]):
        row.update({f"z_{stat}.l{i}": float(v) for stat, v in f.items()})
      row.update({f"attn_logit_max.l{i}": float(v) for i, v in enumerate(m["attn_logit_max"])})
    state, metrics = (program.log_step if log_now else program.train_step)(state, batch)
    metrics = jax.device_get(metrics)
    row.update(train_loss=float(metrics["train_loss"]), lr=float(metrics["lr"]),
               grad_norm=float(metrics["grad_norm"]))
    rows.append(row)
  return Trace(rows, groups, state)


# --- Reading it ---------------------------------------------------------------------------------

def onset(rows: list, groups: list, rel: float = ONSET_REL) -> dict:
  """The onset (first step whose `grad_norm` exceeds `rel` × step 0's; None if none), the peak,
  and the groups' growth relative to their own step-0 norms at both, largest first; each
  group's first step past `rel` × its step-0 norm."""
  g0 = rows[0]["grad_norm"]
  norms = [r["grad_norm"] for r in rows]
  first = next((r["step"] for r in rows if r["grad_norm"] > rel * g0), None)
  peak = max(range(len(rows)), key=lambda i: norms[i])

  def growth(i):
    return sorted(((name, rows[i][f"g.{name}"] / rows[0][f"g.{name}"]) for name in groups),
                  key=lambda x: -x[1])

  def share(i):  # each group's share of the squared global norm (of the group norms' sum)
    total = sum(rows[i][f"g.{n}"] ** 2 for n in groups)
    return sorted(((n, rows[i][f"g.{n}"] ** 2 / total) for n in groups), key=lambda x: -x[1])

  crossing = {name: next((r["step"] for r in rows
                          if r[f"g.{name}"] > rel * rows[0][f"g.{name}"]), None)
              for name in groups}
  out = {"grad_norm_init": g0, "onset_rel": rel, "onset_step": first,
         "peak_step": rows[peak]["step"], "peak_rel": norms[peak] / g0,
         "growth_at_peak": dict(growth(peak)), "share_at_peak": dict(share(peak)),
         "group_first_past_rel": crossing}
  if first is not None:
    out["growth_at_onset"] = dict(growth(first))
    out["share_at_onset"] = dict(share(first))
  return out


def committed_check(rows: list, run_dir: pathlib.Path, config) -> dict | None:
  """This trajectory against the committed run in `run_dir`: its config (identity fields), and
  the largest relative differences of `grad_norm` (logged steps), `grad_norm_max` (each logged
  interval's largest step) and `grad_norm_init` within the steps traced. None without one."""
  from actlab import config as config_lib
  if not (run_dir / "metrics.jsonl").is_file():
    return None
  committed = json.loads((run_dir / "config.json").read_text())
  diffs = config_lib.identity_diffs(committed, config_lib.typed(config).fields)
  norms = {r["step"]: r["grad_norm"] for r in rows}
  rel = lambda mine, theirs: abs(mine - theirs) / abs(theirs)
  out = {"config_diffs": diffs, "grad_norm": [], "grad_norm_max": [], "grad_norm_init": None}
  previous = 0
  for line in (run_dir / "metrics.jsonl").read_text().splitlines():
    row = json.loads(line)
    step = row["step"]
    if "grad_norm_init" in row and 0 in norms:
      out["grad_norm_init"] = rel(norms[0], row["grad_norm_init"])
    if "grad_norm" in row and step - 1 in norms:  # a row's grad_norm is step (row − 1)'s
      out["grad_norm"].append(rel(norms[step - 1], row["grad_norm"]))
      out["grad_norm_max"].append(rel(max(norms[s] for s in range(previous, step)),
                                      row["grad_norm_max"]))
    if "grad_norm" in row:
      previous = step
  compared = len(out["grad_norm"])
  for key in ("grad_norm", "grad_norm_max"):
    out[key] = max(out[key]) if out[key] else None
  out["rows_compared"] = compared
  return out


def write_csv(path: pathlib.Path, tr: Trace) -> None:
  """One row per step; the group norms and statistics to 6 significant digits, the real step's
  `grad_norm` and the extra gradient's `grad_rss` to float32's 9."""
  precise = {"step", "grad_norm", "grad_rss", "train_loss", "lr", "measure_loss"}
  fields = list(tr.rows[0])
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(fields)
    for r in tr.rows:
      w.writerow([r[k] if k == "step" else f"{r[k]:.9g}" if k in precise else f"{r[k]:.6g}"
                  for k in fields])


def short(name: str) -> str:
  return (name.replace("block_", "b").replace(".attn.", ".").replace(".ffn.", ".")
          .replace("query", "q").replace("key", "k").replace("value", "v"))


def table(summaries: dict) -> str:
  """Per run: the onset and the peak (× step 0's norm), the groups that grew most relative to
  their own step-0 norms at the onset and at the peak, and the groups with the largest shares of
  the squared gradient norm at the peak."""
  lines = [f"{'run':<9} {'g0':>5} {'onset':>5} {'peak':>4} {'peak×':>5}  "
           f"{'grew most at onset (× own step 0)':<48} {'grew most at peak (× own step 0)':<48} "
           "largest share of |g|² at peak"]
  lead = lambda d, f: ", ".join(f"{short(n)} {f(v)}" for n, v in list(d.items())[:LEADERS])
  grew = lambda v: f"{v:.0f}" if v >= 10 else f"{v:.1f}"
  for run, s in summaries.items():
    o = s["onset"]
    at_onset = lead(o["growth_at_onset"], grew) if "growth_at_onset" in o else "-"
    lines.append(
        f"{run:<9} {o['grad_norm_init']:5.2f} {str(o['onset_step']):>5} {o['peak_step']:>4} "
        f"{o['peak_rel']:5.1f}  {at_onset:<48} {lead(o['growth_at_peak'], grew):<48} "
        f"{lead(o['share_at_peak'], lambda v: f'{v:.2f}')}")
  return "\n".join(lines)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                              formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--seeds", default="101,102,107,115,100,103,105,128",
                 help="comma-separated seeds (test 1's fresh seeds start at 100)")
  p.add_argument("--activations", default="gelu,relu", help="comma-separated FFN activations")
  p.add_argument("--steps", type=int, default=60, help="steps traced from step 0")
  p.add_argument("--out", default="results/spike_onset", help="output directory")
  p.add_argument("--manual_dir", default="",
                 help="TinyStories-{train,valid}.txt (config data.manual_dir; '' its default)")
  p.add_argument("--committed", default=COMMITTED,
                 help="the committed runs' sweep directory, checked against ('' for none)")
  p.add_argument("--onset_rel", type=float, default=ONSET_REL,
                 help="the onset: the first step whose gradient norm exceeds this × step 0's")
  p.add_argument("--cpus", type=int, default=1,
                 help="pin to this many CPUs, as the committed runs were (0: leave as is)")
  p.add_argument("--table", action="store_true",
                 help="only print the table of the runs already in <out>/summary.json")
  args = p.parse_args(argv)
  out = pathlib.Path(args.out)
  summary_path = out / "summary.json"
  summaries = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
  if args.table:
    print(table({k.replace("activation=", "").replace(",seed=", " "): v
                 for k, v in summaries.items()}))
    return
  pin_cpus(args.cpus)
  out.mkdir(parents=True, exist_ok=True)
  printed, cache = {}, {}
  for act in args.activations.split(","):
    for seed in (int(s) for s in args.seeds.split(",")):
      name = f"activation={act},seed={seed}"
      config = run_config(act, seed, args.manual_dir)
      tr = trace(config, args.steps, cache=cache)
      write_csv(out / f"{name}.csv", tr)
      check = (committed_check(tr.rows, REPO / args.committed / name, config)
               if args.committed else None)
      summaries[name] = {"steps": args.steps, "groups": tr.groups,
                         "onset": onset(tr.rows, tr.groups, args.onset_rel),
                         "committed": None if check is None else
                         {"dir": name if os.path.isabs(args.committed)  # no absolute path
                          else f"{args.committed}/{name}", **check}}
      printed[f"{act} {seed}"] = summaries[name]
      summary_path.write_text(json.dumps(summaries, indent=1) + "\n")
      rss = max(abs(r["grad_rss"] - r["grad_norm"]) / r["grad_norm"] for r in tr.rows)
      e = lambda x: "-" if x is None else f"{x:.1e}"
      c = ("no committed run" if check is None else
           f"vs committed: grad_norm rel diff ≤ {e(check['grad_norm'])} over "
           f"{check['rows_compared']} rows, grad_norm_max ≤ {e(check['grad_norm_max'])}, "
           f"init {e(check['grad_norm_init'])}, config "
           f"{'equal' if not check['config_diffs'] else check['config_diffs']}")
      print(f"{name}: {args.steps} steps; group rss vs step's grad_norm ≤ {rss:.1e}; {c}",
            flush=True)
  print(table(printed))


if __name__ == "__main__":
  sys.path.insert(0, str(REPO))
  main()

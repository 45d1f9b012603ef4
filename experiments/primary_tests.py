"""The primary tests: the page-level family RESULTS.md answers, stated before their runs.

Each test asks one question with one comparison, A − B, paired by seed (the two arms of a seed
share their batches and, where shapes agree, their initial weights). The rule is the same for all:

- **Selection apart from the test.** Each arm's peak LR is the one with the lowest mean
  `final_val_loss` (validation windows) over its pilot's seeds. The test then trains **fresh
  seeds** (from `FRESH_SEED` on: no pilot used them) at those LRs and reads `final_test_loss`
  (the held-out test windows: the validation split's second half).
- **The test.** A two-sided paired t-test of A − B. The family is every test below (K = 7),
  corrected by Holm at family-wise α = 0.05. Verdict: A or B better where the Holm-adjusted p is
  below α; "equivalent" where the two one-sided tests at ±δ are (Holm-adjusted) below α;
  otherwise "not resolved".
- **Seeds.** n is the smallest number of seed pairs (at least 10) whose paired t-test has power
  ≥ 0.8 against a difference of δ at α/K (Holm's strictest step), with the sd of the paired
  differences at the chosen LRs in the pilot (`final_test_loss`): `python
  experiments/primary_tests.py` prints the calculation (`... report`: and the results so far;
  `... excess`: the pilot's loss excess over the best LR, integrated over training; `...
  figure`: docs/img/activation_x_recipe.png, ReLU − GELU per recipe; `...
  plateau`: when each encoder run leaves the MLM plateau, beside where it ends; `... stability`:
  each arm's stability measures over its fresh seeds, descriptive). A test
  whose pilot is not run yet gets its n from that pilot, committed before its fresh seeds.
- **What this machine can afford.** An encoder run costs about 50 minutes of one core, so the
  encoder's tests are capped at `MAX_SEEDS["encoder"]` = 10 seed pairs (its four arms, GELU shared:
  40 runs, about 17 hours of both cores). A test whose calculated n is above its cap runs at the
  cap, and the plan prints its power against δ there and the difference it detects with 80% power
  (the cap was set after 14 of the encoder pilot's 16 runs, when ReLU − GELU's two seeds differed
  by 0.69 nats: n = 298).
- **δ = 0.1 nats** for every test: about a 10% change in perplexity, the smallest difference
  that would change which activation one picks at this scale. Smaller differences are reported,
  not claimed.
- **Noise named.** Seed sd: the sd of the fresh seeds' differences. Platform sd: the tests run
  one process per core (`--workers=2`, as their pilots did); the first 3 fresh seeds of both
  arms are rerun with both cores in one process (`--workers=1`: XLA:CPU splits reductions over
  its threads, so the float order differs), and the sd of rerun − run is the platform's. A
  difference is claimed only where it exceeds both (the page family's first rule; the claim rule
  below replaces it, and the page shows both verdicts).
- **Everything else is descriptive**: other LRs, other measures (stability verdicts, the
  largest gradient norm relative to initialisation, attention entropy and logits, dead units),
  and the committed exploratory studies.

**The claim rule (stated 2026-11-25; `comparisons.claim`). It replaces "exceeds both noises", which
compared a mean with the sd of single differences: a threshold on the standardised effect with no error
rate).** Each test's A − B gets a simultaneous interval: the paired t interval at level 1 − α/K
(Bonferroni, the first step of Holm's procedure; Holm's step-down has no sharper intervals that
still bound a difference's size), so that all K intervals of a family cover their differences
together with probability ≥ 1 − α. Held against ±δ it gives one of four verdicts:
*A lower by at least δ* (the interval lies below −δ; B likewise above +δ); *A lower, by less
than δ or by an amount not resolved* (it lies below 0 but reaches past −δ); *equivalent within
±δ* (the two one-sided tests against ±δ, Holm-adjusted over the family, reject at α; said with
the direction where the interval also excludes 0); *not resolved*. The Holm-adjusted p of a
difference of 0 is printed beside it. Platform noise is a reported variance component, not a
threshold: the sd of the platform's shift of A − B, (A′ − B′) − (A − B) over the seeds whose
both arms were rerun on the other platform. The seven page tests are re-analysed under it
(`report` prints the old verdict beside the new); nothing else about them changes.

**The recipe family (family 2, K = 6; stated 2026-11-25, before any of its runs).** Is the page's
first answer (ReLU − GELU on the decoder, test 1: no gradient clipping, 45 warm-up steps,
d_model 128) the recipe's or the activation's? The same question, ReLU − GELU on the
`cpu_epoch` decoder at each one's LR chosen on its own pilot, under four recipes (`RECIPES`):
(a) `clip`: global-norm gradient clipping at 1.0; (b) `warmup`: a warm-up of 180 of the 450
steps; (c) `wide`: twice the width (d_model 256, FFN 1,024, 8 heads of 32 dimensions);
(d) `clip_warmup`: (a) and (b) together. Two places are kept in the family for the modern
block's tests (`modern_relu_gelu`: ReLU − GELU in the modern block with a plain FFN;
`modern_relu2_gelu`: ReLU² − GELU there); their settings are stated here when the block exists,
before their runs, and K stays 6 whether or not they run (an unrun test counts as p = 1).
**The modern block's tests (stated 2026-11-25, with the block and before any of their runs):**
test 1's question with the block swapped and its recipe kept — the `cpu_epoch` decoder and
schedule (no clipping, 45 warm-up steps, d_model 128, FFN 512, 4 heads) in
`config.BLOCKS["llama"]` (RMSNorm with eps 1e-6, RoPE with θ = 10,000, no biases, an untied
head) with a plain FFN (`MODERN_BLOCK`), so that a change from test 1 is the block's. One pilot
for both (`:modern_pilot`: ReLU, ReLU² and GELU × LR {1e-3, 3e-3, 1e-2} × seeds 0–2; the step
past an edge, `:modern_edge`, for every arm that needs it), then each test's fresh seeds
(`:modern_relu_gelu`, `:modern_relu2_gelu`; GELU's runs serve both), by the rules below.
The family is corrected alone (Holm and the intervals at α/6), apart from the page's first
family, whose verdicts it leaves as they are.
- **Pilot** (`:recipe_<r>_pilot`): ReLU and GELU × LR {1e-3, 3e-3, 1e-2} × seeds 0–2 under the
  recipe. Where an arm's best LR (lowest mean validation loss) is at the grid's edge, the grid is
  extended one step past it for that arm (`EDGE_STEP`: 3e-4 below, 3e-2 above; the same seeds;
  `:recipe_<r>_edge`) before choosing, once: the arm then chooses among its four LRs, and an
  arm whose choice is again at the edge says so on the page.
- **Fresh seeds** (`:recipe_<r>`): from `RECIPE_FRESH_SEED` = 200 (no run of either family used
  them), n from the pilot's paired sd at the chosen LRs by the power rule above at α/6, at least
  10 pairs and at most `MAX_SEEDS` (40 pairs; 20 for `wide`, whose runs cost about 3× as much);
  a test capped below its n states its power. The first 3 fresh seeds of both arms are rerun on
  the other platform (`:recipe_<r>` with `--workers=1`) for the platform's variance component.
- **Descriptive beside it**: where the spike starts (per-parameter-group gradient norms in
  warm-up), the stability measures, the other LRs.

The sweeps: `:<test>` trains a test's fresh seeds; `:gated_pilot` the 3-LR pilot of the gated
FFNs and SiLU (ReLU and GELU have theirs: results/relu_vs_gelu_cpu_epoch), which picks the LRs of
tests 2–4; the encoder's pilot is `experiments/bert_ffn_activation.py:past_plateau_pilot`.
"""

import json
import math
import pathlib
import sys

import numpy as np
from scipy import optimize, stats

from actlab.config import BLOCKS, sizes
from actlab.report import comparisons

ALPHA, POWER, DELTA, MIN_SEEDS = 0.05, 0.8, 0.1, 10
MAX_SEEDS = {"decoder": None, "encoder": 10,  # the seed pairs this machine can afford
             "recipe": 40, "recipe_wide": 20}
FRESH_SEED = 100  # fresh seeds are 100, 101, …: every pilot used seeds below 10
RECIPE_FRESH_SEED = 200  # the recipe family's: no run of either family used them
PLATFORM_SEEDS = 3  # the first fresh seeds, rerun for the platform sd (both arms of each)
PILOT_LRS = [1e-3, 3e-3, 1e-2]
DECODER = sizes.SIZES["cpu_epoch"]  # 0.94M parameters, one epoch of the TinyStories sample
ENCODER = {**sizes.SIZES["bert_cpu_past_plateau"], "model.kind": "encoder", "model.task": "mlm"}

# test name -> (question, A, B, the fixed settings both arms share, the pilot's results dirs)
PLAIN = ("relu_vs_gelu_cpu_epoch",)  # ReLU's and GELU's pilot
GATED = ("primary_gated_pilot", *PLAIN)  # the gated FFNs' and SiLU's, beside it
TESTS = {
    "relu_gelu": ("Does ReLU or GELU give the lower loss at its best LR (decoder)?",
                  "relu", "gelu", DECODER, PLAIN),
    "swiglu_silu": ("Does gating change SiLU's loss at each one's best LR (decoder)?",
                    "swiglu", "silu", DECODER, GATED),
    "geglu_gelu": ("Does gating change GELU's loss at each one's best LR (decoder)?",
                   "geglu", "gelu", DECODER, GATED),
    "reglu_relu": ("Does gating change ReLU's loss at each one's best LR (decoder)?",
                   "reglu", "relu", DECODER, GATED),
    "bert_relu_gelu": ("Does ReLU change BERT's [MASK] loss against GELU (encoder, MLM)?",
                       "relu", "gelu", ENCODER, ("bert_past_plateau_pilot",)),
    "bert_tanh_gelu": ("Does tanh change BERT's [MASK] loss against GELU (encoder, MLM)?",
                       "tanh", "gelu", ENCODER, ("bert_past_plateau_pilot",)),
    "bert_swiglu_gelu": ("Does SwiGLU change BERT's [MASK] loss against GELU (encoder, MLM)?",
                         "swiglu", "gelu", ENCODER, ("bert_past_plateau_pilot",)),
}
PAGE = tuple(TESTS)  # family 1: the page's seven tests
# Family 2: ReLU − GELU on the decoder under other recipes (name -> the fields they change).
RECIPES = {"clip": {"optim.clip_norm": 1.0},
           "warmup": {"optim.warmup_steps": 180},
           "wide": {"model.d_model": 256, "model.d_ff": 1024, "model.num_heads": 8},
           "clip_warmup": {"optim.clip_norm": 1.0, "optim.warmup_steps": 180}}
RECIPE_PILOT_SEEDS = [0, 1, 2]
EDGE_STEP = {min(PILOT_LRS): 3e-4, max(PILOT_LRS): 3e-2}  # one step past each edge of the grid
for _r, _fields in RECIPES.items():
  TESTS[f"recipe_{_r}"] = (f"Does ReLU or GELU give the lower loss at its best LR (decoder, "
                           f"recipe {_r})?", "relu", "gelu", {**DECODER, **_fields},
                           (f"primary_recipe_{_r}_pilot", f"primary_recipe_{_r}_edge"))
# The modern block's tests in family 2: test 1's recipe in the LLaMA-style block, plain FFN.
MODERN_BLOCK = {**DECODER, **BLOCKS["llama"], "model.ffn": "plain"}
MODERN_ARMS = ["relu", "relu2", "gelu"]  # one pilot for both tests
MODERN_STUDIES = ("primary_modern_pilot", "primary_modern_edge")
MODERN = {"modern_relu_gelu": ("relu", "ReLU"), "modern_relu2_gelu": ("relu2", "ReLU²")}
for _name, (_act, _label) in MODERN.items():
  TESTS[_name] = (f"Does {_label} or GELU give the lower loss at its best LR (decoder, the "
                  f"modern block, plain FFN)?", _act, "gelu", MODERN_BLOCK, MODERN_STUDIES)
FAMILIES = {"page": PAGE, "recipe": (*(f"recipe_{r}" for r in RECIPES), *MODERN)}
K = len(PAGE)
RESULTS = pathlib.Path(__file__).resolve().parents[1] / "results"
# The outcome each family reads: the encoder's is the loss at the [MASK] positions.
OUTCOME = {"decoder": ("final_val_loss", "final_test_loss"),
           "encoder": ("final_val_mask_loss", "final_test_mask_loss")}
# An encoder run has left the MLM plateau (about 5.7 nats) once its validation [MASK] loss is
# below this: descriptive, between the plateau and every run's end (2.3-3.6 nats).
PLATEAU_EXIT = 4.0
LATE_STEPS = 500  # a run still descending at its end: its loss falls over these last steps
# The stability measures `stability` ranges over (descriptive; docs/metrics.md): summary key ->
# what it is, as printed.
STABILITY = {"grad_norm_max_rel": "largest gradient norm / its initial value",
             "attn_entropy_min": "least attention entropy (nats)",
             "attn_logit_max": "largest attention logit",
             "dead_units": "dead FFN units (fraction)"}
SEEDS_WHERE = {"stable": "both arms stable:", "unstable": "either arm unstable:"}  # by_stability


def paired_power(n: int, sd: float, delta: float = DELTA, alpha: float = ALPHA / K) -> float:
  """The power of a two-sided paired t-test of n pairs at `alpha` against a mean difference
  `delta` when the differences' sd is `sd` (noncentral t)."""
  if sd == 0:  # differences without noise
    return 1.0
  df, shift = n - 1, delta / (sd / math.sqrt(n))
  t = stats.t.ppf(1 - alpha / 2, df)
  # Both tails as upper tails: scipy's nct.cdf is NaN far out in the lower one.
  return float(stats.nct.sf(t, df, shift) + stats.nct.sf(t, df, -shift))


def seeds_needed(sd: float, delta: float = DELTA, alpha: float = ALPHA / K,
                 power: float = POWER) -> int:
  """The smallest n ≥ MIN_SEEDS whose paired t-test has `power` against `delta`."""
  n = MIN_SEEDS
  while paired_power(n, sd, delta, alpha) < power:
    n += 1
  return n


def detectable(n: int, sd: float, alpha: float = ALPHA / K) -> float:
  """The mean difference n pairs detect with power POWER at `alpha` (at most the critical t
  plus 10 standard errors, where the power is near 1)."""
  se = sd / math.sqrt(n)
  most = (stats.t.ppf(1 - alpha / 2, n - 1) + 10) * se
  return optimize.brentq(lambda d: paired_power(n, sd, d, alpha) - POWER, 0.0, most)


def kind(name: str) -> str:
  """The model family of test `name`: "encoder" or "decoder"."""
  return "encoder" if TESTS[name][3].get("model.kind") == "encoder" else "decoder"


def family_of(name: str) -> str:
  """The family test `name` is corrected in: "page" or "recipe"."""
  return next(f for f, names in FAMILIES.items() if name in names)


def family_alpha(name: str) -> float:
  """α/K of test `name`'s family: the level its power and its simultaneous interval use."""
  return ALPHA / len(FAMILIES[family_of(name)])


def cap(name: str) -> int | None:
  """The most seed pairs test `name` runs (None: no cap)."""
  if family_of(name) == "recipe":
    return MAX_SEEDS["recipe_wide" if name == "recipe_wide" else "recipe"]
  return MAX_SEEDS[kind(name)]


def fresh_seeds(name: str, n: int) -> list[int]:
  """The first n fresh seeds of test `name`'s family."""
  first = RECIPE_FRESH_SEED if family_of(name) == "recipe" else FRESH_SEED
  return list(range(first, first + n))


def pilot(name: str) -> dict | None:
  """The test's pilot, from its committed summaries: each arm's LR chosen on validation and the
  paired sd of the outcome there; None until the pilot is committed, ValueError while what is
  committed of it is incomplete (not every (activation, LR) cell of the two arms at the same
  seeds, at least two; in the recipe family, not every LR of the grid). In the recipe family,
  an arm whose best LR is at the grid's edge waits for the step past it (`EDGE_STEP`): the plan
  then has "edge" ({arm: the LR to run}) and no LR chosen."""
  _, a, b, _, studies = TESTS[name]
  by = {}  # (activation, lr) -> {seed: summary}
  for (act, lr, seed), summary in finished(*studies).items():
    by.setdefault((act, lr), {})[seed] = summary
  if not {a, b} <= {act for act, _ in by}:
    return None
  seed_sets = {cell: sorted(seeds) for cell, seeds in by.items() if cell[0] in (a, b)}
  distinct = {tuple(s) for s in seed_sets.values()}
  recipe = family_of(name) == "recipe"
  missing = [(arm, lr) for arm in (a, b) for lr in PILOT_LRS if recipe and (arm, lr) not in by]
  if len(distinct) > 1 or len(next(iter(distinct))) < 2 or missing:
    raise ValueError(f"primary_tests:{name}: its pilot is incomplete (seeds per (activation, "
                     f"LR): {seed_sets}); commit it when every run has finished")
  seeds = list(next(iter(distinct)))  # the same in every cell
  select, outcome = OUTCOME[kind(name)]
  mean = lambda arm, lrs: {lr: np.mean([s[select] for s in by[arm, lr].values()]) for lr in lrs}
  chosen, edge = {}, {}
  for arm in (a, b):
    lrs = mean(arm, [lr for act, lr in by if act == arm])
    if recipe:
      best = min(l := mean(arm, PILOT_LRS), key=l.get)
      if best in EDGE_STEP and (arm, EDGE_STEP[best]) not in by:
        edge[arm] = EDGE_STEP[best]
    chosen[arm] = min(lrs, key=lrs.get)
  if edge:
    return {"edge": edge, "seeds": seeds}
  diffs = [by[(a, chosen[a])][s][outcome] - by[(b, chosen[b])][s][outcome] for s in seeds]
  sd, alpha = float(np.std(diffs, ddof=1)), family_alpha(name)
  needed, most = seeds_needed(sd, alpha=alpha), cap(name)
  n = needed if most is None else min(needed, most)
  return {"lr": chosen, "seeds": seeds, "diffs": diffs, "sd": sd, "needed": needed, "n": n,
          "power": paired_power(n, sd, alpha=alpha),
          "detectable": detectable(n, sd, alpha=alpha) if sd else 0.0}


def run_key(run: pathlib.Path) -> tuple:
  """(activation, peak LR, seed) of the run in directory `run`, from its config.json."""
  c = json.loads((run / "config.json").read_text())
  return c["model"]["activation"], c["optim"]["lr"], c["train"]["seed"]


def run_dirs(*studies: str) -> dict:
  """(activation, peak LR, seed) -> the directory of each finished run in results/<study>/."""
  return {run_key(summary.parent): summary.parent
          for study in studies for summary in (RESULTS / study).glob("*/summary.json")}


def finished(*studies: str) -> dict:
  """(activation, peak LR, seed) -> summary of each finished run in results/<study>/."""
  return {key: json.loads((run / "summary.json").read_text())
          for key, run in run_dirs(*studies).items()}


def summaries(study: str) -> dict:
  """(activation, seed) -> summary of the finished runs of a single-LR study."""
  return {(act, seed): summary for (act, _, seed), summary in finished(study).items()}


def result(name: str) -> dict | None:
  """Test `name` on its fresh seeds (results/primary_<name>/, both arms finished): the paired
  comparison of the outcome, the seed sd, and where the two-core reruns
  (results/primary_<name>_two_cores/) are committed, the platform's noise: the sd of rerun − run
  over single runs, and the sd of its shift of A − B, (A′ − B′) − (A − B), over the seeds whose
  both arms were rerun; None before any pair has finished."""
  _, a, b, _, _ = TESTS[name]
  outcome = OUTCOME[kind(name)][1]
  runs = summaries(f"primary_{name}")
  seeds = sorted(s for (act, s) in runs if act == a and (b, s) in runs)
  if not seeds:
    return None
  arm_a, arm_b = ([runs[(arm, s)][outcome] for s in seeds] for arm in (a, b))
  diffs = {s: va - vb for s, va, vb in zip(seeds, arm_a, arm_b)}
  paired = comparisons.paired_difference(arm_a, arm_b, DELTA)
  reruns = summaries(f"primary_{name}_two_cores")
  platform = [reruns[k][outcome] - runs[k][outcome] for k in reruns if k in runs]
  shift = [(reruns[(a, s)][outcome] - reruns[(b, s)][outcome]) - diffs[s] for s in seeds
           if (a, s) in reruns and (b, s) in reruns]
  unstable = {s for s in seeds  # either arm not stable
              if not runs[(a, s)]["status"] == runs[(b, s)]["status"] == "stable"}
  return {"seeds": seeds, "diffs": diffs, "paired": paired, "unstable_seeds": unstable,
          "means": (float(np.mean(arm_a)), float(np.mean(arm_b))),
          "platform_sd": float(np.std(platform, ddof=1)) if len(platform) > 1 else None,
          "platform_n": len(platform),
          "platform_shift_sd": float(np.std(shift, ddof=1)) if len(shift) > 1 else None,
          "platform_shift_n": len(shift)}


def loss_excess(study: str) -> dict:
  """(activation, lr) -> each seed's validation loss above that of the same activation and seed
  at its best LR (lowest mean final val loss), integrated over training by the trapezoid rule
  over the evaluations and divided by the steps: the mean excess in nats over the run."""
  curves, finals = {}, {}
  for path in (RESULTS / study).glob("*/metrics.jsonl"):
    key = run_key(path.parent)
    curves[key] = curve(path, "val_loss")
    finals.setdefault(key[:2], []).append(curves[key][max(curves[key])])
  best = {}
  for act, lr in finals:
    if act not in best or np.mean(finals[act, lr]) < np.mean(finals[act, best[act]]):
      best[act] = lr
  out = {}
  for (act, lr, seed), run in curves.items():
    ref = curves[(act, best[act], seed)]
    steps = sorted(set(run) & set(ref))
    excess = [run[t] - ref[t] for t in steps]
    out.setdefault((act, lr), []).append(np.trapezoid(excess, steps) / steps[-1])
  return out


def curve(metrics_jsonl: pathlib.Path, key: str) -> dict:
  """step -> `key` at the logged steps that have it, from a run's metrics.jsonl."""
  rows = [json.loads(line) for line in metrics_jsonl.read_text().splitlines()]
  return {r["step"]: r[key] for r in rows if r.get(key) is not None}


def plateau_exit(val_mask_loss: dict, bar: float = PLATEAU_EXIT) -> float | None:
  """The step at which the validation [MASK] loss first falls below `bar`, interpolated linearly
  between the two evaluations around it; None if it never does."""
  points = sorted(val_mask_loss.items())
  for (s0, l0), (s1, l1) in zip(points, points[1:]):
    if l0 >= bar > l1:
      return s0 + (l0 - bar) / (l0 - l1) * (s1 - s0)
  return None


def late_descent(val_mask_loss: dict, steps: int = LATE_STEPS) -> float | None:
  """How far the validation [MASK] loss falls over the last `steps` steps (positive: still
  descending); None where the evaluation `steps` before the last is not logged."""
  last = max(val_mask_loss)
  start = val_mask_loss.get(last - steps)
  return None if start is None else start - val_mask_loss[last]


def plateau_exits() -> dict:
  """(activation, seed) -> (plateau exit step, final test [MASK] loss, late descent) of each
  finished fresh-seed run of the encoder's tests (a GELU run shared by the tests counted once)."""
  studies = [f"primary_{name}" for name in TESTS if kind(name) == "encoder"]
  out = {}
  for (act, _, seed), run in run_dirs(*studies).items():
    val_mask_loss = curve(run / "metrics.jsonl", "val_mask_loss")
    final = json.loads((run / "summary.json").read_text())[OUTCOME["encoder"][1]]
    out[act, seed] = (plateau_exit(val_mask_loss), final, late_descent(val_mask_loss))
  return out


def stability(name: str) -> dict:
  """arm -> status (docs/metrics.md §6) -> the descriptive stability of test `name`'s fresh-seed
  runs of that arm with that status: their number and the (least, largest) value of each measure
  in STABILITY."""
  _, a, b, _, _ = TESTS[name]
  out = {a: {}, b: {}}
  for (act, _), summary in summaries(f"primary_{name}").items():
    if act in out:
      out[act].setdefault(summary["status"], []).append(summary)
  return {arm: {status: {"runs": len(runs),
                         **{m: (min(r[m] for r in runs), max(r[m] for r in runs))
                            for m in STABILITY}}
                for status, runs in sorted(by_status.items())}
          for arm, by_status in out.items()}


def by_stability(name: str) -> dict:
  """Test `name`'s paired differences A − B split by whether either arm of the seed is unstable:
  "unstable" / "stable" -> (pairs, mean, sd); descriptive."""
  r = result(name)
  groups = {}
  for seed, diff in (r["diffs"] if r else {}).items():
    groups.setdefault("unstable" if seed in r["unstable_seeds"] else "stable", []).append(diff)
  return {g: (len(d), float(np.mean(d)), float(np.std(d, ddof=1)) if len(d) > 1 else None)
          for g, d in sorted(groups.items())}


def seed_correlation(exits: dict) -> tuple[float, int]:
  """Pearson r of plateau exit and final loss between seeds: each run's two values less its
  activation's means (runs that never exit, and activations with one run, left out); and n."""
  by_act = {}
  for (act, _), (step, loss, *_) in exits.items():
    if step is not None:
      by_act.setdefault(act, []).append((step, loss))
  centred = [v - v.mean(axis=0) for v in map(np.array, by_act.values()) if len(v) > 1]
  steps, losses = np.concatenate(centred).T
  return float(stats.pearsonr(steps, losses).statistic), len(steps)


def get_sweep(arg=None):
  if arg == "gated_pilot":
    return {"description": "Primary tests 2-4, pilot: gated FFNs and SiLU across 3 LRs",
            "axes": {"model.activation": ["swiglu", "geglu", "reglu", "silu"],
                     "optim.lr": PILOT_LRS},
            "seeds": [0, 1, 2], "fixed": DECODER}
  recipe = arg.removeprefix("recipe_").rsplit("_", 1) if arg and arg.startswith("recipe_") else ()
  if len(recipe) == 2 and recipe[0] in RECIPES and recipe[1] == "pilot":
    return {"description": f"Recipe family, pilot: ReLU vs GELU across 3 LRs, recipe {recipe[0]}",
            "axes": {"model.activation": ["relu", "gelu"], "optim.lr": PILOT_LRS},
            "seeds": RECIPE_PILOT_SEEDS, "fixed": TESTS[f"recipe_{recipe[0]}"][3]}
  if len(recipe) == 2 and recipe[0] in RECIPES and recipe[1] == "edge":
    return edge_sweep(f"recipe_{recipe[0]}")
  if arg == "modern_pilot":
    return {"description": "Recipe family, the modern block's pilot: ReLU, ReLU² and GELU "
                           "across 3 LRs (plain FFN)",
            "axes": {"model.activation": MODERN_ARMS, "optim.lr": PILOT_LRS},
            "seeds": RECIPE_PILOT_SEEDS, "fixed": MODERN_BLOCK}
  if arg == "modern_edge":
    return edge_sweep(*MODERN)
  if arg not in TESTS:
    raise ValueError(f"primary_tests: unknown variant {arg!r}; use one of "
                     f"{[':gated_pilot', *(f':recipe_{r}_{v}' for r in RECIPES for v in ('pilot', 'edge')), ':modern_pilot', ':modern_edge', *(':' + t for t in TESTS)]}")
  question, a, b, fixed, _ = TESTS[arg]
  plan = pilot(arg)
  if plan is None:
    raise ValueError(f"primary_tests:{arg}: its pilot ({', '.join(TESTS[arg][4])}) is not "
                     "committed yet")
  if "edge" in plan:
    raise ValueError(f"primary_tests:{arg}: its pilot's best LR is at the grid's edge for "
                     f"{sorted(plan['edge'])}: run :{edge_variant(arg)} first")
  sweep = {"description": f"Primary test {arg}: {question}",
           "axes": {"model.activation": [a, b]},
           "seeds": fresh_seeds(arg, plan["n"]),
           "fixed": {**fixed, "optim.lr": plan["lr"][a]}, "baseline": b,
           "equivalence_margin": DELTA}
  if plan["lr"][b] != plan["lr"][a]:  # each arm at its own LR
    sweep["fixed_by"] = {"model.activation": {b: {"optim.lr": plan["lr"][b]}}}
  return sweep


def edge_variant(name: str) -> str:
  """The sweep variant that runs the step past the edge of test `name`'s pilot."""
  return "modern_edge" if name in MODERN else f"{name}_edge"


def edge_sweep(*names: str) -> dict:
  """The recipe family's step past a pilot's grid edge for tests `names` (which share a pilot):
  each arm whose best LR is at an edge, at the LR one step past it, on the pilot's seeds."""
  plans = [pilot(name) for name in names]
  where = ", ".join(names)
  if any(plan is None for plan in plans):
    raise ValueError(f"primary_tests: the edge of {where}: its pilot is not committed yet")
  edge = {arm: lr for plan in plans for arm, lr in plan.get("edge", {}).items()}
  if not edge:
    raise ValueError(f"primary_tests: the edge of {where}: no arm's best LR is at the grid's "
                     "edge: nothing to run")
  arms = sorted(edge)
  sweep = {"description": f"Recipe family, pilot: the step past the grid's edge ({where})",
           "axes": {"model.activation": arms}, "seeds": plans[0]["seeds"],
           "fixed": {**TESTS[names[0]][3], "optim.lr": edge[arms[0]]}}
  others = {arm: {"optim.lr": edge[arm]} for arm in arms[1:] if edge[arm] != edge[arms[0]]}
  if others:
    sweep["fixed_by"] = {"model.activation": others}
  return sweep


def report() -> None:
  """Each family's results so far under the claim rule: per test the paired difference, its simultaneous
  interval at α/K, the Holm-adjusted p of no difference and of the TOST against ±δ (a test
  without results counting as p = 1, so an interim adjusted p is never smaller than the final
  one would be for that p), the noise, and the verdict; the page's tests also under the rule
  the claim rule replaced (`superseded_claim`), side by side."""
  for fam, names in FAMILIES.items():
    k = len(names)
    print(f"family {fam!r}: K = {k}; simultaneous intervals at 1 - {ALPHA}/{k} "
          f"(level {1 - ALPHA / k:.4f}), Holm over the family")
    results = {name: result(name) for name in names}
    p = [r["paired"].p if r else 1.0 for r in results.values()]
    p_equiv = [r["paired"].p_equiv if r else 1.0 for r in results.values()]
    for (name, r), ph, peh in zip(results.items(), comparisons.holm(p),
                                  comparisons.holm(p_equiv)):
      if r is None:
        print(f"- {name}: no fresh-seed pair finished")
        continue
      _, a, b, _, _ = TESTS[name]
      d, plan = r["paired"], pilot(name)
      low, high = comparisons.simultaneous_interval(d, k)
      a_lower = sum(diff < 0 for diff in r["diffs"].values())
      print(f"- {name}: {d.n} of {plan['n']} seed pairs; means {a} {r['means'][0]:.4f}, {b} "
            f"{r['means'][1]:.4f}; {a} - {b} = {d.mean:+.4f}, 95% [{d.ci_low:+.4f}, "
            f"{d.ci_high:+.4f}], simultaneous [{low:+.4f}, {high:+.4f}]; {a} lower in {a_lower} "
            f"of {d.n}; p {d.p:.3g} (Holm {ph:.3g}), TOST +-{DELTA} p {d.p_equiv:.3g} (Holm "
            f"{peh:.3g}); seed sd {d.sd:.4f}, {platform(r)}")
      print(f"    verdict: {comparisons.claim((low, high), DELTA, peh, a, b)}"
            + (" (interim)" if d.n < plan["n"] else ""))
      if fam == "page":
        print(f"    under the rule it replaces: {superseded_claim(d, ph, peh, r['platform_sd'])}"
              f"{pending(r, plan['n'])}")
      print("    A - B by seed: " + ", ".join(f"{s} {x:+.3f}" for s, x in r["diffs"].items()))


def platform(r: dict) -> str:
  """The platform's noise in test result `r`, as printed."""
  if r["platform_sd"] is None:
    return "platform: not yet measured"
  shift = (f"sd {r['platform_shift_sd']:.4f} over {r['platform_shift_n']} seeds"
           if r["platform_shift_sd"] is not None else "not yet measured")
  return (f"platform: shift of A - B {shift}; rerun - run sd {r['platform_sd']:.4f} "
          f"({r['platform_n']} runs)")


def superseded_claim(d, p_holm: float, p_equiv_holm: float, platform_sd: float | None) -> str:
  """The page's first rule, replaced by the claim rule and kept to show the re-analysis: a Holm verdict,
  with a difference claimed only where it exceeds both the seed sd and the platform sd
  (unmeasured: not claimed)."""
  verdict = comparisons.verdict(d.mean, p_holm, p_equiv_holm)
  if verdict not in (comparisons.A_BETTER, comparisons.B_BETTER):
    return verdict
  if platform_sd is None:
    return f"{comparisons.NOT_RESOLVED} (p says {verdict}; the platform sd is not measured yet)"
  if abs(d.mean) <= max(d.sd, platform_sd):
    return f"{comparisons.NOT_RESOLVED} (p says {verdict}, but |A - B| is not above the noise)"
  return verdict


def pending(r: dict, n: int) -> str:
  """What test result `r` still waits for before its verdict under the superseded rule is
  final: its n seed pairs and the platform reruns of both arms ("" once it has them)."""
  missing = [f"{r['paired'].n} of {n} seed pairs"] if r["paired"].n < n else []
  if r["platform_n"] < 2 * PLATFORM_SEEDS:
    missing.append(f"{r['platform_n']} of {2 * PLATFORM_SEEDS} platform reruns")
  return f" (interim: {', '.join(missing)})" if missing else ""


def print_plan(name: str) -> None:
  """Test `name`'s pilot and the fresh seeds it asks for, as `main` prints them."""
  question, a, b, _, studies = TESTS[name]
  plan, study = pilot(name), " + ".join(f"results/{s}" for s in studies)
  if plan is None:
    print(f"- {name}: {question}\n    pilot {study}: not run yet")
  elif "edge" in plan:
    print(f"- {name}: {question}\n    pilot {study}: best LR at the grid's edge for "
          + ", ".join(f"{arm} (next: {lr:g})" for arm, lr in sorted(plan["edge"].items()))
          + f": run :{edge_variant(name)}")
  else:
    diffs = ", ".join(f"{d:+.4f}" for d in plan["diffs"])
    print(f"- {name}: {question}\n    pilot {study}, seeds {plan['seeds']}: LR "
          f"{plan['lr'][a]:g} ({a}), {plan['lr'][b]:g} ({b}); {a} - {b} = {diffs}; "
          f"sd {plan['sd']:.4f} -> n = {plan['needed']} fresh seeds"
          + ("" if plan["n"] == plan["needed"] else
             f"; capped at {plan['n']}: power {plan['power']:.2f} against delta, 80% power "
             f"above {plan['detectable']:.3f} nats"))


FIGURE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "img" / "activation_x_recipe.png"


def figure(path: pathlib.Path = FIGURE) -> None:
  """ReLU − GELU on the decoder per recipe and block (ReLU² − GELU in the LLaMA-style block too):
  the mean and its simultaneous interval (family 1's test 1 at α/7, family 2's tests at α/6), ±δ
  marked; tests without fresh seeds left out."""
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  rows = []
  labels = {"relu_gelu": "no clipping, warm-up 45, d 128\n(family 1, test 1)",
            "recipe_clip": "clipping at 1.0", "recipe_warmup": "warm-up 180",
            "recipe_wide": "d 256, FFN 1,024", "recipe_clip_warmup": "clipping + warm-up 180",
            "modern_relu_gelu": "LLaMA-style block",
            "modern_relu2_gelu": "LLaMA-style block,\nReLU² − GELU"}
  for name, label in labels.items():
    r = result(name)
    if r is not None:
      k = len(FAMILIES[family_of(name)])
      rows.append((f"{label}\n({r['paired'].n} pairs)", r["paired"].mean,
                   comparisons.simultaneous_interval(r["paired"], k)))
  fig, ax = plt.subplots(figsize=(6.4, 0.7 * len(rows) + 1.2))
  for y, (label, mean, (low, high)) in enumerate(rows):
    ax.errorbar(mean, y, xerr=[[mean - low], [high - mean]], fmt="o", color="k", capsize=4)
  ax.set_yticks(range(len(rows)), [label for label, *_ in rows], fontsize=8)
  ax.invert_yaxis()
  for x in (-DELTA, DELTA):
    ax.axvline(x, color="tab:red", ls="--", lw=1)
  ax.axvline(0, color="0.6", lw=1)
  ax.set_xlabel("ReLU − GELU, final test loss (nats): mean and simultaneous interval; ±δ dashed")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print(f"wrote {path.relative_to(path.parents[2])}")


def main(what: str = "plan") -> None:
  for fam, names in FAMILIES.items():
    print(f"family {fam!r}: K = {len(names)} tests, family-wise alpha {ALPHA}; power {POWER} "
          f"against delta = {DELTA} nats at alpha/K = {ALPHA / len(names):.4f}, two-sided "
          "paired t-test")
    for name in names:
      print_plan(name)
  if what == "report":
    report()
  if what == "figure":
    figure()
  if what == "plateau":
    exits = plateau_exits()
    print(f"encoder runs: the step their validation [MASK] loss falls below {PLATEAU_EXIT} nats "
          f"(interpolated), their final test [MASK] loss, and how far their validation [MASK] "
          f"loss falls over the last {LATE_STEPS} steps:")
    for (act, seed), (step, loss, descent) in sorted(exits.items()):
      print(f"  {act} seed {seed}: " + (f"{step:.0f}" if step is not None else "never")
            + f", {loss:.3f}, " + (f"{descent:.3f}" if descent is not None else "not logged"))
    r, n = seed_correlation(exits)
    print(f"between seeds (each activation's means removed): Pearson r {r:.2f} over {n} runs")
    descents = [d for _, _, d in exits.values() if d is not None]
    print(f"over the last {LATE_STEPS} steps the loss falls {min(descents):.3f} to "
          f"{max(descents):.3f} nats ({len(descents)} runs)")
  if what == "stability":
    for name in TESTS:
      print(f"- {name} (fresh seeds; descriptive):")
      for arm, by_status in stability(name).items():
        for status, g in by_status.items() or [("none finished", {"runs": 0})]:
          ranges = "".join(f"; {label} {g[m][0]:.3g} to {g[m][1]:.3g}"
                           for m, label in STABILITY.items() if m in g)
          print(f"    {arm}, {g['runs']} {status}{ranges}")
      groups = by_stability(name)
      if len(groups) > 1:
        print("    A - B: " + "; ".join(
            f"{SEEDS_WHERE[g]} {n} pairs, {mean:+.3f}" + (f" (sd {sd:.3f})" if sd is not None else "")
            for g, (n, mean, sd) in groups.items()))
  if what == "excess":
    for study in ("relu_vs_gelu_cpu_epoch",):
      print(f"loss excess over the best LR, integrated over training ({study}):")
      for (act, lr), values in sorted(loss_excess(study).items()):
        print(f"  {act} {lr:g}: {np.mean(values):.3f} +- {np.std(values, ddof=1):.3f} "
              f"(seeds: {', '.join(f'{v:.3f}' for v in values)})")


if __name__ == "__main__":
  try:
    main(*sys.argv[1:])
  except ValueError as e:
    sys.exit(str(e))

"""The descriptive analyses RESULTS.md's prose cites beside the pre-registered families
(experiments/questions/primary.py), read from their committed runs under results/ (each test's
fresh runs in results/primary_<test>): none is a pre-registered test or changes a verdict
(`python -m actlab.ask experiments/questions/primary.py:<family> report --workdir=results`
prints those).

    python experiments/primary_descriptive.py \
        {plateau,stability,review,rerun,ladder,code_check,question NAME,excess,readme,
         figure [DIR]}

- `plateau`: when each encoder run of family 1 (tests 5–7) leaves the MLM plateau, beside where it
  ends and how far it still falls at its end; the correlation of the two between seeds.
- `stability`: each arm's stability measures (docs/metrics.md) over its fresh seeds, and A − B
  split by whether either arm of a seed is unstable, for families 1 and 2.
- `review`: per test of families 1 and 2 the fresh seeds' sd against the pilot's, the power at
  it, the Shapiro p and the exact sign-flip p; test 1's and `recipe_clip`'s pairs with and
  without a spike; how often clipping at 1.0 acted in `recipe_clip`'s early steps; family 3's
  unclipped gap against test 1's, and spike-only clipping's change of each arm's own loss.
- `rerun`: test 1's 78 runs trained again at a later commit (results/primary_relu_gelu_rerun,
  `experiments/primary_relu_gelu.json`) against the committed ones: the gap, its change per seed,
  the runs equal to the bit and the GELU seeds spiking in each.
- `ladder`: the ladder's pilot (results/ladder, experiments/questions/ladder.py): each cell's runs
  past 10x their initial gradient norm per LR, and its 200 runs trained twice on one GPU
  (`pilot_rerun.csv`): how far apart their test losses end, per LR, and their spikes; the fresh
  runs finished per rung, where, and their wall time (a vectorized program's shared among its
  runs; on a CPU one core a run, so their sum is core-hours; a resumed run's wall is its last
  start's), and their training time alone (`train_time_sec`: summed across resumes, evaluation
  and checkpoints left out); per answered contrast the Shapiro p of its per-seed values and its
  three lowest and highest seeds; per fresh cell the seeds past 10x and its largest ratio.
- `code_check`: 6 × 384's seeds 1020 and 1021, unclipped ReLU and GELU, trained again on one
  host at a1243bb and at 227de5a (results/ladder/code_check): the two commits against each other
  (the code's effect) and each against the committed run (the host's), on the test loss and every
  metrics row; one core a run as the committed runs trained, and one pair on two cores a run.
- `question NAME`: a question file's runs (results/NAME; `optimizer`, `mup_ladder`): each
  cell's pilot per LR (its mean validation loss, its runs past 10x) and its fresh runs (their
  mean test loss and sd, their runs past 10x, the largest ratio); per stage and in all, how
  many runs finished, from when to when, their wall time and training time as `ladder` counts.
- `excess`: the ReLU and GELU pilot's loss excess over each one's best LR, over training.
- `readme`: README's answer table, each verdict and interval as `actlab.ask ... report` prints it.
- `figure`: docs/img/activation_x_recipe.png (ReLU − GELU per recipe and block with its
  simultaneous interval), docs/img/factorial.png (family 3 per cell and per contrast) and
  docs/img/answers.png (README's: the primary answers against ±δ, and a spike), or into DIR.
"""

import csv
import datetime
import json
import pathlib
import runpy
import sys

import numpy as np
from scipy import stats

from actlab import ask
from actlab.report import answer as A
from actlab.report import comparisons, curves
from actlab.report import question as Q
from actlab.report import question_page as page
from actlab.report.tables import markdown_table
from actlab.run import rows as rows_lib

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "results"
QUESTIONS = ROOT / "experiments" / "questions" / "primary.py"
FIGURES = ROOT / "docs" / "img"
# An encoder run has left the MLM plateau (about 5.7 nats) once its validation [MASK] loss is
# below this: between the plateau and every run's end (2.3-3.6 nats).
PLATEAU_EXIT = 4.0
LATE_STEPS = 500  # a run still descending at its end: its loss falls over these last steps
EARLY_STEPS = 150  # `review`: the early steps at which clipping's reach is counted
STABILITY = {"grad_norm_max_rel": "largest gradient norm / its initial value",  # summary keys
             "attn_entropy_min": "least attention entropy (nats)",
             "attn_logit_max": "largest attention logit",
             "dead_units": "dead FFN units (fraction)"}
SEEDS_WHERE = {"stable": "both arms stable:", "unstable": "either arm unstable:"}


OWN_FILES = ("ladder", "optimizer")  # questions in a file of their own, their runs in results/<it>


def answered(family: str) -> tuple[ask.Asked, dict, dict, dict]:
  """A family as asked of results/ (or a question of its own file, of results/<it>): the
  question, its verdicts, its pilot's sizing, its LRs."""
  own = family in OWN_FILES
  spec = str(ROOT / "experiments" / "questions" / f"{family}.py") if own else (
      f"{QUESTIONS}:{family}")
  a = ask.Asked(spec, Q.load(spec), RESULTS / (family if own else ""))
  s = a.read()
  return a, A.verdicts(s, one_out=False), s.sizing, s.lrs


def arms(q: Q.Question, c: Q.Contrast) -> list[tuple[str, str]]:
  """A two-cell contrast's (activation, cell) of A and of B."""
  cells = sorted(c.weights, key=lambda cell: -c.weights[cell])
  return [(q.cells[cell]["model.activation"], cell) for cell in cells]


def plateau() -> None:
  a, v, _, _ = answered("page")
  exits = {}  # (activation, seed) -> (exit step, final test [MASK] loss, late descent)
  for c in a.q.contrasts:
    outcome = a.q.outcome_of(next(iter(c.weights)))[1]
    if outcome != "final_test_mask_loss":
      continue
    for (act, _, seed), run in curves.runs(RESULTS / f"primary_{c.name}").items():
      if seed in v[c.name]["seeds"]:  # GELU's runs, in each test's directory, counted once
        loss = curves.curve(run / "metrics.jsonl", "val_mask_loss")
        final = json.loads((run / "summary.json").read_text())[outcome]
        exits[act, seed] = (curves.first_below(loss, PLATEAU_EXIT), final,
                            curves.late_descent(loss, LATE_STEPS))
  print(f"encoder runs: the step their validation [MASK] loss falls below {PLATEAU_EXIT} nats "
        f"(interpolated), their final test [MASK] loss, and how far their validation [MASK] "
        f"loss falls over the last {LATE_STEPS} steps:")
  for (act, seed), (step, loss, descent) in sorted(exits.items()):
    print(f"  {act} seed {seed}: " + (f"{step:.0f}" if step is not None else "never")
          + f", {loss:.3f}, " + (f"{descent:.3f}" if descent is not None else "not logged"))
  r, n = curves.seed_correlation(exits)
  print(f"between seeds (each activation's means removed): Pearson r {r:.2f} over {n} runs")
  descents = [d for _, _, d in exits.values() if d is not None]
  print(f"over the last {LATE_STEPS} steps the loss falls {min(descents):.3f} to "
        f"{max(descents):.3f} nats ({len(descents)} runs)")


def stability() -> None:
  for family in ("page", "recipe"):
    a, v, _, lrs = answered(family)
    fresh = a.runs("fresh")
    run = lambda cell, seed: fresh[cell][lrs[cell], seed]
    for c in a.q.contrasts:
      print(f"- {c.name} (fresh seeds; descriptive):")
      r = v[c.name]
      if r is None:
        print("    no fresh seed finished")
        continue
      for arm, cell in arms(a.q, c):
        summaries = [run(cell, s) for s in r["seeds"]]
        for status in sorted({s["status"] for s in summaries}):
          g = [s for s in summaries if s["status"] == status]
          print(f"    {arm}, {len(g)} {status}" + "".join(
              f"; {label} {min(s[m] for s in g):.3g} to {max(s[m] for s in g):.3g}"
              for m, label in STABILITY.items()))
      groups = {}
      for seed, x in zip(r["seeds"], r["values"]):
        unstable = any(run(cell, seed)["status"] != "stable" for _, cell in arms(a.q, c))
        groups.setdefault("unstable" if unstable else "stable", []).append(x)
      if len(groups) > 1:
        print("    A - B: " + "; ".join(
            f"{SEEDS_WHERE[g]} {len(d)} pairs, {np.mean(d):+.3f}"
            + (f" (sd {np.std(d, ddof=1):.3f})" if len(d) > 1 else "")
            for g, d in sorted(groups.items())))


def review() -> None:
  found = {}  # contrast -> (its family as asked, its verdict, the family's LRs)
  for family in ("page", "recipe"):
    a, v, sizing, lrs = answered(family)
    for c in a.q.contrasts:
      r, pilot_sd = v[c.name], sizing["contrasts"][c.name]["sd"]
      d, x = r["paired"], r["values"]
      print(f"- {c.name}: fresh sd {d.sd:.4f} / pilot sd {pilot_sd:.4f} = {d.sd / pilot_sd:.2f}; "
            f"power against delta at the fresh sd "
            f"{comparisons.paired_power(d.n, d.sd, a.q.margins[0], a.q.alpha):.2f} ({d.n} pairs); "
            f"Shapiro p {stats.shapiro(x).pvalue:.2g}; exact sign-flip p "
            f"{comparisons.sign_flip_p(x):.3g} "
            f"({arms(a.q, c)[0][0]} lower in {sum(y < 0 for y in x)} of {d.n})")
      found[c.name] = (a, r, lrs)
  without = {}
  for name in ("relu_gelu", "recipe_clip"):
    a, r, _ = found[name]
    by_seed, spikes = dict(zip(r["seeds"], r["values"])), r["spikes"]["spiking_seeds"]
    without[name] = [x for s, x in by_seed.items() if s not in spikes]
    print(f"{name}: {len(spikes)} of {len(r['seeds'])} seeds spike (> {a.q.spike:g}x), their "
          f"pairs {min(by_seed[s] for s in spikes):+.3f} to {max(by_seed[s] for s in spikes):+.3f}"
          f"; the other {len(without[name])} pairs {np.mean(without[name]):+.4f} (sd "
          f"{np.std(without[name], ddof=1):.4f}); all {r['paired'].mean:+.4f}: the spiking seeds "
          f"carry {r['spikes']['carried']:+.4f}")
  welch = stats.ttest_ind(without["relu_gelu"], without["recipe_clip"], equal_var=False)
  print(f"pairs without a spike, relu_gelu against recipe_clip: Welch p {welch.pvalue:.2g}")
  a, r, lrs = found["recipe_clip"]
  fresh, dirs = a.read().fresh, curves.runs(RESULTS / "primary_recipe_clip")
  for arm, cell in arms(a.q, next(c for c in a.q.contrasts if c.name == "recipe_clip")):
    clip = a.q.cells[cell]["optim.clip_norm"]
    early = [g for s in r["seeds"] for step, g in curves.curve(
        dirs[arm, lrs[cell], s] / "metrics.jsonl", "grad_norm").items() if step <= EARLY_STEPS]
    first = [fresh[cell][lrs[cell], s]["grad_norm_init"] for s in r["seeds"]]
    print(f"recipe_clip, {arm}: the gradient norm is above clip_norm {clip:g} at "
          f"{sum(g > clip for g in early)} of {len(early)} logged steps <= {EARLY_STEPS} "
          f"({len(r['seeds'])} runs); at step 0 {min(first):.2f}-{max(first):.2f}")
  factorial_against_test_1(found["relu_gelu"][1])


def factorial_against_test_1(test1: dict) -> None:
  """Family 3's unclipped gap in GPT-2's block against test 1's (its spike counts, Welch, Fisher,
  the 79 pairs together), and what spike-only clipping does to each arm's own loss; descriptive."""
  a, v, _, lrs = answered("factorial")
  fresh, gap = a.read().fresh, v["relu_gelu"]
  t1, f3 = test1["values"], gap["values"]
  spikes = [len(r["spikes"]["spiking_seeds"]) for r in (test1, gap)]
  fisher = stats.fisher_exact([[spikes[0], len(t1) - spikes[0]], [spikes[1], len(f3) - spikes[1]]])
  both = comparisons.paired_difference(t1 + f3, [0.0] * (len(t1) + len(f3)))
  print(f"ReLU - GELU unclipped, GPT-2's block: test 1 {np.mean(t1):+.3f} ({len(t1)} pairs, "
        f"{spikes[0]} spiking), family 3 {np.mean(f3):+.3f} ({len(f3)} pairs, {spikes[1]} "
        f"spiking); Welch p {stats.ttest_ind(t1, f3, equal_var=False).pvalue:.2g}, Fisher p of "
        f"the spike counts {fisher.pvalue:.2g}; the {both.n} pairs together {both.mean:+.3f} "
        f"[{both.ci_low:+.3f}, {both.ci_high:+.3f}]")
  for act in ("gelu", "relu"):
    spike, none = (f"{act}_{clip}_gpt2" for clip in ("spike", "none"))
    loss = lambda cell: [fresh[cell][lrs[cell], s]["final_test_loss"] for s in gap["seeds"]]
    d = comparisons.paired_difference(loss(spike), loss(none))
    print(f"family 3, {act}: spike-only clipping - none, its own test loss {d.mean:+.3f} "
          f"[{d.ci_low:+.3f}, {d.ci_high:+.3f}] ({d.n} seeds)")


def rerun() -> None:
  """Test 1's committed runs against its rerun, seed by seed; descriptive."""
  studies = ("primary_relu_gelu", "primary_relu_gelu_rerun")
  seeds = sorted(int(p.parent.name.rsplit("=", 1)[1])
                 for p in (RESULTS / studies[1]).glob("activation=relu,seed=*/summary.json"))
  runs = {study: {(act, s): json.loads((RESULTS / study / f"activation={act},seed={s}"
                                        / "summary.json").read_text())
                  for act in ("relu", "gelu") for s in seeds} for study in studies}
  gap = {}
  for study in studies:
    loss = lambda act, study=study: [runs[study][act, s]["final_test_loss"] for s in seeds]
    gap[study] = np.subtract(loss("relu"), loss("gelu"))
    d = comparisons.paired_difference(loss("relu"), loss("gelu"))
    spiking = [s for s in seeds if runs[study]["gelu", s]["grad_norm_max_rel"] > 10]
    print(f"{study}: ReLU - GELU {d.mean:+.3f} [{d.ci_low:+.3f}, {d.ci_high:+.3f}] ({d.n} seeds); "
          f"GELU past 10x its initial gradient norm in {len(spiking)}: {spiking}")
  change = gap[studies[1]] - gap[studies[0]]
  equal = sum(runs[studies[0]][k]["final_test_loss"] == runs[studies[1]][k]["final_test_loss"]
              for k in runs[studies[0]])
  print(f"rerun - committed, per seed's gap: mean {change.mean():+.4f}, sd "
        f"{change.std(ddof=1):.4f}, largest {np.abs(change).max():.4f}; {equal} of "
        f"{2 * len(seeds)} runs' test loss equal to the bit")


CODE_CHECK = RESULTS / "ladder" / "code_check"  # 6 × 384's seeds 1020, 1021 trained again


def code_check() -> None:
  """The ladder's 6 × 384 code check (descriptive): seeds 1020 and 1021's unclipped ReLU and GELU
  runs trained again on one host at a1243bb (where 2 × 128 and most of 6 × 384 trained) and at
  227de5a (where 21 run segments of 6 × 384 trained), against each other (the code's effect) and
  each against the committed fresh run (the host's), on `final_test_loss` and every metrics row
  (time measures aside); one core a run, as the committed runs trained (`cpus` 1), and one pair
  on two cores a run (`two_cores/`)."""
  def run(where: pathlib.Path) -> tuple[dict, list[dict]]:
    rows = [json.loads(line) for line in (where / "metrics.jsonl").read_text().splitlines()]
    return (json.loads((where / "summary.json").read_text()),
            [rows_lib.untimed(r) for r in rows])

  def same(a, b) -> str:
    (summary_a, rows_a), (summary_b, rows_b) = a, b
    change = summary_b["final_test_loss"] - summary_a["final_test_loss"]
    equal = sum(x == y for x, y in zip(rows_a, rows_b))
    said = "equal to the bit" if change == 0 else f"{change:+.4f} (the second less the first)"
    return f"test loss {said}, {equal} of {max(len(rows_a), len(rows_b))} metrics rows equal"

  for where, said in ((CODE_CHECK, "one core a run, as the committed runs"),
                      (CODE_CHECK / "two_cores", "two cores a run")):
    for name in sorted(p.name for p in (where / "a1243bb").glob("arm=*")):
      old, new = (run(where / commit / name) for commit in ("a1243bb", "227de5a"))
      committed = run(RESULTS / "ladder" / "fresh-_6x384" / name)
      print(f"{name} ({said}): final_test_loss {old[0]['final_test_loss']:.6f} at a1243bb, "
            f"{new[0]['final_test_loss']:.6f} at 227de5a, {committed[0]['final_test_loss']:.6f} "
            f"committed; a1243bb vs 227de5a: {same(old, new)}; committed vs a1243bb: "
            f"{same(committed, old)}; committed vs 227de5a: {same(committed, new)}")


def ladder() -> None:
  """The ladder's pilot: spikes per cell and LR, and its GPU rerun's spread; descriptive."""
  spec = str(ROOT / "experiments" / "questions" / "ladder.py")
  q = Q.load(spec)
  stages = ask.Asked(spec, q, RESULTS / "ladder").read()
  pilot = stages.pilot
  for cell in q.cells:
    counts = {lr: (sum(pilot[cell][lr, s]["grad_norm_max_rel"] > q.spike for s in q.pilot.seeds),
                   len(q.pilot.seeds))
              for lr in sorted({lr for lr, _ in pilot[cell]})}
    print(f"{cell}: past {q.spike:g}x at LR " + ", ".join(f"{lr:g} {k} of {n}"
                                                          for lr, (k, n) in counts.items()))
  with open(RESULTS / "ladder" / "pilot_rerun.csv", newline="") as f:
    rows = list(csv.DictReader(f))
  gap = lambda r: abs(float(r["final_test_loss"]) - float(r["final_test_loss_rerun"]))
  spiked = [(float(r["grad_norm_max_rel"]) > q.spike, float(r["grad_norm_max_rel_rerun"]) > q.spike)
            for r in rows]
  apart = np.array([gap(r) for r in rows])
  print(f"trained twice, {len(rows)} runs: |test loss apart| median {np.median(apart):.3f}, 90% "
        f"{np.quantile(apart, 0.9):.3f}, at most {apart.max():.2f}; past {q.spike:g}x in both "
        f"{sum(a and b for a, b in spiked)}, in one only {sum(a != b for a, b in spiked)}")
  for lr in q.pilot.lrs:
    at = [gap(r) for r in rows if f",lr={lr:g}," in r["run"]]
    print(f"  at LR {lr:g}: median {np.median(at):.3f} ({len(at)} runs)")
  fresh = stages.fresh
  for rung in sorted({cell.rsplit("_", 1)[1] for cell in q.cells}):
    runs = [s for cell in q.cells if cell.endswith(rung) for s in fresh.get(cell, {}).values()
            if "wall_time_sec" in s]
    print(f"fresh {rung}: {len(runs)} runs finished")
    print("\n".join(spent(runs)))
  v = A.verdicts(stages, one_out=False)
  for c in q.contrasts:
    if c.name not in page.unanswered(q, v):
      by_value = sorted(zip(v[c.name]["values"], v[c.name]["seeds"]))
      seeds = lambda part: ", ".join(f"{seed} {x:+.3f}" for x, seed in part)
      print(f"{c.name}: Shapiro p {stats.shapiro([x for x, _ in by_value]).pvalue:.2g}; lowest "
            f"{seeds(by_value[:3])}; highest {seeds(by_value[:-4:-1])}")
  for cell, runs in fresh.items():
    rel = {seed: run["grad_norm_max_rel"] for (_, seed), run in sorted(runs.items())}
    past = [f"{seed} {r:.1f}x" for seed, r in rel.items() if r > q.spike]
    print(f"fresh {cell}: past {q.spike:g}x in {len(past)} of {len(rel)}"
          + (f" ({', '.join(past)})" if past else "") + f"; largest {max(rel.values()):.2f}x")


def spent(runs: list[dict]) -> list[str]:
  """What finished runs cost, a line per device: the wall a run (a vectorized program's shared
  among its runs; on a CPU one core a run, so their sum is core-hours; a resumed run's wall is its
  last start's) and the training time alone (`train_time_sec`: summed across resumes)."""
  lines = []
  for device in sorted({where(s) for s in runs}):
    here = [s for s in runs if where(s) == device]
    walls = np.array([A.run_wall(s) for s in here])
    resumed = sum(len(s["provenance"]) > 1 for s in here)
    # A vectorized program's training time shared among its runs, as `run_wall` shares its wall
    trained = sum(s["train_time_sec"] / s.get("vectorized_runs", 1) for s in here) / 3600
    lines.append(f"  on {device}: {len(walls)}, {walls.mean():.0f} s a run"
                 + (f" (sd {walls.std(ddof=1):.0f})" if len(walls) > 1 else "")
                 + f", {walls.sum() / 3600:.1f} h summed"
                 + (f"; {resumed} resumed, whose wall is their last start's" if resumed else "")
                 + f"; training alone, across resumes: {trained:.1f} h summed")
  return lines


def question(name: str) -> None:
  """A question file's runs (results/<name>/, experiments/questions/<name>.py): each cell's pilot
  per LR (the mean of the outcome it is chosen on, the runs past the spike threshold) and its
  fresh runs (the mean of the outcome tested, the runs past it, the largest ratio), then per
  stage how many runs finished, what they cost (`spent`), and the span from the first run's
  start to the last one's end (pauses and the host's other work inside it)."""
  if not (RESULTS / name / "question.json").is_file():
    sys.exit(f"error: results/{name} holds no question's runs; name one of results/'s question "
             "directories (optimizer, mup_ladder)")
  spec = str(ROOT / "experiments" / "questions" / f"{name}.py")
  q = Q.load(spec)
  stages = ask.Asked(spec, q, RESULTS / name).read()
  for cell in q.cells:
    runs, chosen, outcome = stages.pilot[cell], stages.choices[cell], q.outcome_of(cell)[0]
    per_lr = {lr: [run for (at, _), run in runs.items() if at == lr]
              for lr in sorted({lr for lr, _ in runs})}
    print(f"pilot {cell}, mean {outcome} (runs past {q.spike:g}x): " + ", ".join(
        f"{lr:g} {np.mean([r[outcome] for r in at]):.3f} "
        f"({sum(r['grad_norm_max_rel'] > q.spike for r in at)} of {len(at)})"
        for lr, at in per_lr.items()) + f"; {chosen[0]} {chosen[1]}")
  for cell in [cell for cell in q.cells if cell in (stages.fresh or {})]:
    runs, outcome = stages.fresh[cell], q.outcome_of(cell)[1]
    values = [run[outcome] for run in runs.values()]
    print(f"fresh {cell} at {stages.lrs[cell]:g}: mean {outcome} {np.mean(values):.3f} (sd "
          f"{np.std(values, ddof=1):.3f}, {len(values)} runs), past {q.spike:g}x in "
          f"{sum(run['grad_norm_max_rel'] > q.spike for run in runs.values())} (largest "
          f"{max(run['grad_norm_max_rel'] for run in runs.values()):.2f}x)")
  stage_runs = {stage.name: [json.loads(f.read_text())
                             for f in sorted(stage.glob("arm=*/summary.json"))]
                for stage in (RESULTS / name).iterdir() if stage.is_dir()}
  started = lambda s: datetime.datetime.fromisoformat(s["provenance"][0]["started"])
  ended = lambda s: (datetime.datetime.fromisoformat(s["provenance"][-1]["started"])
                     + datetime.timedelta(seconds=s["wall_time_sec"]))
  total = []
  for stage, runs in sorted(((k, v) for k, v in stage_runs.items() if v),
                            key=lambda kv: min(map(started, kv[1]))):
    total += runs
    print(f"{stage}: {len(runs)} runs finished, {min(map(started, runs)):%Y-%m-%d %H:%M} to "
          f"{max(map(ended, runs)):%Y-%m-%d %H:%M} UTC")
    print("\n".join(spent(runs)))
  print(f"all stages: {len(total)} runs")
  print("\n".join(spent(total)))


def where(summary: dict) -> str:
  """The device a run last started on, with the host's CPU where its provenance records it."""
  p = summary["provenance"][-1]
  return p["device_kind"] + (f" ({p['host_cpu']})" if "host_cpu" in p else "")


def excess() -> None:
  study = "relu_vs_gelu_cpu_epoch"  # family 1's pilot of ReLU and GELU
  print(f"loss excess over the best LR, integrated over training ({study}):")
  for (act, lr), values in sorted(curves.loss_excess(RESULTS / study).items()):
    print(f"  {act} {lr:g}: {np.mean(values):.3f} +- {np.std(values, ddof=1):.3f} "
          f"(seeds: {', '.join(f'{v:.3f}' for v in values)})")


RECIPE_WORDS = {"relu_gelu": "no clipping, warm-up 45, d 128\n(family 1, test 1)",
                "recipe_clip": "clipping at 1.0", "recipe_warmup": "warm-up 180",
                "recipe_wide": "d 256, FFN 1,024", "recipe_clip_warmup": "clipping + warm-up 180",
                "modern_relu_gelu": "LLaMA-style block",
                "modern_relu2_gelu": "LLaMA-style block,\nReLU² − GELU"}
CONTRAST_WORDS = {"relu_gelu": "GPT-2's block, unclipped",
                  "clip_change": "clipped at 1.0 − unclipped",
                  "spike_change": "spike-only − unclipped",
                  "spike_vs_clip": "spike-only − clipped at 1.0",
                  "block_change": "LLaMA-style − GPT-2's block, unclipped"}


def figure(directory: str = str(FIGURES)) -> None:
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel
  recipe = answered("recipe")
  v = {**answered("page")[1], **recipe[1]}
  rows = [(f"{label}\n({v[name]['paired'].n} pairs)", v[name]["paired"].mean, *v[name]["interval"])
          for name, label in RECIPE_WORDS.items() if v[name] is not None]
  fig, ax = plt.subplots(figsize=(6.4, 0.7 * len(rows) + 1.2))
  page.draw_intervals(ax, rows, recipe[0].q.margins)
  ax.set_xlabel("ReLU − GELU, final test loss (nats): mean and simultaneous interval; ±δ dashed")
  fig.tight_layout()
  save(fig, pathlib.Path(directory) / "activation_x_recipe.png")
  a, v, _, _ = answered("factorial")
  if v[a.q.contrasts[0].name] is None:
    print("family 3: no seed finished in every cell; no figure")
    return
  words = runpy.run_path(str(QUESTIONS))  # the question's words for each clipping and block
  cells = [(f"{words['BLOCK'][b][1].removeprefix('in ')}, {words['CLIPPINGS'][c][1]}",
            (d := v[f"relu_gelu_{c}_{b}"]["paired"]).mean, d.ci_low, d.ci_high)
           for b in words["BLOCK"] for c in words["CLIPPINGS"]]
  contrasts = [(f"{c.name}\n{CONTRAST_WORDS[c.name]}", v[c.name]["paired"].mean,
                *v[c.name]["interval"]) for c in a.q.contrasts]
  panels = zip((cells, contrasts), ("ReLU − GELU per cell: mean, 95% interval (descriptive)",
                                    f"contrasts: mean, simultaneous interval (α/{a.q.k})"))
  fig, axes = plt.subplots(2, 1, figsize=(7.0, 6.4), height_ratios=(6, 5), sharex=True)
  for ax, (rows, title) in zip(axes, panels):
    page.draw_intervals(ax, rows, a.q.margins)
    ax.set_title(title, fontsize=9)
  m = a.q.margins
  axes[-1].set_xlabel(f"final test loss (nats); ±{m[0]:g} dashed, ±{m[1]:g} dotted; n = "
                      f"{len(v[a.q.contrasts[0].name]['seeds'])}", fontsize=9)
  fig.tight_layout()
  save(fig, pathlib.Path(directory) / "factorial.png")
  answers(directory)


ANSWERS = {  # README's table and figure: (family, contrast) -> (A − B, its setting)
    ("page", "relu_gelu"): ("ReLU − GELU", "GPT-2's block, no clipping"),
    ("factorial", "relu_gelu"): ("the same, again on new seeds", "family 3, one LR for all cells"),
    ("recipe", "recipe_clip"): ("ReLU − GELU", "clipping at 1.0"),
    ("factorial", "clip_change"): ("its change under clipping at 1.0", "family 3"),
    ("factorial", "spike_change"): ("its change under spike-only clipping (10×)", "family 3"),
    ("recipe", "recipe_warmup"): ("ReLU − GELU", "warm-up 180 of 450 steps"),
    ("recipe", "recipe_wide"): ("ReLU − GELU", "d_model 256 (1.6M)"),
    ("recipe", "modern_relu_gelu"): ("ReLU − GELU", "LLaMA-style block, plain FFN"),
    ("recipe", "modern_relu2_gelu"): ("ReLU² − GELU", "LLaMA-style block, plain FFN"),
    ("page", "swiglu_silu"): ("SwiGLU − SiLU", "GPT-2's block"),
    ("page", "reglu_relu"): ("ReGLU − ReLU", "GPT-2's block"),
    ("page", "geglu_gelu"): ("GEGLU − GELU", "GPT-2's block"),
    ("page", "bert_relu_gelu"): ("ReLU − GELU, `[MASK]` loss", "BERT, 3,000 steps"),
    ("page", "bert_tanh_gelu"): ("tanh − GELU, `[MASK]` loss", "BERT, 3,000 steps"),
    ("page", "bert_swiglu_gelu"): ("SwiGLU − GELU, `[MASK]` loss", "BERT, 3,000 steps"),
    ("ladder", "gap_none_2x128"): ("ReLU − GELU", "2 × 128 (0.41M), no clipping"),
    ("ladder", "gap_clip_2x128"): ("ReLU − GELU", "2 × 128, clipping at 1.0"),
    ("ladder", "clip_change_2x128"): ("its change from unclipped to clipped at 1.0", "2 × 128"),
    ("ladder", "gap_none_4x256"): ("ReLU − GELU", "4 × 256 (3.2M), no clipping"),
    ("ladder", "gap_clip_4x256"): ("ReLU − GELU", "4 × 256, clipping at 1.0"),
    ("ladder", "clip_change_4x256"): ("its change from unclipped to clipped at 1.0", "4 × 256"),
    ("ladder", "gap_none_6x384"): ("ReLU − GELU", "6 × 384 (10.7M), no clipping"),
    ("ladder", "gap_clip_6x384"): ("ReLU − GELU", "6 × 384, clipping at 1.0"),
    ("ladder", "clip_change_6x384"): ("its change from unclipped to clipped at 1.0", "6 × 384"),
    ("ladder", "scale_change_none"): ("its change from 2 × 128 to 6 × 384", "no clipping"),
    ("ladder", "scale_change_clip"): ("its change from 2 × 128 to 6 × 384", "clipping at 1.0"),
    ("optimizer", "relu_gelu_adamw"): ("ReLU − GELU", "AdamW, 2 × 128, no clipping"),
    ("optimizer", "relu_gelu_muon"): ("ReLU − GELU", "Muon, 2 × 128"),
    ("optimizer", "relu_gelu_change"): ("its change from AdamW to Muon", "2 × 128"),
    ("optimizer", "relu2_gelu_adamw"): ("ReLU² − GELU", "AdamW, 2 × 128"),
    ("optimizer", "relu2_gelu_muon"): ("ReLU² − GELU", "Muon, 2 × 128"),
    ("optimizer", "relu2_gelu_change"): ("its change from AdamW to Muon", "2 × 128")}


def shown(found: dict | None = None) -> list[tuple]:
  """README's answers that are in: (family, its question, contrast, verdict, LRs, (A − B,
  setting)), a ladder contrast once its planned fresh seeds are all in; `found`: each family
  `answered` already."""
  out, found = [], found or {f: answered(f) for f in {f for f, _ in ANSWERS}}
  for (f, name), words in ANSWERS.items():
    a, v, _, lrs = found[f]
    c = next(c for c in a.q.contrasts if c.name == name)
    if name not in page.unanswered(a.q, v):
      out.append((f, a.q, c, v[name], lrs, words))
  return out


def readme(found: dict | None = None) -> None:
  """README's answer table: each answer's verdict at ±0.1 and simultaneous interval as
  `actlab.ask ... report` prints them (`found`: as `shown` takes it)."""
  rows = [[f"`{c.name}` ({f})", *words, page.lr_of(c, lrs), str(len(r["seeds"])),
           f"**{r['margins'][0.1]['verdict'].words(c.negative, c.positive)}**",
           f"[{page.signed(r['interval'][0])}, {page.signed(r['interval'][1])}]"]
          for f, q, c, r, lrs, words in shown(found)]
  print(markdown_table(["contrast (family)", "question (A − B)", "setting", "LR", "pairs",
                        "verdict at ±0.1", "simultaneous interval"], rows))


SPIKE_SEED = 101  # test 1's seed whose GELU run spikes at step 31 (RESULTS.md)


def answers(directory: str = str(FIGURES)) -> None:
  """docs/img/answers.png: the primary answers' simultaneous intervals against ±δ, and beside them
  one seed of test 1, GELU's gradient norm (the largest since the last logged row) jumping in
  warm-up where ReLU's does not."""
  from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel
  answers_ = shown()
  rows = [(f"{words[0]}, {words[1]} ({len(r['seeds'])})", r["paired"].mean, *r["interval"])
          for _, _, _, r, _, words in answers_]
  fig, (left, right) = plt.subplots(1, 2, figsize=(12.5, 0.45 * len(rows) + 1.5),
                                    width_ratios=(3, 2))
  page.draw_intervals(left, rows, (0.1,), [(c.negative, c.positive) for _, _, c, *_ in answers_])
  left.set_xlabel("A − B, final test loss (nats; BERT: [MASK] loss): mean and simultaneous "
                  "interval; ±δ = 0.1 dashed", fontsize=8)
  for act, color in (("gelu", "tab:red"), ("relu", "tab:blue")):
    run = RESULTS / "primary_relu_gelu" / f"activation={act},seed={SPIKE_SEED}"
    init = json.loads((run / "summary.json").read_text())["grad_norm_init"]
    rel = {s: g / init for s, g in curves.curve(run / "metrics.jsonl", "grad_norm_max").items()
           if s <= 150}
    right.plot(list(rel), list(rel.values()), "o-", ms=3, color=color, label=act.replace(
        "gelu", "GELU").replace("relu", "ReLU"))
  right.axvline(45, color="0.6", lw=1, ls=":")
  right.axhline(10, color="0.3", lw=1, ls="--")
  right.set_yscale("log")
  right.set_xlabel(f"step (test 1, seed {SPIKE_SEED}; warm-up ends at 45)", fontsize=8)
  right.set_ylabel("largest gradient norm since the last row / its initial value", fontsize=8)
  right.legend(fontsize=8)
  fig.tight_layout()
  save(fig, pathlib.Path(directory) / "answers.png")


def save(fig, path: pathlib.Path) -> None:
  fig.savefig(path, dpi=120)
  print(f"wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")


COMMANDS = {"plateau": plateau, "stability": stability, "review": review, "rerun": rerun,
            "ladder": ladder, "code_check": code_check, "question": question, "excess": excess,
            "figure": figure, "readme": readme}

if __name__ == "__main__":
  command = sys.argv[1] if len(sys.argv) > 1 else ""
  least, most = {"question": (1, 1), "figure": (0, 1)}.get(command, (0, 0))
  if command not in COMMANDS or not least <= len(sys.argv) - 2 <= most:
    sys.exit("usage: python experiments/primary_descriptive.py {plateau,stability,review,rerun,"
             "ladder,code_check,question NAME,excess,readme,figure [DIR]}")
  COMMANDS[command](*sys.argv[2:])

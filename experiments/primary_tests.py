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
  each arm's stability measures over its fresh seeds, descriptive; `... review`: the fresh sds
  against the pilots', the power at them, the sign-flip p and the spiking seeds' share). A test
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

**The mechanism family (family 3, K = 5; stated 2026-11-26, before any of its runs).** Families
1 and 2 tell a story read across separate experiments, on different seeds and LRs: that GELU's
warm-up spikes cost it test 1's gap, that clipping at 1.0 removes the cost by acting on the
spike, that the LLaMA-style block removes the spike. Family 3 asks it in one design (`FACTORIAL`):
ReLU and GELU × {no clipping, clipping at global norm 1.0, spike-only clipping at 10× the run's
own gradient norm at its first step (`optim.spike_clip=10`, the stability rule's threshold)} ×
{GPT-2's block, the LLaMA-style block with a plain FFN (`MODERN_BLOCK`)}: 12 cells, test 1's
recipe otherwise (the `cpu_epoch` decoder and schedule: 45 warm-up steps of 450, d_model 128),
**one LR for every cell, 3e-3** (where test 1 and the modern block's tests ran; no LR is chosen),
and **the same seeds in all 12 cells**, so that every contrast is paired by seed. The untied
head is decayed (weight decay on every matrix, `core.step.decay_mask` as of 2026-11-26): the
LLaMA-style cells decay their head, which family 2's modern tests did not.
- **The primary contrasts**, each per seed a linear combination of cells, with D(c, b) =
  ReLU − GELU (final test loss) under clipping c in block b:
  1. `relu_gelu`: D(none, GPT-2): test 1 again, on new seeds;
  2. `clip_change`: D(clip 1.0, GPT-2) − D(none, GPT-2): its change under clipping at 1.0;
  3. `spike_change`: D(spike-only, GPT-2) − D(none, GPT-2): its change under spike-only clipping;
  4. `spike_vs_clip`: D(spike-only, GPT-2) − D(clip 1.0, GPT-2): spike-only against full clipping;
  5. `block_change`: D(none, LLaMA-style) − D(none, GPT-2): its change from GPT-2's block to the
     LLaMA-style one, unclipped.
  No other contrast is tested. Descriptive beside them (unadjusted 95% intervals): D in each of
  the six (clipping, block) cells, and D's change under each clipping in the LLaMA-style block.
- **The claim rule** above with K = 5: each contrast's simultaneous interval at 1 − 0.05/5, held
  against ±δ **at δ = 0.1 (the rule's) and at 0.05**, the TOST Holm-adjusted over the five at
  each margin; the Holm-adjusted p of no difference beside it.
- **An exact sign-flip test beside each interval**: the two-sided test of the same seeds'
  contrast values over all 2^n sign patterns (`preregistered.sign_flip_p`), Holm-adjusted over
  the five. How a disagreement is read, stated now: a direction (A lower or higher, by any
  amount) is claimed only where the interval excludes 0 and the sign-flip test rejects 0 at α;
  where one finds a direction and the other does not, the verdict claims none (an equivalence,
  the TOST's, stands), the page says which test disagrees, and the disagreement is read as the
  t interval's normality failing on a mixture of spiking and non-spiking seeds (or the sign-flip
  test's weakness against a few large values), not as evidence for either side. The size against
  ±δ is always the interval's.
- **The pilot** (`:factorial_pilot`): the 12 cells × seeds 300–304, which no run of any family
  used and no test reads: 60 runs.
- **Sizing.** Each contrast's sd over the pilot's 5 seeds is replaced by its upper one-sided 80%
  confidence bound (χ² with 4 df: 1.56 × the sd; `preregistered.sd_upper`), not its point
  estimate; a contrast asks for the smallest n whose paired t-test has power 0.8 against δ = 0.1
  at α/5 at that sd. The family runs the largest n any contrast asks for, **at least 20 shared
  seeds** and at most `FACTORIAL_CAP` = 40 (the budget: 480 runs, about 17–33 core-hours at
  130–250 s a run). Where a contrast asks for more than the cap, the plan states each contrast's
  power at the cap (at its bound) and the difference it detects with 80% power; the pilot is
  committed with that before any fresh run (`python experiments/primary_tests.py plan`).
- **Fresh seeds** (`:factorial`): `FACTORIAL_FRESH_SEED` = 400 on, n of them, in all 12 cells,
  one process per core (`--workers=2`, as the pilots). No platform reruns: the decoder's
  platform shift of A − B had an sd of at most 0.025 nats in families 1 and 2. A seed where a
  run diverges (no finite test loss) is left out of every contrast and named on the page; a
  pilot run without one stops the sizing until what to do is stated.
- **A secondary analysis, stated now** (descriptive): how much of each contrast's mean the
  spiking seeds carry. A seed spikes in a contrast where a run of a cell the contrast weighs
  passes 10× its initial gradient norm (the stability rule's threshold; the norm before
  clipping); what they carry is the mean over all seeds less the mean over the seeds without a
  spike (`factorial.spiking_share`).
- The family is corrected alone, apart from families 1 and 2, whose verdicts it leaves as they
  are.

**Family 1's re-tests (stated 2026-11-26, before any of their runs).** Tests 2–4's gated arms
(SwiGLU, GEGLU, ReGLU) and SiLU chose 1e-3, the lowest LR of their pilot's grid, before family 2's
rule of one step past an edge existed. Their pilot now gets that step (`:gated_edge`: each of the
four whose best of {1e-3, 3e-3, 1e-2} is 1e-3, at 3e-4, on the pilot's seeds 0–2), and each arm
chooses among its four LRs as in family 2 (an arm again best at the edge says so on the page; no
second step). A test whose choice moves for either arm is asked again on new seeds at the new LRs
(`RETEST`, `:<test>_retest`): fresh seeds from `RETEST_FRESH_SEED` = 600 (no run of any family
used them), n from the extended pilot's paired sd at the new LRs by the power rule above at α/3,
at least 10 pairs and at most 40; no platform reruns. The three re-tests are a family of their
own, K = 3 whether or not each runs (one whose choice stands is not re-run and counts as p = 1),
corrected alone; the page shows each re-test beside its old row, which keeps its verdict at its
old LR.

The sweeps: `:<test>` trains a test's fresh seeds; `:gated_pilot` the 3-LR pilot of the gated
FFNs and SiLU (ReLU and GELU have theirs: results/relu_vs_gelu_cpu_epoch), which picks the LRs of
tests 2–4; the encoder's pilot is `experiments/bert_ffn_activation.py:past_plateau_pilot`;
`:gated_edge` the step below it; `:factorial_pilot` and `:factorial` family 3's pilot and fresh
seeds.
"""

import itertools
import json
import pathlib
import sys

import numpy as np
from scipy import stats

from actlab.config import BLOCKS, GPT2_BLOCK, sizes
from actlab.report import comparisons, curves, factorial, preregistered

RULE = preregistered.Rule(alpha=0.05, power=0.8, delta=0.1, min_seeds=10)  # every family's
MAX_SEEDS = {"decoder": None, "encoder": 10,  # the seed pairs this machine can afford
             "recipe": 40, "recipe_wide": 20}
FRESH_SEED = 100  # fresh seeds are 100, 101, …: every pilot used seeds below 10
RECIPE_FRESH_SEED = 200  # the recipe family's: no run of either family used them
PLATFORM_SEEDS = 3  # the first fresh seeds, rerun for the platform sd (both arms of each)
PILOT_LRS = [1e-3, 3e-3, 1e-2]
DECODER = sizes.SIZES["cpu_epoch"]  # 0.94M parameters, one epoch of the TinyStories sample
ENCODER = {**sizes.SIZES["bert_cpu_past_plateau"], "model.kind": "encoder", "model.task": "mlm"}
# The outcome each model reads (chosen on, tested on): the encoder's is the loss at [MASK].
OUTCOME = {"decoder": ("final_val_loss", "final_test_loss"),
           "encoder": ("final_val_mask_loss", "final_test_mask_loss")}

# Family 1, the page's seven tests: name -> (question, A, B, the fixed settings both arms share,
# the pilot's results dirs).
PLAIN = ("relu_vs_gelu_cpu_epoch",)  # ReLU's and GELU's pilot
GATED = ("primary_gated_pilot", *PLAIN)  # the gated FFNs' and SiLU's, beside it
PAGE = {
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
# Family 2: ReLU − GELU on the decoder under other recipes (name -> the fields they change).
RECIPES = {"clip": {"optim.clip_norm": 1.0},
           "warmup": {"optim.warmup_steps": 180},
           "wide": {"model.d_model": 256, "model.d_ff": 1024, "model.num_heads": 8},
           "clip_warmup": {"optim.clip_norm": 1.0, "optim.warmup_steps": 180}}
RECIPE_PILOT_SEEDS = [0, 1, 2]
EDGE_STEP = {min(PILOT_LRS): 3e-4, max(PILOT_LRS): 3e-2}  # one step past each edge of the grid
RECIPE = {f"recipe_{r}": (f"Does ReLU or GELU give the lower loss at its best LR (decoder, "
                          f"recipe {r})?", "relu", "gelu", {**DECODER, **fields},
                          (f"primary_recipe_{r}_pilot", f"primary_recipe_{r}_edge"))
          for r, fields in RECIPES.items()}
# The modern block's tests in family 2: test 1's recipe in the LLaMA-style block, plain FFN.
MODERN_BLOCK = {**DECODER, **BLOCKS["llama"], "model.ffn": "plain"}
MODERN_ARMS = ["relu", "relu2", "gelu"]  # one pilot for both tests
MODERN_STUDIES = ("primary_modern_pilot", "primary_modern_edge")
MODERN = {"modern_relu_gelu": ("relu", "ReLU"), "modern_relu2_gelu": ("relu2", "ReLU²")}
for _name, (_act, _label) in MODERN.items():
  RECIPE[_name] = (f"Does {_label} or GELU give the lower loss at its best LR (decoder, the "
                   f"modern block, plain FFN)?", _act, "gelu", MODERN_BLOCK, MODERN_STUDIES)


# Family 1's re-tests: tests 2-4 with their pilot extended one step below its lowest LR.
RETESTED = ("swiglu_silu", "geglu_gelu", "reglu_relu")
RETEST = {f"{name}_retest": (*PAGE[name][:4], (*GATED, "primary_gated_edge")) for name in RETESTED}
RETEST_FRESH_SEED = 600  # no run of any family used 600 on
RETEST_EDGE = {min(PILOT_LRS): EDGE_STEP[min(PILOT_LRS)]}  # the step below; none above


# Family 3: ReLU − GELU × clipping × block, one design at one LR, every cell on the same seeds.
FACTORIAL_LR = 3e-3
CLIPPINGS = {"none": {"optim.clip_norm": 0.0, "optim.spike_clip": 0.0},
             "clip": {"optim.clip_norm": 1.0, "optim.spike_clip": 0.0},
             "spike": {"optim.clip_norm": 0.0, "optim.spike_clip": 10.0}}
FACTORIAL_BLOCKS = {"gpt2": {f"model.{k}": v for k, v in GPT2_BLOCK.items()},
                    "llama": {k: MODERN_BLOCK[k] for k in BLOCKS["llama"]}}
FACTORIAL_CAP = 40  # shared seeds: 480 runs, the budget
FACTORIAL_FRESH_SEED = 400  # no run of any family used 300 on
FACTORIAL_CELLS = {f"{act}/{clip}/{block}": {"model.activation": act, **CLIPPINGS[clip],
                                             **FACTORIAL_BLOCKS[block]}
                   for act in ("relu", "gelu") for clip in CLIPPINGS for block in FACTORIAL_BLOCKS}
CLIP_WORDS = {"none": "unclipped", "clip": "clipped at 1.0", "spike": "with spike-only clipping"}
BLOCK_WORDS = {"gpt2": "in GPT-2's block", "llama": "in the LLaMA-style block"}


def relu_gelu(clip: str, block: str) -> dict:
  """D(clip, block): ReLU − GELU under clipping `clip` in `block`, as cell weights."""
  return {f"relu/{clip}/{block}": 1.0, f"gelu/{clip}/{block}": -1.0}


def change(to: tuple[str, str], from_: tuple[str, str], name: str,
           question: str) -> factorial.Contrast:
  """D(*to) − D(*from_): how ReLU − GELU changes from one (clipping, block) to another."""
  weights = {**relu_gelu(*to), **{k: -w for k, w in relu_gelu(*from_).items()}}
  label = lambda clip, block: f"ReLU − GELU {CLIP_WORDS[clip]} {BLOCK_WORDS[block]}"
  return factorial.Contrast(name, question, weights, label(*to), label(*from_))


FACTORIAL = factorial.Factorial(
    "factorial", FACTORIAL_CELLS,
    (factorial.Contrast("relu_gelu", "Does ReLU or GELU give the lower loss in GPT-2's block "
                        "without clipping (test 1 again)?", relu_gelu("none", "gpt2"), "relu",
                        "gelu"),
     change(("clip", "gpt2"), ("none", "gpt2"), "clip_change",
            "Does clipping at 1.0 change ReLU − GELU (GPT-2's block)?"),
     change(("spike", "gpt2"), ("none", "gpt2"), "spike_change",
            "Does spike-only clipping change ReLU − GELU (GPT-2's block)?"),
     change(("spike", "gpt2"), ("clip", "gpt2"), "spike_vs_clip",
            "Does spike-only clipping leave ReLU − GELU where clipping at 1.0 does?"),
     change(("none", "llama"), ("none", "gpt2"), "block_change",
            "Does the LLaMA-style block change ReLU − GELU (unclipped)?")),
    pilot_seeds=tuple(range(300, 305)), first_seed=FACTORIAL_FRESH_SEED, cap=FACTORIAL_CAP,
    rule=preregistered.Rule(alpha=0.05, power=0.8, delta=0.1, min_seeds=20),
    margins=(0.1, 0.05), sd_confidence=0.8, outcome="final_test_loss", spike=10.0,
    descriptive=(*(factorial.Contrast(f"relu_gelu_{clip}_{block}", "", relu_gelu(clip, block),
                                      "relu", "gelu")
                   for block in FACTORIAL_BLOCKS for clip in CLIPPINGS),
                 change(("clip", "llama"), ("none", "llama"), "clip_change_llama", ""),
                 change(("spike", "llama"), ("none", "llama"), "spike_change_llama", "")))


def _test(name: str, family: dict, question, a, b, fixed, pilot_studies) -> preregistered.Test:
  """Test `name` of `family` with the family's rules: its K, seeds, cap, outcome and grid."""
  model = "encoder" if fixed.get("model.kind") == "encoder" else "decoder"
  recipe, retest = family is RECIPE, family is RETEST
  cap = MAX_SEEDS["recipe_wide" if name == "recipe_wide" else "recipe"] if recipe or retest else (
      MAX_SEEDS[model])
  first_seed = RECIPE_FRESH_SEED if recipe else RETEST_FRESH_SEED if retest else FRESH_SEED
  return preregistered.Test(
      name, question, a, b, fixed, pilot_studies, k=len(family), first_seed=first_seed, cap=cap,
      rule=RULE, outcome=OUTCOME[model], grid=tuple(PILOT_LRS) if recipe or retest else (),
      edge_step=EDGE_STEP if recipe else RETEST_EDGE if retest else {})


TESTS = {name: _test(name, family, *spec) for family in (PAGE, RECIPE, RETEST)
         for name, spec in family.items()}
FAMILIES = {"page": tuple(PAGE), "recipe": tuple(RECIPE), "retest": tuple(RETEST)}
RESULTS = preregistered.Results(pathlib.Path(__file__).resolve().parents[1] / "results")
# An encoder run has left the MLM plateau (about 5.7 nats) once its validation [MASK] loss is
# below this: descriptive, between the plateau and every run's end (2.3-3.6 nats).
PLATEAU_EXIT = 4.0
LATE_STEPS = 500  # a run still descending at its end: its loss falls over these last steps
# The stability measures `main("stability")` ranges over (descriptive; docs/metrics.md): summary
# key -> what it is, as printed.
STABILITY = {"grad_norm_max_rel": "largest gradient norm / its initial value",
             "attn_entropy_min": "least attention entropy (nats)",
             "attn_logit_max": "largest attention logit",
             "dead_units": "dead FFN units (fraction)"}
SEEDS_WHERE = {"stable": "both arms stable:", "unstable": "either arm unstable:"}


def pilot(name: str) -> dict | None:
  """Test `name`'s pilot as committed (`preregistered.pilot`)."""
  return preregistered.pilot(TESTS[name], RESULTS)


def result(name: str) -> dict | None:
  """Test `name` on its fresh seeds as committed (`preregistered.result`)."""
  return preregistered.result(TESTS[name], RESULTS)


def plateau_exits() -> dict:
  """(activation, seed) -> (plateau exit step, final test [MASK] loss, late descent) of each
  finished fresh-seed run of the encoder's tests (a GELU run shared by the tests counted once)."""
  encoder = [t.study for t in TESTS.values() if t.outcome == OUTCOME["encoder"]]
  out = {}
  for (act, _, seed), run in RESULTS.runs(*encoder).items():
    val_mask_loss = curves.curve(run / "metrics.jsonl", "val_mask_loss")
    final = json.loads((run / "summary.json").read_text())[OUTCOME["encoder"][1]]
    out[act, seed] = (curves.first_below(val_mask_loss, PLATEAU_EXIT), final,
                      curves.late_descent(val_mask_loss, LATE_STEPS))
  return out


def factorial_plan() -> dict | None:
  """Family 3's pilot as committed (`factorial.pilot`)."""
  return factorial.pilot(FACTORIAL, RESULTS)


def factorial_sweep(seeds: list[int], description: str) -> dict:
  """Family 3's 12 cells at `seeds`: the activation, the two clipping fields (less the pair no
  config takes together) and the block (GPT-2's, or the LLaMA-style one by `model.norm_type`
  with its other fields) as axes."""
  clip_fields = list(CLIPPINGS["none"])
  values = {f: sorted({c[f] for c in CLIPPINGS.values()}) for f in clip_fields}
  exclude = [dict(zip(clip_fields, combo)) for combo in itertools.product(*values.values())
             if dict(zip(clip_fields, combo)) not in CLIPPINGS.values()]
  llama = FACTORIAL_BLOCKS["llama"]
  return {"description": description,
          "axes": {"model.activation": ["relu", "gelu"], **values,
                   "model.norm_type": [FACTORIAL_BLOCKS["gpt2"]["model.norm_type"],
                                       llama["model.norm_type"]]},
          "seeds": seeds, "fixed": {**DECODER, "optim.lr": FACTORIAL_LR},
          "fixed_by": {"model.norm_type": {llama["model.norm_type"]: {
              k: v for k, v in llama.items() if k != "model.norm_type"}}},
          "exclude": exclude, "baseline": "gelu", "equivalence_margin": RULE.delta}


def get_sweep(arg=None):
  if arg == "factorial_pilot":
    return factorial_sweep(list(FACTORIAL.pilot_seeds),
                           "Family 3, pilot: ReLU and GELU × clipping (none, at 1.0, spike-only "
                           "at 10×) × block (GPT-2, LLaMA-style)")
  if arg == "factorial":
    plan = factorial_plan()
    if plan is None:
      raise ValueError(f"primary_tests:factorial: its pilot (results/{FACTORIAL.pilot_study}) is "
                       "not committed yet")
    return factorial_sweep(FACTORIAL.fresh_seeds(plan["n"]), "Family 3: ReLU and GELU × "
                           "clipping × block, the fresh seeds")
  if arg == "gated_pilot":
    return {"description": "Primary tests 2-4, pilot: gated FFNs and SiLU across 3 LRs",
            "axes": {"model.activation": ["swiglu", "geglu", "reglu", "silu"],
                     "optim.lr": PILOT_LRS},
            "seeds": [0, 1, 2], "fixed": DECODER}
  recipe = arg.removeprefix("recipe_").rsplit("_", 1) if arg and arg.startswith("recipe_") else ()
  if len(recipe) == 2 and recipe[0] in RECIPES and recipe[1] == "pilot":
    return {"description": f"Recipe family, pilot: ReLU vs GELU across 3 LRs, recipe {recipe[0]}",
            "axes": {"model.activation": ["relu", "gelu"], "optim.lr": PILOT_LRS},
            "seeds": RECIPE_PILOT_SEEDS, "fixed": TESTS[f"recipe_{recipe[0]}"].fixed}
  if len(recipe) == 2 and recipe[0] in RECIPES and recipe[1] == "edge":
    return edge_sweep(f"recipe_{recipe[0]}")
  if arg == "modern_pilot":
    return {"description": "Recipe family, the modern block's pilot: ReLU, ReLU² and GELU "
                           "across 3 LRs (plain FFN)",
            "axes": {"model.activation": MODERN_ARMS, "optim.lr": PILOT_LRS},
            "seeds": RECIPE_PILOT_SEEDS, "fixed": MODERN_BLOCK}
  if arg == "modern_edge":
    return edge_sweep(*MODERN)
  if arg == "gated_edge":
    return edge_sweep(*RETEST)
  if arg not in TESTS:
    variants = [":gated_pilot", *(f":recipe_{r}_{v}" for r in RECIPES for v in ("pilot", "edge")),
                ":modern_pilot", ":modern_edge", ":gated_edge", ":factorial_pilot", ":factorial",
                *(":" + t for t in TESTS)]
    raise ValueError(f"primary_tests: unknown variant {arg!r}; use one of {variants}")
  test, plan = TESTS[arg], pilot(arg)
  if plan is None:
    raise ValueError(f"primary_tests:{arg}: its pilot ({', '.join(test.pilot_studies)}) is not "
                     "committed yet")
  if "edge" in plan:
    raise ValueError(f"primary_tests:{arg}: its pilot's best LR is at the grid's edge for "
                     f"{sorted(plan['edge'])}: run :{edge_variant(arg)} first")
  if arg in RETEST and not moved(arg):
    raise ValueError(f"primary_tests:{arg}: the step below the grid leaves the choice of LR where "
                     f"it was ({plan['lr']}): {retested(arg)}'s verdict stands, nothing to re-test")
  a, b = test.a, test.b
  sweep = {"description": f"Primary test {arg}: {test.question}",
           "axes": {"model.activation": [a, b]},
           "seeds": test.fresh_seeds(plan["n"]),
           "fixed": {**test.fixed, "optim.lr": plan["lr"][a]}, "baseline": b,
           "equivalence_margin": RULE.delta}
  if plan["lr"][b] != plan["lr"][a]:  # each arm at its own LR
    sweep["fixed_by"] = {"model.activation": {b: {"optim.lr": plan["lr"][b]}}}
  return sweep


def edge_variant(name: str) -> str:
  """The sweep variant that runs the step past the edge of test `name`'s pilot."""
  return "modern_edge" if name in MODERN else "gated_edge" if name in RETEST else f"{name}_edge"


def retested(name: str) -> str:
  """The page's test that re-test `name` asks again."""
  return name.removesuffix("_retest")


def moved(name: str) -> bool:
  """Whether re-test `name`'s extended pilot chooses another LR, for either arm, than its test's."""
  return pilot(name)["lr"] != pilot(retested(name))["lr"]


def edge_sweep(*names: str) -> dict:
  """The step past a pilot's grid edge for tests `names` (which share a pilot):
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
  sweep = {"description": f"Pilot: the step past the grid's edge ({where})",
           "axes": {"model.activation": arms}, "seeds": plans[0]["seeds"],
           "fixed": {**TESTS[names[0]].fixed, "optim.lr": edge[arms[0]]}}
  others = {arm: {"optim.lr": edge[arm]} for arm in arms[1:] if edge[arm] != edge[arms[0]]}
  if others:
    sweep["fixed_by"] = {"model.activation": others}
  return sweep


def report() -> None:
  """Each family's results so far under the claim rule (`preregistered.verdicts`): per test the
  paired difference, its simultaneous interval, the Holm-adjusted p of no difference and of the
  TOST, the noise, and the verdict; the page's tests also under the rule the claim rule replaced
  (`preregistered.superseded_claim`), side by side."""
  for fam, names in FAMILIES.items():
    k, tests = len(names), [TESTS[name] for name in names]
    print(f"family {fam!r}: K = {k}; simultaneous intervals at 1 - {RULE.alpha}/{k} "
          f"(level {1 - RULE.alpha / k:.4f}), Holm over the family")
    for test, r in zip(tests, preregistered.verdicts(tests, RESULTS)):
      if r is None:
        stands = test.name in RETEST and "lr" in (pilot(test.name) or {}) and not moved(test.name)
        print(f"- {test.name}: " + ("the choice of LR stands: not re-tested" if stands else
                                    "no fresh-seed pair finished"))
        continue
      a, b, d, plan = test.a, test.b, r["paired"], pilot(test.name)
      (low, high), ph, peh = r["interval"], r["p_holm"], r["p_equiv_holm"]
      a_lower = sum(diff < 0 for diff in r["diffs"].values())
      print(f"- {test.name}: {d.n} of {plan['n']} seed pairs; means {a} {r['means'][0]:.4f}, {b} "
            f"{r['means'][1]:.4f}; {a} - {b} = {d.mean:+.4f}, 95% [{d.ci_low:+.4f}, "
            f"{d.ci_high:+.4f}], simultaneous [{low:+.4f}, {high:+.4f}]; {a} lower in {a_lower} "
            f"of {d.n}; p {d.p:.3g} (Holm {ph:.3g}), TOST +-{RULE.delta} p {d.p_equiv:.3g} (Holm "
            f"{peh:.3g}); seed sd {d.sd:.4f}, {platform(r)}")
      print(f"    verdict: {r['claim']}" + (" (interim)" if d.n < plan["n"] else ""))
      if fam == "page":
        superseded = preregistered.superseded_claim(d, ph, peh, r["platform_sd"])
        print(f"    under the rule it replaces: {superseded}{pending(r, plan['n'])}")
      print("    A - B by seed: " + ", ".join(f"{s} {x:+.3f}" for s, x in r["diffs"].items()))


def platform(r: dict) -> str:
  """The platform's noise in test result `r`, as printed."""
  if r["platform_sd"] is None:
    return "platform: not yet measured"
  shift = (f"sd {r['platform_shift_sd']:.4f} over {r['platform_shift_n']} seeds"
           if r["platform_shift_sd"] is not None else "not yet measured")
  return (f"platform: shift of A - B {shift}; rerun - run sd {r['platform_sd']:.4f} "
          f"({r['platform_n']} runs)")


def pending(r: dict, n: int) -> str:
  """What test result `r` still waits for before its verdict under the superseded rule is
  final: its n seed pairs and the platform reruns of both arms ("" once it has them)."""
  missing = [f"{r['paired'].n} of {n} seed pairs"] if r["paired"].n < n else []
  if r["platform_n"] < 2 * PLATFORM_SEEDS:
    missing.append(f"{r['platform_n']} of {2 * PLATFORM_SEEDS} platform reruns")
  return f" (interim: {', '.join(missing)})" if missing else ""


def print_plan(name: str) -> None:
  """Test `name`'s pilot and the fresh seeds it asks for, as `main` prints them: the pilot's
  studies that are committed (all of them while none is), a step past the edge unrun where it
  was not needed."""
  test, plan = TESTS[name], pilot(name)
  held = [s for s in test.pilot_studies if (RESULTS.root / s).is_dir()]
  a, b, study = test.a, test.b, " + ".join(f"results/{s}" for s in held or test.pilot_studies)
  if plan is None:
    print(f"- {name}: {test.question}\n    pilot {study}: not run yet")
  elif "edge" in plan:
    print(f"- {name}: {test.question}\n    pilot {study}: best LR at the grid's edge for "
          + ", ".join(f"{arm} (next: {lr:g})" for arm, lr in sorted(plan["edge"].items()))
          + f": run :{edge_variant(name)}")
  else:
    diffs = ", ".join(f"{d:+.4f}" for d in plan["diffs"])
    if len(held) < len(test.pilot_studies):
      study += " (no step past the grid's edge needed)"
    print(f"- {name}: {test.question}\n    pilot {study}, seeds {plan['seeds']}: LR "
          f"{plan['lr'][a]:g} ({a}), {plan['lr'][b]:g} ({b}); {a} - {b} = {diffs}; "
          f"sd {plan['sd']:.4f} -> n = {plan['needed']} fresh seeds"
          + ("" if plan["n"] == plan["needed"] else
             f"; capped at {plan['n']}: power {plan['power']:.2f} against delta, 80% power "
             f"above {plan['detectable']:.3f} nats")
          + ("" if name not in RETEST else "; the choice moved: re-test" if moved(name) else
             f"; the choice stands: {retested(name)}'s verdict stands, not re-tested"))


def weights(c: factorial.Contrast) -> str:
  """A contrast's cells with their signs, as printed."""
  return " ".join(f"{'+' if w > 0 else '-'} {cell}" if abs(w) == 1 else f"{w:+g} {cell}"
                  for cell, w in c.weights.items()).removeprefix("+ ")


def print_factorial_plan() -> None:
  """Family 3's design and its pilot's sizing, as `main` prints them."""
  fam, rule = FACTORIAL, FACTORIAL.rule
  print(f"family {fam.name!r}: K = {fam.k} contrasts over {len(fam.cells)} cells "
        f"({', '.join(fam.cells)}) at LR {FACTORIAL_LR:g}, the same seeds in every cell; "
        f"simultaneous intervals at 1 - {rule.alpha}/{fam.k}, verdicts at "
        f"+-{' and +-'.join(f'{m:g}' for m in fam.margins)}, an exact sign-flip test beside "
        f"each; power {rule.power} against delta = {rule.delta} at alpha/K = {fam.alpha:.4f} "
        f"with each contrast's pilot sd at its upper one-sided {fam.sd_confidence:.0%} bound; "
        f"n at least {rule.min_seeds}, at most {fam.cap}")
  plan, pilot_dir = factorial_plan(), f"results/{fam.pilot_study}"
  for c in fam.contrasts:
    print(f"- {c.name}: {c.question}\n    {weights(c)}")
    if plan is not None:
      p = plan["contrasts"][c.name]
      print(f"    pilot: {', '.join(f'{v:+.4f}' for v in p['values'])}; sd {p['sd']:.4f}, "
            f"bound {p['sd_upper']:.4f} -> n = {p['needed']}"
            + ("" if plan["n"] == plan["needed"] else f"; at {plan['n']}: power "
               f"{p['power']:.2f} against delta, 80% power above {p['detectable']:.3f} nats"))
  if plan is None:
    print(f"  pilot {pilot_dir} (seeds {fam.pilot_seeds[0]}-{fam.pilot_seeds[-1]}, "
          f"{len(fam.cells) * len(fam.pilot_seeds)} runs): not run yet")
  else:
    seeds = fam.fresh_seeds(plan["n"])
    print(f"  pilot {pilot_dir}, seeds {plan['seeds']}: n = {plan['needed']}"
          + ("" if plan["n"] == plan["needed"] else f", capped at {plan['n']}")
          + f" shared seeds ({seeds[0]}-{seeds[-1]}), {len(fam.cells) * plan['n']} runs")


def report_factorial() -> None:
  """Family 3 on its fresh seeds so far (`factorial.verdicts`)."""
  fam, plan = FACTORIAL, factorial_plan()
  v = factorial.verdicts(fam, RESULTS)
  if v is None:
    print(f"family {fam.name!r}: no seed finished in every cell")
    return
  n, planned = len(v["seeds"]), plan["n"] if plan else None
  print(f"family {fam.name!r}: {n} of {planned} shared seeds; K = {fam.k}, simultaneous "
        f"intervals at 1 - {fam.rule.alpha}/{fam.k}, Holm over the family"
        + (f"; left out (a run diverged): {v['left_out']}" if v["left_out"] else ""))
  for c in fam.contrasts:
    r = v["contrasts"][c.name]
    d, (low, high), spikes = r["paired"], r["interval"], r["spikes"]
    print(f"- {c.name}: {c.a} - ({c.b}) = {d.mean:+.4f}, 95% [{d.ci_low:+.4f}, "
          f"{d.ci_high:+.4f}], simultaneous [{low:+.4f}, {high:+.4f}]; p {d.p:.3g} (Holm "
          f"{r['p_holm']:.3g}); sign-flip p {r['p_sign']:.3g} (Holm {r['p_sign_holm']:.3g}); "
          f"below 0 in {sum(x < 0 for x in r['values'].values())} of {n}; sd {d.sd:.4f}")
    for m, at in r["margins"].items():
      print(f"    at +-{m:g}: TOST p {at['p_equiv']:.3g} (Holm {at['p_equiv_holm']:.3g}); "
            f"verdict: {at['verdict']}" + (" (interim)" if planned and n < planned else ""))
    print(f"    spiking seeds {len(spikes['spiking_seeds'])} of {n} (mean "
          f"{spikes['spiking_mean']:+.4f}); without them {spikes['without_spikes']:+.4f}: they "
          f"carry {spikes['carried']:+.4f}")
  print("  descriptive (unadjusted 95% intervals): " + "; ".join(
      f"{name} {d.mean:+.4f} [{d.ci_low:+.4f}, {d.ci_high:+.4f}]"
      for name, d in v["descriptive"].items()))
  print("\nAs RESULTS.md's table (each number rounded once, from the values above):\n")
  print("\n".join(factorial_table(v)))


def factorial_table(v: dict) -> list[str]:
  """Family 3's verdicts (`factorial.verdicts`) as a markdown table, a row per contrast."""
  margins, n = FACTORIAL.margins, len(v["seeds"])
  signed = lambda x: f"{x:+.3f}".replace("-", "−")  # the page's minus sign
  lines = ["| contrast | question | mean, 95% interval | simultaneous interval | p (Holm) | "
           "sign-flip p (Holm) | below 0 in | " + " | ".join(f"verdict at ±{m:g}" for m in margins)
           + " | the spiking seeds carry |",
           "|---" * (8 + len(margins)) + "|"]
  for c in FACTORIAL.contrasts:
    r = v["contrasts"][c.name]
    d, (low, high), spikes = r["paired"], r["interval"], r["spikes"]
    below = sum(x < 0 for x in r["values"].values())
    lines.append(
        f"| `{c.name}` | {c.question} | {signed(d.mean)} [{signed(d.ci_low)}, "
        f"{signed(d.ci_high)}] | [{signed(low)}, {signed(high)}] | {r['p_holm']:.2g} | "
        f"{r['p_sign_holm']:.2g} | {below} of {n} | "
        + " | ".join(f"**{r['margins'][m]['verdict']}**" for m in margins)
        + f" | {signed(spikes['carried'])} ({len(spikes['spiking_seeds'])} seeds) |")
  return lines


EARLY_STEPS = 150  # `review`: the early steps at which clipping's reach is counted


def spiking(name: str) -> set:
  """The fresh seeds of test `name` where a run of either arm passes `FACTORIAL.spike` × its
  initial gradient norm (the stability rule's threshold)."""
  test, r = TESTS[name], result(name)
  runs = RESULTS.by_seed(test.study)
  return {s for s in r["seeds"]
          if max(runs[arm, s]["grad_norm_max_rel"] for arm in (test.a, test.b)) > FACTORIAL.spike}


def review() -> None:
  """What the first two families' numbers say past their verdicts (descriptive; the numbers the
  page's review cites): per test the fresh seeds' sd against the pilot's, the power at it, the
  normality of the differences and the exact sign-flip p; test 1's and `recipe_clip`'s pairs
  with and without a spike; how often clipping at 1.0 acted in `recipe_clip`."""
  for name in (*PAGE, *RECIPE):
    test, plan, d = TESTS[name], pilot(name), result(name)["paired"]
    diffs = list(result(name)["diffs"].values())
    print(f"- {name}: fresh sd {d.sd:.4f} / pilot sd {plan['sd']:.4f} = "
          f"{d.sd / plan['sd']:.2f}; power against delta at the fresh sd "
          f"{preregistered.paired_power(d.n, d.sd, RULE.delta, test.alpha):.2f} ({d.n} pairs); "
          f"Shapiro p {stats.shapiro(diffs).pvalue:.2g}; exact sign-flip p "
          f"{preregistered.sign_flip_p(diffs):.3g} ({test.a} lower in "
          f"{sum(x < 0 for x in diffs)} of {d.n})")
  without = {}
  for name in ("relu_gelu", "recipe_clip"):
    r, spikes = result(name), spiking(name)
    without[name] = [x for s, x in r["diffs"].items() if s not in spikes]
    print(f"{name}: {len(spikes)} of {len(r['seeds'])} seeds spike (> {FACTORIAL.spike:g}x), "
          f"their pairs {min(r['diffs'][s] for s in spikes):+.3f} to "
          f"{max(r['diffs'][s] for s in spikes):+.3f}; the other {len(without[name])} pairs "
          f"{np.mean(without[name]):+.4f} (sd {np.std(without[name], ddof=1):.4f}); all "
          f"{r['paired'].mean:+.4f}: the spiking seeds carry "
          f"{r['paired'].mean - np.mean(without[name]):+.4f}")
  welch = stats.ttest_ind(without["relu_gelu"], without["recipe_clip"], equal_var=False)
  print(f"pairs without a spike, relu_gelu against recipe_clip: Welch p {welch.pvalue:.2g}")
  test, summaries = TESTS["recipe_clip"], RESULTS.summaries(TESTS["recipe_clip"].study)
  clip = test.fixed["optim.clip_norm"]
  for arm in (test.a, test.b):
    runs = {key: run for key, run in RESULTS.runs(test.study).items() if key[0] == arm}
    early = [g for run in runs.values()
             for step, g in curves.curve(run / "metrics.jsonl", "grad_norm").items()
             if step <= EARLY_STEPS]
    first = [summaries[key]["grad_norm_init"] for key in runs]
    print(f"recipe_clip, {arm}: the gradient norm is above clip_norm {clip:g} at "
          f"{sum(g > clip for g in early)} of {len(early)} logged steps <= {EARLY_STEPS} "
          f"({len(runs)} runs); at step 0 {min(first):.2f}-{max(first):.2f}")


FIGURE = pathlib.Path(__file__).resolve().parents[1] / "docs" / "img" / "activation_x_recipe.png"


def draw_intervals(ax, rows, margins: tuple[float, ...]) -> None:
  """Rows of (label, mean, low, high) on `ax`, top down, each a mean with its interval; 0 marked
  in grey and ±each margin in red (the first dashed, the second dotted)."""
  for y, (_, mean, low, high) in enumerate(rows):
    ax.errorbar(mean, y, xerr=[[mean - low], [high - mean]], fmt="o", color="k", capsize=4)
  ax.set_yticks(range(len(rows)), [label for label, *_ in rows], fontsize=8)
  ax.invert_yaxis()
  for m, style in zip(margins, ("--", ":")):
    for x in (-m, m):
      ax.axvline(x, color="tab:red", ls=style, lw=1)
  ax.axvline(0, color="0.6", lw=1)


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
      rows.append((f"{label}\n({r['paired'].n} pairs)", r["paired"].mean,
                   *comparisons.simultaneous_interval(r["paired"], TESTS[name].k, RULE.alpha)))
  fig, ax = plt.subplots(figsize=(6.4, 0.7 * len(rows) + 1.2))
  draw_intervals(ax, rows, (RULE.delta,))
  ax.set_xlabel("ReLU − GELU, final test loss (nats): mean and simultaneous interval; ±δ dashed")
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print(f"wrote {path.relative_to(path.parents[2])}")


FACTORIAL_FIGURE = FIGURE.with_name("factorial.png")
CONTRAST_WORDS = {"relu_gelu": "GPT-2's block, unclipped",  # the figure's words for each
                  "clip_change": "clipped at 1.0 − unclipped",
                  "spike_change": "spike-only − unclipped",
                  "spike_vs_clip": "spike-only − clipped at 1.0",
                  "block_change": "LLaMA-style − GPT-2's block, unclipped"}


def factorial_rows(v: dict) -> tuple[list, list]:
  """Family 3's figure from its `factorial.verdicts`: per block and clipping, ReLU − GELU with its
  unadjusted 95% interval (descriptive); then each contrast with its simultaneous interval. Rows
  of (label, mean, low, high)."""
  cells = []
  for block in FACTORIAL_BLOCKS:
    for clip in CLIPPINGS:
      d = v["descriptive"][f"relu_gelu_{clip}_{block}"]
      cells.append((f"{BLOCK_WORDS[block].removeprefix('in ')}, {CLIP_WORDS[clip]}", d.mean,
                     d.ci_low, d.ci_high))
  contrasts = [(f"{c.name}\n{CONTRAST_WORDS[c.name]}", v["contrasts"][c.name]["paired"].mean,
                *v["contrasts"][c.name]["interval"]) for c in FACTORIAL.contrasts]
  return cells, contrasts


def figure_factorial(path: pathlib.Path = FACTORIAL_FIGURE) -> None:
  """Family 3 on its fresh seeds (`factorial_rows`), both margins marked."""
  v = factorial.verdicts(FACTORIAL, RESULTS)
  if v is None:
    print(f"family {FACTORIAL.name!r}: no seed finished in every cell; no figure")
    return
  import matplotlib
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt
  panels = zip(factorial_rows(v), (
      "ReLU − GELU per cell: mean, 95% interval (descriptive)",
      f"contrasts: mean, simultaneous interval (α/{FACTORIAL.k})"))
  fig, axes = plt.subplots(2, 1, figsize=(7.0, 6.4), height_ratios=(6, 5), sharex=True)
  for ax, (rows, title) in zip(axes, panels):
    draw_intervals(ax, rows, FACTORIAL.margins)
    ax.set_title(title, fontsize=9)
  axes[-1].set_xlabel(f"final test loss (nats); ±{FACTORIAL.margins[0]:g} dashed, "
                      f"±{FACTORIAL.margins[1]:g} dotted; n = {len(v['seeds'])}", fontsize=9)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print(f"wrote {path.relative_to(path.parents[2])}")


def main(what: str = "plan") -> None:
  for fam, names in FAMILIES.items():
    print(f"family {fam!r}: K = {len(names)} tests, family-wise alpha {RULE.alpha}; power "
          f"{RULE.power} against delta = {RULE.delta} nats at alpha/K = "
          f"{RULE.alpha / len(names):.4f}, two-sided paired t-test")
    for name in names:
      print_plan(name)
  print_factorial_plan()
  if what == "report":
    report()
    report_factorial()
  if what == "figure":
    figure()
    figure_factorial()
  if what == "plateau":
    exits = plateau_exits()
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
  if what == "stability":
    for name in TESTS:
      print(f"- {name} (fresh seeds; descriptive):")
      for arm, by_status in preregistered.stability(TESTS[name], RESULTS, STABILITY).items():
        for status, g in by_status.items() or [("none finished", {"runs": 0})]:
          ranges = "".join(f"; {label} {g[m][0]:.3g} to {g[m][1]:.3g}"
                           for m, label in STABILITY.items() if m in g)
          print(f"    {arm}, {g['runs']} {status}{ranges}")
      groups = preregistered.by_stability(TESTS[name], RESULTS)
      if len(groups) > 1:
        print("    A - B: " + "; ".join(
            f"{SEEDS_WHERE[g]} {n} pairs, {mean:+.3f}" + (f" (sd {sd:.3f})" if sd is not None else "")
            for g, (n, mean, sd) in groups.items()))
  if what == "review":
    review()
  if what == "excess":
    for study in ("relu_vs_gelu_cpu_epoch",):
      print(f"loss excess over the best LR, integrated over training ({study}):")
      for (act, lr), values in sorted(curves.loss_excess(RESULTS, study).items()):
        print(f"  {act} {lr:g}: {np.mean(values):.3f} +- {np.std(values, ddof=1):.3f} "
              f"(seeds: {', '.join(f'{v:.3f}' for v in values)})")


if __name__ == "__main__":
  try:
    main(*sys.argv[1:])
  except ValueError as e:
    sys.exit(str(e))

"""A question's pages: its design, where its stages stand (`plan`), and its report (the verdict
table, the runs it leaves out, the descriptive contrasts) with its figure."""

import math
import pathlib
import textwrap

from actlab.infra import workdir as workdir_lib
from actlab.report import answer as A
from actlab.report import comparisons as C
from actlab.report import question as Q
from actlab.report.question import Contrast, Question
from actlab.report.tables import markdown_table


def signed(x: float) -> str:
  """x to 3 decimals with its sign (more where that would read 0), the page's minus sign."""
  if not math.isfinite(x):
    return "n/a"
  digits = 3 if x == 0 or abs(x) >= 5e-4 else -math.floor(math.log10(abs(x)))
  return f"{x:+.{digits}f}".replace("-", "−")


def weights(c: Contrast) -> str:
  return " ".join(f"{'+' if w > 0 else '−'} {'' if abs(w) == 1 else f'{abs(w):g} '}{cell}"
                  for cell, w in c.weights.items()).removeprefix("+ ")


def design_lines(q: Question) -> list[str]:
  r = q.rule
  grid = "LR " + (f"{q.pilot.lrs[0]:g} (fixed)" if len(q.pilot.lrs) == 1 else
                  "{" + ", ".join(f"{x:g}" for x in q.pilot.lrs) + "}")
  edge = ", ".join(f"{k:g} → {v:g}" for k, v in q.pilot.edge.items())
  bound = ("the pilot sd" if r.sd_confidence is None else
           f"the upper {r.sd_confidence:.0%} bound of the pilot sd")
  return [f"question {q.name}" + (f": {q.text}" if q.text else ""),
          f"  {len(q.cells)} cells on {q.config}; K = {q.k} contrasts; simultaneous intervals at "
          f"1 - {r.alpha}/{q.k}, Holm over the K; verdicts at ±"
          + " and ±".join(f"{m:g}" for m in q.margins)
          + ("; an exact sign-flip test beside each" if r.sign_flip else ""),
          f"  pilot: {grid} × seeds {list(q.pilot.seeds)}"
          + (f", one step past an edge ({edge})" if edge else "")
          + (f"; chosen on {q.outcome[0]}" if len(q.pilot.lrs) > 1 else "")
          + f"; tested on {q.outcome[1]}",
          f"  n: power {r.power} against {q.margins[0]:g} at alpha/K = {q.alpha:.4g} with {bound}"
          f"; at least {r.min_seeds}" + (f", at most {q.cap}" if q.cap else "")
          + ("; every cell on the same seeds" if r.shared else "")
          + f"; fresh seeds from {q.first_seed}"] + [
              f"  {cell}: no pilot grid; the LR {q.lr_from(cell)}'s pilot chooses, unchanged "
              f"(its pilot seeds at that LR size n)" for cell in q.cells if q.lr_from(cell)] + [
              f"  - {c.name}: {weights(c)}" + (f"  ({c.question})" if c.question else "")
              for c in q.contrasts]


def stage_lines(s: A.Stages, mine: list[str], cost) -> list[str]:
  """Each stage's runs, done of planned, and the time the rest take here (`cost(runs)`, or None)."""
  q, lines = s.q, []
  about = lambda n: f", about {cost(n)} here" if cost(n) else ""
  grid = {c: {(lr, x) for lr in q.pilot_of(c).lrs for x in q.pilot_of(c).seeds} for c in q.cells
          if not q.lr_from(c)}
  total = sum(map(len, grid.values()))
  done = sum(len(grid[c] & set(s.pilot.get(c, {}))) for c in grid)
  lines.append(f"  stage pilot: {done} of {total} runs done{about(total - done)}")
  transfer = []  # the cells that take another's LR: their runs at it, once it is chosen
  if taking := s.waiting("waits") or s.waiting("transfer"):
    n = len(taking) * len(q.pilot.seeds)
    transfer = [f"  stage transfer: {n} runs of {', '.join(taking)} at the LR their source's "
                f"pilot chooses{about(n)}"]
  if s.waiting("missing"):
    cells, lo, hi = len(q.cells), q.rule.min_seeds, q.cap or q.rule.min_seeds
    if q.pilot.edge:
      lines.append(f"  stage edge: up to {len(grid) * len(q.pilot.seeds)} runs, where a cell's "
                   f"best LR sits at an edge{about(len(grid) * len(q.pilot.seeds))}")
    return lines + transfer + [
        f"  stage fresh: {lo * cells} to {hi * cells} runs, n from the pilot{about(lo * cells)}"
        + (f" to {cost(hi * cells)}" if cost(1) else "")]
  if edge := s.waiting("edge"):
    n = len(edge) * len(q.pilot.seeds)
    return lines + [f"  stage edge: {n} runs ({fmt_lrs(edge)}){about(n)}"] + transfer
  if s.lrs is None:
    return lines + transfer
  taken = [f"{c} from {q.lr_from(c)}" for c in q.cells if q.lr_from(c)]
  lines.append(f"  LRs chosen: {fmt_lrs(s.lrs)}" + (
      f"; again at an edge: {', '.join(s.again_at_edge)}" if s.again_at_edge else "")
      + (f"; taken from another cell's pilot: {', '.join(taken)}" if taken else ""))
  for c in q.contrasts:
    z = s.sizing["contrasts"][c.name]
    lines.append(f"  - {c.name}: pilot {', '.join(signed(v) for v in z['values'])}; sd "
                 f"{z['sd']:.4f}" + ("" if q.rule.sd_confidence is None else
                                     f", bound {z['bound']:.4f}") + f" → {z['needed']}"
                 + ("" if z["n"] >= z["needed"] else f"; at {z['n']}: power {z['power']:.2f}, "
                    f"80% power above {z['detectable']:.3f}"))
  n = s.sizing["cell_n"]
  count = lambda cells: (sum((s.lrs[c], x) in s.fresh.get(c, {}) for c in cells
                             for x in A.fresh_seeds(q, n[c])), sum(n[c] for c in cells))
  (have, fresh), (mine_have, planned) = count(n), count([c for c in mine if c in n])
  return lines + [f"  stage fresh: {have} of {fresh} runs done (n = {max(n.values())})"
                  + (f"; --cells: {mine_have} of {planned}" if len(mine) < len(q.cells) else "")
                  + about(planned - mine_have)]


def fmt_lrs(lrs: dict) -> str:
  return ", ".join(f"{c} {lr:g}" for c, lr in lrs.items())


def lr_of(c: Contrast, lrs: dict) -> str:
  """The LR a contrast's cells ran at: one, or each LR with the cells that ran at it."""
  by = {}
  for cell in c.weights:
    by.setdefault(lrs[cell], []).append(cell)
  return f"{lrs[cell]:g}" if len(by) == 1 else "; ".join(
      f"{lr:g}: {', '.join(cells)}" for lr, cells in by.items())


def tost_interval(d: C.Paired, at: dict, alpha: float) -> tuple[float, float] | None:
  """The interval an equivalence verdict's TOST corresponds to: its two one-sided tests reject at
  the level Holm gives its p (α·p/p̃, p̃ the adjusted p) exactly where the two-sided interval at
  1 − 2·α·p/p̃ lies within ±δ. None where p or p̃ is not a positive number."""
  p, adjusted = at["p_equiv"], at["p_equiv_holm"]
  if not (math.isfinite(p) and math.isfinite(adjusted) and p > 0 and adjusted > 0):
    return None
  return C.simultaneous_interval(d, 1, 2 * alpha * p / adjusted)


def verdict_words(c: Contrast, at: dict, r: dict | None = None, alpha: float = C.ALPHA) -> str:
  """A margin's verdict in bold; an equivalence with its TOST's Holm p, and where the
  simultaneous interval of `r` (the contrast's results) reaches past ±δ, the TOST's interval,
  which lies within it (docs/asking.md, "The verdicts")."""
  v = at["verdict"]
  if v.kind != C.EQUIVALENT:
    return f"**{v.words(c.negative, c.positive)}**"
  tost = f"TOST Holm p {at['p_equiv_holm']:.2g}"
  low, high = r["interval"] if r else (0.0, 0.0)
  if (low < -v.margin or high > v.margin) and (within := tost_interval(r["paired"], at, alpha)):
    tost += (f"; the TOST's interval [{signed(within[0])}, {signed(within[1])}] lies within "
             f"±{v.margin:g}, the simultaneous one reaches past it")
  return f"**{v.words(c.negative, c.positive)}** ({tost})"


def one_seed_out(c: Contrast, r: dict) -> str:
  """Whether each margin's verdict survives leaving out any one seed, naming those that move it."""
  said = []
  for m, at in r["margins"].items():
    by = at["moved_by"]
    if len(by) == 1:
      [(seed, v)] = by.items()
      said.append(f"±{m:g}: without {seed}, "
                  + ("no verdict" if v is None else v.words(c.negative, c.positive)))
    elif by:
      said.append(f"±{m:g}: {len(by)} seeds move it ({', '.join(map(str, list(by)[:4]))}"
                  + (", …" if len(by) > 4 else "") + ")")
  return "; ".join(said) or "holds"


def table(s: A.Stages, v: dict) -> list[str]:
  """The verdict table: a row per contrast, each number rounded once."""
  q = s.q
  head = ["contrast", "question", "LR", "pilot sd → n", "fresh seeds", "mean, 95% interval",
          "simultaneous interval", "p (Holm)", "sign-flip p (Holm)", "below 0 in",
          *(f"verdict at ±{m:g}" for m in q.margins), "one seed out", "the spiking seeds carry"]
  rows = []
  for c in q.contrasts:
    z, r = s.sizing["contrasts"][c.name], v[c.name]
    pilot = (f"{z['sd']:.3f}" + ("" if q.rule.sd_confidence is None else
                                 f" (bound {z['bound']:.3f})") + f" → {z['needed']}"
             + ("" if z["n"] >= z["needed"] else f", cap {z['n']}"))
    row = [f"`{c.name}`", c.question, lr_of(c, s.lrs), pilot]
    if r is None:
      rows.append(row + [f"0 of {z['n']}"] + [""] * (len(head) - 5))
      continue
    d, (low, high), sp = r["paired"], r["interval"], r["spikes"]
    spiked = len(sp["spiking_seeds"])
    carry = ("not measured" if not sp["known"] else "none spike" if not spiked else
             f"all {spiked} seeds spike" if spiked == len(r["seeds"]) else
             f"{signed(sp['carried'])} ({spiked} seed{'s' * (spiked > 1)})")
    sign = f"{r['p_sign']:.2g} ({r['p_sign_holm']:.2g})" if math.isfinite(r["p_sign"]) else "n/a"
    rows.append(row + [
        f"{len(r['seeds'])} of {z['n']}", f"{signed(d.mean)} [{signed(d.ci_low)}, "
        f"{signed(d.ci_high)}]", f"[{signed(low)}, {signed(high)}]",
        f"{d.p:.2g} ({r['p_holm']:.2g})",
        sign, f"{sum(x < 0 for x in r['values'])} of {len(r['seeds'])}",
        *(verdict_words(c, r["margins"][m], r, q.rule.alpha) for m in q.margins),
        one_seed_out(c, r), carry])
  return markdown_table(head, rows).split("\n")


def unanswered(q: Question, v: dict) -> list[str]:
  """The contrasts with fewer fresh seeds than planned: not answered yet."""
  return [c.name for c in q.contrasts if (r := v[c.name]) is None or A.short_of_seeds(r)]


def declaration_lines(s: A.Stages, root: pathlib.Path) -> list[str]:
  """When the question in `root` was declared, what changed since, and its first fresh run."""
  starts = sorted(p[0]["started"] for cells in (s.fresh or {}).values() for r in cells.values()
                  if (p := r.get("provenance")) and p[0].get("started"))
  first = f"first fresh run started {starts[0] if starts else 'none yet'}"
  frozen = workdir_lib.read_json(root / "question.json")
  if frozen is None:
    return [f"declared before its runs in the question file (its git history); {first}",
            "analysis: not fingerprinted (its runs predate actlab.ask's declarations): these are "
            "this checkout's verdicts on them"]
  words = Q.words_changed(frozen["declaration"], Q.declaration(s.q))
  return [f"declaration {frozen['hash']}, frozen {frozen['time']} at commit {frozen['commit']}; "
          f"{first}", Q.analysis_changes(frozen)] + (
              [f"words: since the declaration, {', '.join(words)} read in other words (what a "
               "value below and above 0 means); what they test is as frozen"] if words else [])


def report_lines(s: A.Stages, v: dict, head: list[str]) -> list[str]:
  """The report's lines: the design, `head` (the declaration's), the table and the runs not in."""
  q, waiting = s.q, unanswered(s.q, v)
  shared = "; a seed whose run diverges in a cell still training leaves every contrast"
  interim = [f"interim: {len(waiting)} of {q.k} contrasts short of their planned fresh seeds "
             "(`fresh seeds`): their rows are not answers yet, and the others can still move "
             f"(their Holm p count these as 1{shared if q.rule.shared else ''})"] if waiting else []
  left = A.not_in(s)
  descriptive = [f"{c.name} {signed(d.mean)} [{signed(d.ci_low)}, {signed(d.ci_high)}]"
                 for c in q.descriptive if len(v[c.name]["seeds"]) >= 2
                 and (d := v[c.name]["paired"])]
  return [*design_lines(q), *head, *interim, "", *table(s, v), "",
          *(["runs not in the answer:", *(f"- {line}" for line in left)] if left else []),
          *(["descriptive (unadjusted 95% intervals): " + "; ".join(descriptive)]
            if descriptive else [])]


def draw_intervals(ax, rows, margins, sides=None) -> None:
  """Rows of (label, mean, low, high) on `ax`, top down, with 0 and ±each margin; `sides`: each
  row's (what a value below 0 means, above 0), written at its ends."""
  for y, (_, mean, low, high) in enumerate(rows):
    ax.errorbar(mean, y, xerr=[[mean - low], [high - mean]], fmt="o", color="k", capsize=4)
  ax.set_yticks(range(len(rows)), [label for label, *_ in rows], fontsize=8)
  ax.invert_yaxis()
  for m, style in zip(margins, ("--", ":", "-.")):
    for x in (-m, m):
      ax.axvline(x, color="tab:red", ls=style, lw=1)
  ax.axvline(0, color="0.6", lw=1)
  left, right = ax.get_xlim()
  if sides:  # Room above the first row for its labels, however few the rows.
    ax.set_ylim(len(rows) - 0.5, -0.8)
  wrap = lambda words: textwrap.fill(words, 34)
  for y, (below, above) in enumerate(sides or ()):
    ax.text(left, y - 0.2, wrap(f"← {below}"), fontsize=5.5, color="0.35", ha="left",
            va="bottom")
    ax.text(right, y - 0.2, wrap(f"{above} →"), fontsize=5.5, color="0.35", ha="right",
            va="bottom", multialignment="right")


def figure(q: Question, v: dict, path: pathlib.Path) -> pathlib.Path | None:
  """Each contrast's mean and simultaneous interval against ±each margin, each side labelled."""
  shown = [c for c in q.contrasts if v[c.name] is not None]
  if not shown:
    return None
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots(figsize=(7.2, 0.75 * len(shown) + 1.2))
  draw_intervals(ax, [(f"{c.name} ({len(v[c.name]['seeds'])})", v[c.name]["paired"].mean,
                       *v[c.name]["interval"]) for c in shown], q.margins,
                 [(c.negative, c.positive) for c in shown])
  ax.set_xlabel(f"{q.outcome[1]}: mean, simultaneous interval (α/{q.k}); ±"
                + ", ±".join(f"{m:g}" for m in q.margins), fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)
  return path

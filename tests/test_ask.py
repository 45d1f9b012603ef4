"""actlab.ask: a question file from declaration to verdict. A tiny two-arm question trained end to
end (its pilot split across two shards, the second resuming the stage; the step past an edge; n
from the pilot; the fresh seeds; the verdict recomputed from the runs here), a declaration changed
after its pilot began refused, bad question files one line and exit 2, RESULTS.md's tables
reproduced from the committed runs (`results/`), each committed question's report page as
`report` writes it, and every verdict RESULTS.md's prose retells read as its contrast's. The
model's statistics: tests/test_question.py."""

import dataclasses
import functools
import itertools
import json
import math
import pathlib
import re
import runpy
import shutil
import subprocess
import sys
import types

import numpy as np
import pytest

from actlab import ask, sweep
from actlab.infra.errors import UserError
from actlab.report import answer as A
from actlab.report import comparisons as C
from actlab.report import question as Q
from actlab.report import question_page as page
from conftest import REPO

QUESTION = """
def get_question(arg=None):
  return {{
      "question": "Does ReLU or GELU give the lower loss?",
      "config": "{config}",
      "fixed": {{"data.test_batches": 2, "train.steps": 20, "train.eval_every": 10,
                "train.checkpoint_every": 10, "optim.warmup_steps": 2}},
      "cells": {{"relu": {{"model.activation": "relu"}}, "gelu": {{"model.activation": "gelu"}}}},
      "contrasts": {{"relu_gelu": {{"relu": 1, "gelu": -1}}}},
      "margins": {margins},
      "pilot": {{"lrs": [1e-4, 3e-3], "seeds": [0, 1], "edge": {{3e-3: 1e-2}}}},
      "fresh": {{"first_seed": 100, "cap": 3}},
      "rule": {{"min_seeds": 3}},
  }}
"""


def question_file(tmp: pathlib.Path, margins="[0.1, 0.05]") -> str:
  path = tmp / "q.py"
  path.write_text(QUESTION.format(config=REPO / "tests" / "tiny_config.py", margins=margins))
  return str(path)


@pytest.fixture(scope="module")
def answered(tmp_path_factory):
  """The tiny question asked: shard 0/2 of its pilot, then the whole command (which resumes)."""
  tmp = tmp_path_factory.mktemp("ask")
  spec, lines = question_file(tmp), []
  first = ask.Asked(spec, Q.load(spec), tmp / "q", shard=(0, 2))
  ask.run(first, log=lines.append)
  waited = list(lines)
  ask.run(ask.Asked(spec, Q.load(spec), tmp / "q"), log=lines.append)
  return first, waited, lines


@pytest.mark.slow
def test_a_question_goes_from_its_file_to_a_verdict_computed_from_its_runs(answered):
  a, waited, lines = answered
  assert any("another shard is still training it" in line for line in waited)
  s = a.read()
  assert {c: len(r) for c, r in s.pilot.items()} == {"relu": 6, "gelu": 6}  # 2 LRs + edge, 2 seeds
  assert any("done before" in line for line in lines)  # the second command resumed the pilot
  # The LR each arm's pilot chose, recomputed here: the lowest mean validation loss.
  mean = lambda cell, lr: np.mean([s.pilot[cell][lr, x]["final_val_loss"] for x in (0, 1)])
  chosen = {c: min((1e-4, 3e-3, 1e-2), key=lambda lr: mean(c, lr)) for c in ("relu", "gelu")}
  assert s.lrs == chosen
  assert sorted(x for _, x in s.fresh["relu"]) == [100, 101, 102]  # min_seeds 3 = the cap
  diffs = [s.fresh["relu"][chosen["relu"], x]["final_test_loss"]
           - s.fresh["gelu"][chosen["gelu"], x]["final_test_loss"] for x in (100, 101, 102)]
  v = A.verdicts(s)["relu_gelu"]
  assert v["paired"].mean == pytest.approx(np.mean(diffs), rel=1e-12)
  assert v["interval"] == pytest.approx(C.simultaneous_interval(
      C.paired_difference(diffs, [0.0] * 3), 1))
  flips = [abs(sum(x * d for x, d in zip(signs, diffs))) >= abs(sum(diffs)) - 1e-12
           for signs in itertools.product((1, -1), repeat=3)]
  assert v["p_sign"] == pytest.approx(np.mean(flips))
  report = (a.root / "q.md").read_text()
  assert f"{page.signed(np.mean(diffs))} [" in report and (a.root / "q.png").is_file()
  frozen = json.loads((a.root / "question.json").read_text())
  assert frozen["hash"] in report and frozen["time"] in report and "interim" not in report
  assert frozen["analysis"] == Q.fingerprint()
  assert "analysis: unchanged since the declaration" in report


TRANSFER = """
def get_question(arg=None):
  return {{
      "config": "{config}",
      "fixed": {{"data.test_batches": 2, "train.steps": 20, "train.eval_every": 10,
                "train.checkpoint_every": 10, "optim.warmup_steps": 2}},
      "cells": {{"relu": {{"model.activation": "relu"}}, "gelu": {{"model.activation": "gelu"}},
                "wide": {{"model.activation": "relu", "model.d_model": 64, "model.d_ff": 128}}}},
      "contrasts": {{"relu_gelu": {{"relu": 1, "gelu": -1}}, "width": {{"wide": 1, "relu": -1}}}},
      "pilot": {{"lrs": [1e-4, 3e-3], "seeds": [0, 1]}},
      "fresh": {{"first_seed": 100, "cap": 3}},
      "rule": {{"min_seeds": 3}},
      "by_cell": {{"wide": {{"lr_from": "relu"}}}},
  }}
"""


@pytest.mark.slow
def test_a_cell_that_takes_another_cells_lr_trains_it_after_the_pilot_then_fresh(tmp_path):
  """`by_cell.<cell>.lr_from`: `plan` says it, `run` trains the wide cell at the LR the narrow
  cell's pilot chose (stage transfer/, on the pilot's seeds) and then its fresh seeds; the wide
  cell never trains the pilot's grid."""
  path = tmp_path / "q.py"
  path.write_text(TRANSFER.format(config=REPO / "tests" / "tiny_config.py"))
  a, lines = ask.Asked(str(path), Q.load(str(path)), tmp_path / "q"), []
  ask.plan(a, estimate=False, log=lines.append)
  assert any("wide: no pilot grid; the LR relu's pilot chooses" in line for line in lines)
  assert any("stage transfer: 2 runs of wide" in line for line in lines)
  # --stop_before_new_stage: each run writes the next stage's sweep file and stops before it
  # trains it (to be committed first); the next run trains it.
  stopped = dataclasses.replace(a, stop_new=True)
  for stage, trained, runs in (("pilot", None, 0), ("transfer", "pilot", 8),
                               ("fresh", "transfer", 2)):
    ask.run(stopped, log=lines.append)
    assert (a.root / f"{stage}.sweep.json").is_file() and not (a.root / stage).exists(), stage
    assert lines[-1].startswith(f"ask: {stage}: wrote ")
    assert trained is None or len(list((a.root / trained).glob("arm=*/summary.json"))) == runs
  ask.run(stopped, log=lines.append)
  s = a.read()
  assert s.lrs["wide"] == s.lrs["relu"]
  assert sorted(s.pilot["wide"]) == [(s.lrs["relu"], 0), (s.lrs["relu"], 1)]
  assert (tmp_path / "q" / "transfer").is_dir()
  assert sorted(x for _, x in s.fresh["wide"]) == [100, 101, 102]
  ask.plan(a, estimate=False, log=lines.append)
  assert any("taken from another cell's pilot: wide from relu" in line for line in lines)


@pytest.mark.slow
def test_a_declaration_changed_after_its_pilot_began_is_refused(answered, tmp_path):
  a, _, _ = answered
  changed = question_file(tmp_path, margins="[0.2]")
  with pytest.raises(UserError, match=r"changed after its pilot began \(design\.margins") as e:
    ask.run(ask.Asked(changed, Q.load(changed), a.root))
  assert "\n" not in str(e.value)
  before = ask.Asked(changed, Q.load(changed), tmp_path / "new")
  assert ask.freeze(before, print)["hash"] != json.loads((a.root / "question.json").read_text())[
      "hash"]  # a new directory takes it


BAD = {  # a mistake in a question file -> the field its one line names
    '{"config": "c.py", "cells": {}, "contrasts": {}, "pilot": {}, "fresh": {}}': "cells",
    '{**GOOD, "margin": [0.1]}': "unknown key",
    '{**GOOD, "contrasts": {"x": {"relu": 1, "tanh": -1}}}': "contrasts.x.weights",
    '{**GOOD, "cells": {"relu": {"optim.lr": 1e-3}, "gelu": {}}}': "cells.relu",
    '{**GOOD, "margins": [0]}': "margins",
    '{**GOOD, "fresh": {"cap": 4}}': "fresh",
    '{**GOOD, "pilot": {"lrs": [1e-3], "seeds": [0]}}': "pilot.seeds",
    '{**GOOD, "rule": {"alpha": 2}}': "rule",
    '{**GOOD, "rule": {"power": "high"}}': "rule",
    '{**GOOD, "margins": 0.1}': "margins",
}
GOOD = ('{"config": "configs/tinystories_gelu.py:smoke", "cells": {"relu": {"model.activation": '
        '"relu"}, "gelu": {"model.activation": "gelu"}}, "contrasts": {"d": {"relu": 1, "gelu": '
        '-1}}, "pilot": {"lrs": [1e-3, 3e-3], "seeds": [0, 1]}, "fresh": {"first_seed": 9}}')


@pytest.mark.parametrize("body, field", BAD.items())
def test_a_mistake_in_a_question_file_is_one_line_naming_the_field(tmp_path, body, field):
  path = tmp_path / "bad.py"
  path.write_text(f"GOOD = {GOOD}\n\ndef get_question(arg=None):\n  return {body}\n")
  with pytest.raises(Q.QuestionError, match=field) as e:
    Q.load(str(path))
  assert "\n" not in str(e.value)


def test_a_bad_question_file_exits_2_with_one_line(tmp_path):
  path = tmp_path / "bad.py"
  path.write_text(f"GOOD = {GOOD}\n\ndef get_question(arg=None):\n  return {{**GOOD, "
                  "'margins': [-1]}\n")
  out = subprocess.run([sys.executable, "-m", "actlab.ask", str(path), "plan"], cwd=tmp_path,
                       capture_output=True, text=True)
  assert out.returncode == 2
  assert out.stderr.strip().splitlines() == [
      "error: question bad: margins: one or more numbers > 0 (the first sizes n)"]


@functools.lru_cache(maxsize=None)
def judged(family: str, one_out: bool = False) -> tuple[ask.Asked, A.Stages, dict]:
  """A committed family asked of its runs, its stages and its verdicts, computed once here."""
  a = asked(family)
  s = a.read()
  return a, s, A.verdicts(s, one_out)


OWN_FILES = ("ladder", "optimizer")  # questions in a file of their own, their runs in results/<it>


def asked(family: str) -> ask.Asked:
  """A family of experiments/questions/primary.py over the committed runs, or a question of its
  own file (`OWN_FILES`)."""
  if family in OWN_FILES:
    spec = str(REPO / "experiments" / "questions" / f"{family}.py")
    return ask.Asked(spec, Q.load(spec), REPO / "results" / family)
  spec = str(REPO / "experiments" / "questions" / f"primary.py:{family}")
  return ask.Asked(spec, Q.load(spec), REPO / "results")


COMMITTED = ("page", "recipe", "factorial", *OWN_FILES)


@pytest.mark.parametrize("family", COMMITTED)
def test_every_committed_verdict_reads_its_interval(family):
  """Each verdict `report` prints for the committed questions claims only what its interval
  shows (test_question.py's `reads_its_interval`), and none joins two verdicts with "or"."""
  from test_question import reads_its_interval  # pylint: disable=import-outside-toplevel
  a, _, v = judged(family)
  found = [(c, r["interval"], at["verdict"]) for c in a.q.contrasts if (r := v[c.name])
           for at in r["margins"].values()]
  assert len(found) >= {"page": 7, "recipe": 6, "factorial": 10, "ladder": 6,
                        "optimizer": 6}[family]
  assert not [(c.name, i, x) for c, i, x in found if not reads_its_interval(x, i)]
  assert not [c.name for c, _, x in found if " or " in x.words(c.negative, c.positive)]


def rows(family: str) -> dict[str, str]:
  a, s, v = judged(family, one_out=True)
  return dict(zip((c.name for c in a.q.contrasts), page.table(s, v)[2:], strict=True))


@pytest.mark.parametrize("family", ["page", "recipe", "factorial"])
def test_results_md_prints_the_verdict_tables_ask_computes_from_results(family):
  """Each row of the family's table, every number and verdict, as RESULTS.md holds it."""
  text = (REPO / "RESULTS.md").read_text()
  found = rows(family)
  assert len(found) == {"page": 7, "recipe": 6, "factorial": 5}[family]
  missing = [row for row in found.values() if row not in text]
  assert not missing, missing


@pytest.mark.parametrize("family", OWN_FILES)
def test_results_md_prints_each_questions_answered_rows_and_no_other(family):
  """A contrast of a question file with all its fresh seeds has its row on RESULTS.md as `ask`
  prints it; one still short of them (its cells still training) has no row there."""
  a, _, v = judged(family, one_out=True)
  text, waiting = (REPO / "RESULTS.md").read_text(), set(page.unanswered(a.q, v))
  found = rows(family)
  assert len(found) == {"ladder": 11, "optimizer": 6}[family]
  assert not [row for c, row in found.items() if c not in waiting and row not in text]
  assert not [c for c in waiting if f"| `{c}` |" in text]


def test_the_readmes_answer_table_is_the_reports(capsys):
  """README's table, each verdict at ±0.1 and its interval, as `primary_descriptive.py readme`
  prints it from the reports."""
  found = {f: (a, v, s.sizing, s.lrs) for f in COMMITTED for a, s, v in [judged(f)]}
  runpy.run_path(str(REPO / "experiments" / "primary_descriptive.py"))["readme"](found)
  table = capsys.readouterr().out.strip()
  assert table.count("\n") > 15 and table in (REPO / "README.md").read_text()


def test_a_question_files_pilot_and_cost_are_its_committed_runs(capsys):
  """`primary_descriptive.py question optimizer`, whose cost RESULTS.md cites: every committed run
  counted, per stage and in all, its wall times summed; each cell's pilot line ends with the LR
  the report chose."""
  runpy.run_path(str(REPO / "experiments" / "primary_descriptive.py"))["question"]("optimizer")
  out = capsys.readouterr().out
  root = REPO / "results" / "optimizer"
  for stage in ("pilot", "edge", "fresh"):
    assert f"\n{stage}: {len(list((root / stage).glob('arm=*/summary.json')))} runs" in out
  walls = [json.loads(f.read_text())["wall_time_sec"] for f in root.glob("*/arm=*/summary.json")]
  everything = out.split("all stages: ")[1]
  assert everything.startswith(f"{len(walls)} runs") and f", {sum(walls) / 3600:.1f} h summed" in (
      everything)
  _, s, _ = judged("optimizer")
  chosen = dict(re.findall(r"^pilot (\w+), .*; lr (\S+)$", out, re.MULTILINE))
  assert chosen == {cell: f"{lr:g}" for cell, lr in s.lrs.items()}


def test_a_question_asks_for_deterministic_gpu_ops_unless_it_says_otherwise(tmp_path):
  """On by default, in every cell's declaration; the committed questions whose runs predate the
  field state it off (the optimizer, declared after it, asks it), and the ladder's frozen
  declaration reads the same."""
  decl = Q.declaration(Q.load(question_file(tmp_path)))
  assert [c["train.deterministic_ops"] for c in decl["cells"].values()] == [True, True]
  assert {f: asked(f).q.fixed[Q.DETERMINISTIC] for f in COMMITTED} == {
      "page": False, "recipe": False, "factorial": False, "ladder": False, "optimizer": True}
  ladder = asked("ladder")
  frozen = json.loads((ladder.root / "question.json").read_text())
  assert Q.changes(frozen["declaration"], Q.declaration(ladder.q)) == []


@pytest.mark.parametrize("rung", ["2x128", "4x256", "6x384"])
def test_the_ladders_committed_stages_resume_under_this_code(rung, tmp_path):
  """`ask run --cells='*_RUNG'` writes each stage's sweep file from the question as it reads now
  and checks it against the stage's committed sweep.json: nothing added since may refuse them
  (a field the committed questions fixed at its old value once did)."""
  a, s, _ = judged("ladder")
  a = dataclasses.replace(a, cells=f"*_{rung}")
  stages = {"pilot": dict.fromkeys(a.mine),
            "fresh": {c: (s.lrs[c], s.sizing["cell_n"][c]) for c in a.mine}}
  for stage, lrs in stages.items():
    where = tmp_path / a.stage_dir(stage).name
    where.mkdir()
    shutil.copy(a.stage_dir(stage) / "sweep.json", where)
    spec = where.with_name(f"{where.name}.sweep.json")
    spec.write_text(json.dumps(ask.stage_sweep(a.q, stage, lrs)))
    assert len(sweep.plan(Q.base_config(a.q), str(spec), where, log=lambda _: None)) == {
        "pilot": 60, "fresh": 88}[stage]


def test_the_retest_keeps_every_lr_family_1_chose():
  """The step below the gated pilot moves no arm's LR: no test of family 1 is asked again."""
  first, retest = (asked(f).read() for f in ("page", "retest"))
  chosen = retest.lrs
  assert chosen == {c: first.lrs[c] for c in retest.q.cells}
  assert not any(math.isnan(lr) for lr in chosen.values())


def test_a_field_added_since_the_declaration_is_no_change_at_its_old_value():
  frozen = {"cells": {"relu": {"model.activation": "relu", "optim.clip_norm": 0.0}},
            "design": {"margins": [0.1]}}
  at = lambda spike: {"cells": {"relu": {"model.activation": "relu", "optim.clip_norm": 0.0,
                                         "optim.spike_clip": spike}}, "design": {"margins": [0.1]}}
  assert Q.changes(frozen, at(0.0)) == []  # what every run did before the field existed
  assert Q.changes(frozen, at(10.0)) == ["cells.relu.optim.spike_clip: 0.0 → 10.0"]


@pytest.mark.slow
def test_an_unreadable_declaration_is_refused_not_frozen_anew(answered, tmp_path):
  a, _, _ = answered
  torn = tmp_path / "q"
  torn.mkdir()
  (torn / "question.json").write_text('{"question": "x", "hash"')
  with pytest.raises(UserError, match="question.json is unreadable"):
    ask.freeze(ask.Asked(a.spec, a.q, torn))


def test_cells_picks_a_part_that_trains_into_stage_directories_of_its_own(tmp_path):
  """A GPU's rungs and a CPU's train into their own stage directories; the question reads all."""
  spec = str(REPO / "experiments" / "questions" / "ladder.py")
  q = Q.load(spec)
  part = ask.Asked(spec, q, tmp_path, cells="*_4x256,*_6x384")
  assert part.mine == [c for c in q.cells if not c.endswith("2x128")] and len(part.mine) == 8
  assert part.stage_dir("pilot") == tmp_path / "pilot-_4x256_6x384"
  whole = ask.Asked(spec, q, tmp_path)
  assert whole.mine == list(q.cells) and whole.stage_dir("fresh") == tmp_path / "fresh"
  for stage in ("pilot", "pilot-_2x128", "edge-_2x128", "fresh-_2x128", "pilotx"):
    (tmp_path / stage).mkdir()
  assert [d.name for d in A.dirs(q, tmp_path, "pilot")] == ["edge-_2x128", "pilot", "pilot-_2x128"]
  assert [d.name for d in A.dirs(q, tmp_path, "fresh")] == ["fresh-_2x128"]
  with pytest.raises(UserError, match="--cells=nothing: no cell matches"):
    ask.run(ask.Asked(spec, q, tmp_path, cells="nothing"))


@pytest.mark.slow
def test_plan_estimates_from_walls_of_this_commands_cells_on_this_device_only(answered):
  """A pilot trained on a GPU says nothing of a CPU's wall: such runs, and other cells', are
  left out, and a vectorized program's wall is shared among its runs; the fresh stage's line
  counts this command's cells beside the question's."""
  a, _, _ = answered
  s = a.read()
  mine = ask.Asked(a.spec, a.q, a.root, cells="relu")
  walls = [r["wall_time_sec"] for runs in (s.pilot, s.fresh) for r in runs["relu"].values()]
  assert ask.walls_here(mine, s) == pytest.approx(walls) and len(walls) == 9
  moved = lambda r: {**r, "provenance": [{**r["provenance"][-1], "device_kind": "H100"}]}
  on = lambda f: {c: {k: f(r) for k, r in cell.items()} for c, cell in s.pilot.items()}
  assert ask.walls_here(mine, dataclasses.replace(s, pilot=on(moved), fresh={})) == []
  shared = dataclasses.replace(s, pilot=on(lambda r: {**r, "vectorized_runs": 2}), fresh={})
  assert ask.walls_here(mine, shared) == pytest.approx([w / 2 for w in walls[:6]])
  assert page.stage_lines(s, mine.mine, lambda n: None)[-1] == (
      "  stage fresh: 6 of 6 runs done (n = 3); --cells: 3 of 3")


def test_a_report_before_every_contrast_has_its_seeds_says_it_is_interim(tmp_path):
  q = Q.load(question_file(tmp_path))
  done = {"seeds": [100, 101], "left_out": [102], "n_planned": 3}  # a diverged seed counts
  assert page.unanswered(q, {"relu_gelu": done}) == []
  for short in (None, {**done, "left_out": []}):
    assert page.unanswered(q, {"relu_gelu": short}) == ["relu_gelu"]


@pytest.mark.slow
def test_a_damaged_and_a_missing_run_file_are_each_one_line_naming_the_run(answered, tmp_path):
  """A fresh run's summary.json cut short and another's gone: `report` names each, in a line,
  leaves both out, and says what to do; no traceback, and the contrast is interim."""
  a, _, _ = answered
  root = tmp_path / "q"
  shutil.copytree(a.root, root)
  fresh = sorted((root / "fresh").glob("arm=*"))
  (fresh[0] / "summary.json").write_text('{"broken')
  (fresh[1] / "summary.json").unlink()
  lines = []
  ask.report(ask.Asked(a.spec, a.q, root), log=lines.append)
  text = "\n".join(lines)
  assert f"fresh/{fresh[0].name}: its summary.json is unreadable, never read as a result" in text
  [(cell, damaged), (_, missing)] = [re.match(r"arm=(\w+),seed=(\d+)", f.name).groups()
                                      for f in fresh[:2]]
  assert re.search(rf"- {cell} at LR \S+: 2 of 3 fresh runs not in \(seeds {damaged}–{missing}\)",
                   text)
  assert "interim: 1 of 1 contrasts" in text and "Traceback" not in text


@pytest.mark.slow
def test_report_says_where_the_analysis_changed_since_the_declaration(answered, tmp_path,
                                                                      monkeypatch):
  """The analysis code copied to a scratch package, frozen with the declaration, then one file
  of it changed: `report` names that file; unchanged, it says so."""
  a, _, _ = answered
  package = tmp_path / "actlab"
  for name in Q.ANALYSIS:
    (package / name).parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(Q.PACKAGE / name, package / name)
  root = tmp_path / "q"
  shutil.copytree(a.root, root)
  frozen = json.loads((root / "question.json").read_text())
  frozen["analysis"] = Q.fingerprint(package)
  (root / "question.json").write_text(json.dumps(frozen))
  assert Q.analysis_changes(frozen, package).startswith("analysis: unchanged since")
  with open(package / "report" / "comparisons.py", "a") as f:
    f.write("\nALPHA = 0.1\n")
  said = Q.analysis_changes(frozen, package)
  assert said.startswith("analysis: changed since the declaration in actlab/report/comparisons.py")
  monkeypatch.setattr(Q, "PACKAGE", package)
  lines = []
  ask.report(ask.Asked(a.spec, a.q, root), log=lines.append)
  assert re.search(r"^analysis: changed since the declaration in actlab/report/comparisons\.py",
                   "\n".join(lines), re.M)


def test_the_ladders_report_shows_what_changed_since_its_declaration():
  """Frozen before the analysis had a fingerprint: its report says so and names the commits
  since its freeze that touch the analysis, c5160ba (the rule for a contrast's seeds) among them,
  and the contrasts that now read in other words."""
  a = asked("ladder")
  lines = page.declaration_lines(a.read(), a.root)
  analysis = next(line for line in lines if line.startswith("analysis:"))
  assert "no fingerprint frozen with the declaration" in analysis
  if Q.git(REPO, "cat-file", "-e", "c5160ba") is not None:  # a clone with its history
    assert "c5160ba" in analysis
  words = next(line for line in lines if line.startswith("words:"))
  assert "clip_change_4x256" in words and "gap_none_4x256" not in words


def test_the_figure_names_what_each_side_of_0_means(tmp_path):
  import matplotlib  # pylint: disable=import-outside-toplevel
  matplotlib.use("Agg")
  from matplotlib import pyplot as plt  # pylint: disable=import-outside-toplevel
  fig, ax = plt.subplots()
  page.draw_intervals(ax, [("d", -0.2, -0.3, -0.1)], (0.1,), [("ReLU lower", "GELU lower")])
  assert [t.get_text() for t in ax.texts] == ["← ReLU lower", "GELU lower →"]
  plt.close(fig)


def test_a_one_contrast_figure_has_room_for_its_side_labels(tmp_path):
  import warnings  # pylint: disable=import-outside-toplevel
  v = {"d": {"seeds": [1, 2, 3], "paired": types.SimpleNamespace(mean=-0.2),
             "interval": (-0.3, -0.1)}}
  q = types.SimpleNamespace(
      contrasts=[types.SimpleNamespace(name="d", negative="at 2x128, clipping moves ReLU − GELU "
                                       "toward ReLU", positive="toward GELU")],
      outcome=("final_test_loss", "test loss"), k=1, margins=(0.1, 0.05))
  with warnings.catch_warnings():
    warnings.simplefilter("error")  # matplotlib's "Tight layout not applied" among them
    assert page.figure(q, v, tmp_path / "q.png").exists()


def test_an_equivalence_whose_interval_reaches_past_the_margin_shows_the_tosts_interval():
  """The TOST at Holm's level for its p and the simultaneous interval at 1 − α/K read the same
  data at different levels: where the TOST finds equivalence within ±δ and the simultaneous
  interval reaches past δ, the cell gives the interval the TOST corresponds to, within ±δ."""
  from scipy import stats  # pylint: disable=import-outside-toplevel
  z = np.array([-1.5, -1.0, -0.5, -0.2, 0.0, 0.1, 0.2, 0.5, 1.0, 1.5])
  values = 0.01 + 0.02 * math.sqrt(10) * (z - z.mean()) / z.std(ddof=1)  # mean 0.01, se 0.02
  d = C.paired_difference(values, np.zeros(10), 0.05)
  interval = C.simultaneous_interval(d, 1)
  contrast = types.SimpleNamespace(negative="A lower", positive="B lower")
  se = d.sd / math.sqrt(d.n)
  for multiplier in (1.0, 1.25):  # the TOST's p as Holm adjusts it: at α·p/p̃ one-sided
    at = {"p_equiv": d.p_equiv, "p_equiv_holm": multiplier * d.p_equiv}
    at["verdict"] = C.judge(interval, 0.05, at["p_equiv_holm"])
    assert at["verdict"].kind == C.EQUIVALENT and interval[1] > 0.05 > at["p_equiv_holm"]
    words = page.verdict_words(contrast, at, {"paired": d, "interval": interval})
    found = re.search(r"the TOST's interval \[(\S+), (\S+)\] lies within ±0.05, the simultaneous "
                      r"one reaches past it", words)
    assert words.startswith("**equivalent within ±0.05** (TOST Holm p ") and found, words
    low, high = (float(x.replace("−", "-")) for x in found.groups())
    half = stats.t.ppf(1 - 0.05 / multiplier, 9) * se
    assert (low, high) == pytest.approx((d.mean - half, d.mean + half), abs=6e-4)
    assert -0.05 <= low and high <= 0.05
  wide = C.paired_difference(values, np.zeros(10), 0.1)  # the interval within ±0.1: no note
  at = {"p_equiv": wide.p_equiv, "p_equiv_holm": wide.p_equiv,
        "verdict": C.judge(interval, 0.1, wide.p_equiv)}
  assert page.verdict_words(contrast, at, {"paired": wide, "interval": interval}) == (
      f"**equivalent within ±0.1** (TOST Holm p {wide.p_equiv:.2g})")


@pytest.mark.parametrize("family", COMMITTED)
def test_each_committed_questions_report_is_committed_as_report_writes_it(family):
  """`ask … report`'s page (design, declaration, analysis line, verdict table, runs not in) is
  committed beside the runs, equal to what `report` writes now, with no machine's paths in it.
  Without the git history the analysis line cannot name its commits: that line is left aside."""
  a, s, v = judged(family, one_out=True)
  path = ask.report_path(a)
  committed, now = path.read_text(), ask.report_text(a, s, v)
  assert "| verdict at ±0.1 |" in committed and not re.search(r"/(work|root|tmp|home)/", committed)
  if "git cannot list the commits" in now:
    analysis = lambda text: [x for x in text.splitlines() if not x.startswith("analysis:")]
    committed, now = analysis(committed), analysis(now)
  assert committed == now, f"rewrite it: python -m actlab.ask {a.spec} report --workdir={a.root}"
  if Q.git(REPO, "rev-parse", "--git-dir") is not None:  # a checkout: tracked, not ignored
    assert Q.git(REPO, "ls-files", "--error-unmatch", str(path)) is not None


def prose(name: str) -> str:
  """A page's prose above "## Reproducing" (RESULTS.md's tested families, the ladder and the
  optimizer; all of README), tables left out, its whitespace one space."""
  text = (REPO / name).read_text().split("\n## Reproducing")[0]
  return re.sub(r"\s+", " ", " ".join(x for x in text.splitlines() if not x.startswith("|")))


VERDICT_WORDS = re.compile(r"by at least|by less than|equivalent|not resolved|not placed")
NOT_VERDICTS = (  # the prose's verdict words that retell no contrast's verdict
    "Held against ±δ it gives one of five verdicts, each read from the interval alone: **A lower "
    "by at least δ** (it lies beyond −δ), **A lower by less than δ** (it lies between −δ and 0), "
    "**A lower; its size not resolved against δ** (it excludes 0 and spans −δ), **equivalent "
    "within ±δ** (it holds 0 and the two one-sided tests against ±δ reject, Holm-adjusted over "
    "the family), or **not resolved**; the same for B.",
    "the template then in use printed \"A lower, by less than δ or by an amount not resolved\"",
    "an interval inside (−δ, 0) read \"equivalent (A lower by less than δ)\" and now reads \"A "
    "lower by less than δ\"",
    "Under the rule the claim rule replaced, tests 1–7 read: ReLU better; equivalent; not "
    "resolved (below the seed sd); ReLU better; GELU better; not resolved; not resolved.",
)
SPIKE_ONLY = ("it moves the gap toward GELU by +0.042 ([+0.010, +0.073]): by less than 0.1, and "
              "by an amount not resolved against 0.05")
MUON_RELU2 = "GELU's test loss is lower than ReLU²'s by less than 0.1 and by at least 0.05"
# (family, contrast, margin, the phrase, the seed left out or None): each verdict the prose
# retells for a named contrast, as the prose words it; a phrase that retells two margins' is
# (the phrase, the words of this margin's verdict within it).
RETOLD = [
    ("recipe", "recipe_clip", 0.1, "ReLU − GELU is **equivalent within ±δ** (−0.016", None),
    ("factorial", "relu_gelu", 0.1, "ReLU is lower than GELU by at least 0.1 again", None),
    ("factorial", "clip_change", 0.1, "clipping at 1.0 moves ReLU − GELU toward GELU by at least "
     "0.1 (+0.305", None),
    ("factorial", "spike_change", 0.1, "tested) moves ReLU − GELU toward GELU by less than 0.1 "
     "(+0.042", None),
    ("factorial", "block_change", 0.1, "the LLaMA-style block moves it toward GELU by at least "
     "0.1 (+0.289", None),
    ("page", "relu_gelu", 0.1, "**ReLU gives the lower loss, by at least δ.**", None),
    ("page", "geglu_gelu", 0.1, "test 3's GELU advantage, which the old rule left unclaimed "
     "because the mean (0.102) was below the sd of single differences (0.177), is claimed in "
     "direction; its size is not resolved against δ", None),
    ("page", "swiglu_silu", 0.1, "**2, SwiGLU − SiLU: equivalent within ±0.1 nats.**", None),
    ("page", "geglu_gelu", 0.1, "**3, GEGLU − GELU: GELU lower; its size not resolved against "
     "δ.**", None),
    ("page", "reglu_relu", 0.1, "**4, ReGLU − ReLU: ReLU lower by at least δ.**", None),
    ("page", "swiglu_silu", 0.1, "gating's change to the loss is equivalent to none within ±0.1",
     None),
    ("page", "bert_relu_gelu", 0.1, "**5, ReLU − GELU: GELU gives the lower `[MASK]` loss, by at "
     "least δ.**", None),
    ("page", "bert_tanh_gelu", 0.1, "**6, tanh − GELU: not resolved.**", None),
    ("page", "bert_tanh_gelu", 0.1, "not equivalent either (TOST against ±0.1", None),
    ("page", "bert_swiglu_gelu", 0.1, "**7, SwiGLU − GELU: not resolved.**", None),
    ("recipe", "recipe_clip", 0.1, "**`recipe_clip`: equivalent within ±δ.**", None),
    ("recipe", "recipe_warmup", 0.1, "**`recipe_warmup`: ReLU lower; by how much is not resolved "
     "against δ.**", None),
    ("recipe", "recipe_warmup", 0.1, "so the direction is claimed (Holm p 0.020) and the size is "
     "not placed against δ. ReLU is lower", None),
    ("recipe", "recipe_wide", 0.1, "**`recipe_wide`: not resolved.**", None),
    ("recipe", "recipe_clip_warmup", 0.1, "**`recipe_clip_warmup`: equivalent within ±δ.**", None),
    ("recipe", "recipe_clip_warmup", 0.1, "simultaneous [−0.045, +0.026]: equivalent within ±0.1",
     None),
    ("recipe", "modern_relu_gelu", 0.1, "**`modern_relu_gelu`: equivalent within ±δ.**", None),
    ("recipe", "modern_relu2_gelu", 0.1, "**`modern_relu2_gelu`: ReLU² lower by less than δ.**",
     None),
    ("recipe", "modern_relu2_gelu", 0.1, "so ReLU² is lower by less than δ", None),
    ("factorial", "relu_gelu", 0.1, "ReLU lower by at least 0.1 and at least 0.05", None),
    ("factorial", "relu_gelu", 0.05, "ReLU lower by at least 0.1 and at least 0.05", None),
    ("factorial", "clip_change", 0.1, "**Clipping at 1.0 moves ReLU − GELU toward GELU by at "
     "least 0.1**", None),
    ("factorial", "spike_change", 0.1, (SPIKE_ONLY, "by less than 0.1"), None),
    ("factorial", "spike_change", 0.05, (SPIKE_ONLY, "by an amount not resolved against 0.05"),
     None),
    ("factorial", "spike_vs_clip", 0.1, "it moves ReLU − GELU toward ReLU by at least 0.1", None),
    ("factorial", "block_change", 0.1, "**The LLaMA-style block moves it toward GELU by at least "
     "0.1**", None),
    ("ladder", "gap_none_2x128", 0.1, "ReLU's test loss is lower than GELU's in all 22 seeds, by "
     "0.289 [−0.311, −0.267]: lower by at least 0.1", None),
    ("ladder", "gap_clip_2x128", 0.05, "ReLU is lower by less than 0.05: −0.027", None),
    ("ladder", "clip_change_2x128", 0.1, "it moves ReLU − GELU toward GELU by +0.262 [+0.235, "
     "+0.289], by at least 0.1", None),
    ("ladder", "gap_none_4x256", 0.1, "ReLU's test loss is lower than GELU's in all 22 seeds, by "
     "0.078 on average. The interval excludes 0 and spans both −0.1 and −0.05, so the gap's size "
     "is not resolved", None),
    ("ladder", "gap_none_4x256", 0.05, "ReLU's test loss is lower than GELU's in all 22 seeds, by "
     "0.078 on average. The interval excludes 0 and spans both −0.1 and −0.05, so the gap's size "
     "is not resolved", None),
    ("ladder", "gap_none_4x256", 0.1, "ReLU lower by less than 0.1 (the row's \"one seed out\")",
     1006),
    ("ladder", "gap_clip_4x256", 0.05, "the two are equivalent within ±0.05", None),
    ("ladder", "clip_change_4x256", 0.1, "it moves ReLU − GELU toward GELU by +0.089 [+0.028, "
     "+0.149], in all 22 seeds, by an amount not resolved against either margin", None),
    ("ladder", "clip_change_4x256", 0.05, "it moves ReLU − GELU toward GELU by +0.089 [+0.028, "
     "+0.149], in all 22 seeds, by an amount not resolved against either margin", None),
    ("ladder", "gap_none_6x384", 0.1, "ReLU's test loss is lower than GELU's by 0.057 on average, "
     "in 20 of 22 seeds: [−0.102, −0.012], ReLU lower, its size not resolved against 0.1", None),
    ("ladder", "gap_none_6x384", 0.05, "ReLU lower, its size not resolved against 0.1 (the "
     "interval's end passes −0.1 by 0.002) or 0.05", None),
    ("ladder", "gap_clip_6x384", 0.05, "ReLU is lower by less than 0.05: −0.031", None),
    ("ladder", "clip_change_6x384", 0.1, "+0.027 [−0.018, +0.072], equivalent to none within "
     "±0.1", None),
    ("ladder", "clip_change_6x384", 0.05, "not resolved against ±0.05", None),
    ("ladder", "scale_change_none", 0.1, "ReLU − GELU moves toward GELU by at least 0.1: +0.232",
     None),
    ("ladder", "scale_change_clip", 0.05, "the gap's change is equivalent to none within ±0.05",
     None),
    ("optimizer", "relu_gelu_adamw", 0.1, "ReLU's test loss is lower than GELU's by at least 0.1: "
     "−0.285 [−0.298, −0.272]", None),
    ("optimizer", "relu2_gelu_adamw", 0.1, "ReLU²'s test loss is lower than GELU's by at least 0.1 "
     "too: −0.164", None),
    ("optimizer", "relu_gelu_muon", 0.05, "GELU's test loss is lower than ReLU's by less than 0.05: "
     "+0.021", None),
    ("optimizer", "relu2_gelu_muon", 0.1, (MUON_RELU2, "by less than 0.1"), None),
    ("optimizer", "relu2_gelu_muon", 0.05, (MUON_RELU2, "by at least 0.05"), None),
    ("optimizer", "relu_gelu_change", 0.1, "Moving to Muon moves ReLU − GELU toward GELU by at "
     "least 0.1: +0.306", None),
    ("optimizer", "relu2_gelu_change", 0.1, "moves ReLU² − GELU toward GELU by at least 0.1: "
     "+0.221", None),
]
SAYS = {C.BEYOND: "at least", C.WITHIN: "less than", C.UNSIZED: "not resolved|not placed",
        C.EQUIVALENT: "equivalent", C.NOT_RESOLVED: "not resolved|not equivalent"}


def says(phrase: str, claim: str, v, c) -> str | None:
  """Why `phrase` does not retell the Verdict `v` of contrast `c`, or None where it does: in
  `claim` (the phrase, or its words for this margin) the verdict's words and no other's and its
  margin; in the phrase, for a side, the arm or direction it names."""
  kind = "unsized" if v.kind == C.UNSIZED else v.kind
  if not re.search(SAYS[kind], claim):
    return f"says no {v.kind}"
  others = {C.BEYOND: "at least", C.WITHIN: "less than", C.EQUIVALENT: "equivalent within|"
            "equivalent to none"}
  if wrong := [k for k, w in others.items() if k != v.kind and re.search(w, claim)]:
    return f"says {wrong}"
  if v.kind != C.NOT_RESOLVED and not any(m in claim for m in (
      f"{v.margin:g}", "δ" if v.margin == 0.1 else "±0.1", "either margin")):
    return f"names no margin {v.margin:g}"
  if v.side:
    side = c.negative if v.side < 0 else c.positive
    named = side[side.index("toward"):] if "toward" in side else side.split()[0]
    pattern = (re.escape(named) if "toward" in side else
               rf"{re.escape(named)}(?:'s test loss)?(?: is| gives the)? lower")
    if not re.search(pattern, phrase) and not (named in phrase and "advantage" in phrase):
      return f"names not {named!r}"
  return None


def test_every_verdict_the_prose_retells_is_its_contrasts_verdict():
  """Each verdict RESULTS.md's prose (the tested families, the ladder, the optimizer) and README's
  retell for a named contrast reads as that contrast's verdict in `ask … report` at its margin (with a
  seed left out, that row's "one seed out"); and every verdict word in that prose is one of
  them or of the page's description of the rule, so a new sentence retelling a verdict must be
  listed here, and checked, to pass."""
  text = {name: prose(name) for name in ("RESULTS.md", "README.md")}
  wrong, covered = [], {name: [] for name in text}
  for phrase in NOT_VERDICTS:
    assert phrase in text["RESULTS.md"], phrase
    start = text["RESULTS.md"].index(phrase)
    covered["RESULTS.md"].append((start, start + len(phrase)))
  for family, name, margin, phrase, without in RETOLD:
    phrase, claim = phrase if isinstance(phrase, tuple) else (phrase, phrase)
    assert claim in phrase
    where = [n for n, t in text.items() if phrase in t]
    assert where, f"not on the page: {phrase}"
    for n in where:
      covered[n] += [(m.start(), m.end()) for m in re.finditer(re.escape(phrase), text[n])]
    a, _, v = judged(family, one_out=True)
    c = next(c for c in a.q.contrasts if c.name == name)
    at = v[name]["margins"][margin]
    verdict = at["verdict"] if without is None else at["moved_by"][without]
    if why := says(phrase, claim, verdict, c):
      wrong.append((name, margin, phrase, why))
  assert not wrong, wrong
  loose = [(n, t[max(0, m.start() - 80):m.end() + 20]) for n, t in text.items()
           for m in VERDICT_WORDS.finditer(t)
           if not any(lo <= m.start() < hi for lo, hi in covered[n])]
  assert not loose, loose

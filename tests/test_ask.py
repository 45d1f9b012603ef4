"""actlab.ask: a question file from declaration to verdict. A tiny two-arm question trained end to
end (its pilot split across two shards, the second resuming the stage; the step past an edge; n
from the pilot; the fresh seeds; the verdict recomputed from the runs here), a declaration changed
after its pilot began refused, bad question files one line and exit 2, and RESULTS.md's tables
reproduced from the committed runs (`results/`). The model's statistics: tests/test_question.py."""

import itertools
import json
import math
import pathlib
import subprocess
import sys

import numpy as np
import pytest

from actlab import ask
from actlab.infra.errors import UserError
from actlab.report import comparisons
from actlab.report import question as Q
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
  pilot = Q.cell_runs(a.q, a.dirs("pilot"))
  assert {c: len(r) for c, r in pilot.items()} == {"relu": 6, "gelu": 6}  # 2 LRs + edge, 2 seeds
  assert any("done before" in line for line in lines)  # the second command resumed the pilot
  # The LR each arm's pilot chose, recomputed here: the lowest mean validation loss.
  mean = lambda cell, lr: np.mean([pilot[cell][lr, s]["final_val_loss"] for s in (0, 1)])
  chosen = {c: min((1e-4, 3e-3, 1e-2), key=lambda lr: mean(c, lr)) for c in ("relu", "gelu")}
  assert Q.choose(a.q, pilot)["lr"] == chosen
  fresh = Q.cell_runs(a.q, a.dirs("fresh"))
  assert sorted(s for _, s in fresh["relu"]) == [100, 101, 102]  # min_seeds 3 = the cap
  diffs = [fresh["relu"][chosen["relu"], s]["final_test_loss"]
           - fresh["gelu"][chosen["gelu"], s]["final_test_loss"] for s in (100, 101, 102)]
  v = Q.verdicts(a.q, fresh, chosen, Q.size(a.q, pilot, chosen))["relu_gelu"]
  assert v["paired"].mean == pytest.approx(np.mean(diffs), rel=1e-12)
  assert v["interval"] == pytest.approx(comparisons.simultaneous_interval(
      comparisons.paired_difference(diffs, [0.0] * 3), 1))
  flips = [abs(sum(s * d for s, d in zip(signs, diffs))) >= abs(sum(diffs)) - 1e-12
           for signs in itertools.product((1, -1), repeat=3)]
  assert v["p_sign"] == pytest.approx(np.mean(flips))
  report = (a.root / "q.md").read_text()
  assert f"{ask.signed(np.mean(diffs))} [" in report and (a.root / "q.png").is_file()
  frozen = json.loads((a.root / "question.json").read_text())
  assert frozen["hash"] in report and frozen["time"] in report and "interim" not in report


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


def asked(family: str) -> ask.Asked:
  """A family of experiments/questions/primary.py over the committed runs."""
  spec = str(REPO / "experiments" / "questions" / f"primary.py:{family}")
  return ask.Asked(spec, Q.load(spec), REPO / "results")


def results_table(family: str) -> list[str]:
  a = asked(family)
  v, sizing, lrs = ask.answer(a)
  return ask.table(a, v, sizing, lrs)


@pytest.mark.parametrize("family", ["page", "recipe", "factorial"])
def test_results_md_prints_the_verdict_tables_ask_computes_from_results(family):
  """Each row of the family's table, every number and verdict, as RESULTS.md holds it."""
  page = (REPO / "RESULTS.md").read_text()
  rows = results_table(family)[2:]
  assert len(rows) == {"page": 7, "recipe": 6, "factorial": 5}[family]
  missing = [row for row in rows if row not in page]
  assert not missing, missing


def test_results_md_prints_the_ladders_answered_rows_and_no_other():
  """A ladder contrast with all its fresh seeds has its row on RESULTS.md as `ask` prints it, and
  its simultaneous interval in the README's table; one still short of them (the rungs waiting
  for a GPU, a rung still training) has no row there."""
  spec = str(REPO / "experiments" / "questions" / "ladder.py")
  a = ask.Asked(spec, Q.load(spec), REPO / "results" / "ladder")
  v, sizing, lrs = ask.answer(a)
  page, waiting = (REPO / "RESULTS.md").read_text(), set(ask.unanswered(a, v))
  readme = (REPO / "README.md").read_text()
  rows = dict(zip((c.name for c in a.q.contrasts), ask.table(a, v, sizing, lrs)[2:], strict=True))
  answered = {c: row for c, row in rows.items() if c not in waiting}
  assert len(rows) == 11
  assert not [row for row in answered.values() if row not in page]
  interval = lambda row: row.strip("|").split("|")[6].strip()  # the simultaneous interval
  assert not [c for c, row in answered.items() if f"| {interval(row)} |" not in readme]
  assert not [c for c in waiting if f"| `{c}` |" in page]


def test_the_retest_keeps_every_lr_family_1_chose():
  """The step below the gated pilot moves no arm's LR: no test of family 1 is asked again."""
  page, retest = (asked(f) for f in ("page", "retest"))
  chosen = Q.choose(retest.q, retest.runs("pilot"))["lr"]
  assert chosen == {c: Q.choose(page.q, page.runs("pilot"))["lr"][c] for c in retest.q.cells}
  assert not any(math.isnan(lr) for lr in chosen.values())


def test_a_field_added_since_the_declaration_is_no_change_at_its_old_value():
  frozen = {"cells": {"relu": {"model.activation": "relu"}}, "design": {"margins": [0.1]}}
  at = lambda spike: {"cells": {"relu": {"model.activation": "relu", "optim.spike_clip": spike}},
                      "design": {"margins": [0.1]}}
  assert ask.changes(frozen, at(0.0)) == []  # what every run did before the field existed
  assert ask.changes(frozen, at(10.0)) == ["cells.relu.optim.spike_clip: 0.0 → 10.0"]


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
  assert [d.name for d in whole.dirs("pilot")] == ["edge-_2x128", "pilot", "pilot-_2x128"]
  assert [d.name for d in whole.dirs("fresh")] == ["fresh-_2x128"]
  with pytest.raises(UserError, match="--cells=nothing: no cell matches"):
    ask.run(ask.Asked(spec, q, tmp_path, cells="nothing"))


@pytest.mark.slow
def test_plan_estimates_from_walls_of_this_commands_cells_on_this_device_only(answered):
  """A pilot trained on a GPU says nothing of a CPU's wall: such runs, and other cells', are
  left out, and a vectorized program's wall is shared among its runs; the fresh stage's line
  counts this command's cells beside the question's."""
  a, _, _ = answered
  runs = a.runs("pilot")
  mine = ask.Asked(a.spec, a.q, a.root, cells="relu")
  walls = [s["wall_time_sec"] for s in runs["relu"].values()]
  assert ask.walls_here(mine, runs) == pytest.approx(walls) and len(walls) == 6
  elsewhere = lambda s: {**s, "provenance": [{**s["provenance"][-1], "device_kind": "H100"}]}
  moved = {c: {k: elsewhere(s) for k, s in cell.items()} for c, cell in runs.items()}
  assert ask.walls_here(mine, moved) == []
  grouped = {c: {k: {**s, "vectorized_runs": 2} for k, s in cell.items()}
             for c, cell in runs.items()}
  assert ask.walls_here(mine, grouped) == pytest.approx([w / 2 for w in walls])
  assert ask.plan_lines(mine, estimate=False)[-1] == (
      "  stage fresh: 6 of 6 runs done (n = 3); --cells: 3 of 3")


def test_a_report_before_every_contrast_has_its_seeds_says_it_is_interim(tmp_path):
  spec = question_file(tmp_path)
  a = ask.Asked(spec, Q.load(spec), tmp_path / "q")
  done = {"seeds": [100, 101], "left_out": [102], "n_planned": 3}  # a diverged seed counts
  assert ask.interim(a, {"relu_gelu": done}) == []
  for short in (None, {**done, "left_out": []}):
    [line] = ask.interim(a, {"relu_gelu": short})
    assert line.startswith("interim: 1 of 1 contrasts short of their planned fresh seeds")

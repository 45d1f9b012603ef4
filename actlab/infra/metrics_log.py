"""metrics.jsonl, one JSON row per log step: read (skipping torn lines) and written, rebuilt on
resume from the checkpoint's rows so that a resumed log equals an uninterrupted one."""

import json
import pathlib
import sys

from actlab.infra.workdir import write_text


def read_rows(path: pathlib.Path) -> tuple[list[dict], int]:
  """The readable rows of a metrics.jsonl and how many lines were torn or mangled (skipped)."""
  try:
    lines = path.read_text().splitlines()
  except OSError:
    return [], 0
  rows, bad = [], 0
  for line in filter(str.strip, lines):
    try:
      row = json.loads(line)
    except ValueError:
      row = None
    if isinstance(row, dict) and isinstance(row.get("step"), int):
      rows.append(row)
    else:
      bad += 1
  return rows, bad


class MetricsLog:
  """The log, starting as `rows`: those up to `step` that the restored checkpoint carries (none
  for a fresh run). A file that differs (rows past them, torn lines) is rewritten, with a line
  saying what changed."""

  def __init__(self, path: pathlib.Path, rows: list[dict], step: int):
    self.path = path
    self.rows = list(rows)
    on_disk, bad = read_rows(path)
    if on_disk != self.rows:
      later = sum(r["step"] > step for r in on_disk)
      missing = sum(r not in on_disk for r in self.rows)
      news = [f"{n} {what}" for n, what in ((later, f"row(s) after step {step} dropped"),
                                            (bad, "unreadable line(s) dropped"),
                                            (missing, "row(s) restored")) if n]
      if news:
        print(f"actlab: {path} rebuilt from the checkpoint of step {step}: {', '.join(news)}",
              file=sys.stderr)
      write_text(path, "".join(json.dumps(r) + "\n" for r in self.rows))

  def write(self, row: dict) -> None:
    self.rows.append(row)
    with self.path.open("a") as f:
      f.write(json.dumps(row) + "\n")

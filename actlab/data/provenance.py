"""The manual files prepared TFDS data came from, and whether they changed since:
``actlab_sources.json`` beside the prepared data holds ``{split: {"file", "size", "mtime_ns"}}``
for the split files taken from the manual directory, ``null`` for downloaded ones. A manual file
present now that differs from its entry makes the data stale; a removed one does not.
"""

import datetime
import json
import os
from pathlib import Path

SOURCES_FILE = "actlab_sources.json"  # beside the prepared data: the manual files it came from


def manual_sources(manual_dir: Path | None, files: dict[str, str]) -> dict[str, dict]:
  """{split: {"file", "size", "mtime_ns"}} for the split files present in ``manual_dir``."""
  sources = {}
  for split, name in files.items():
    if manual_dir is not None and (manual_dir / name).is_file():
      st = (manual_dir / name).stat()
      sources[split] = {"file": name, "size": st.st_size, "mtime_ns": st.st_mtime_ns}
  return sources


def write_record(data_dir: str | os.PathLike, record: dict[str, dict | None]) -> None:
  """Record {split: manual_sources entry or None if downloaded} beside the data."""
  (Path(data_dir) / SOURCES_FILE).write_text(json.dumps(record, indent=1) + "\n")


def read_record(data_dir: str | os.PathLike) -> dict | None:
  """The prepared data's record, {split: manual_sources entry or None if downloaded}, if any."""
  try:
    record = json.loads((Path(data_dir) / SOURCES_FILE).read_text())
  except (OSError, ValueError):
    return None
  return record if isinstance(record, dict) else None


def _change(was: dict | None, now: dict) -> str:
  if was is None:
    return f"{now['file']} is new (the prepared data came from a download)"
  if was["size"] != now["size"]:
    return f"{now['file']} changed (size {was['size']:,} → {now['size']:,})"
  return f"{now['file']} changed (modified {_time(was)} → {_time(now)})"


def _time(source: dict) -> str:
  t = datetime.datetime.fromtimestamp(source["mtime_ns"] / 1e9)
  return t.isoformat(sep=" ", timespec="milliseconds")


def stale_reason(data_dir: str | os.PathLike, files: dict[str, str], manual_dir: Path) -> str:
  """Why the data prepared in ``data_dir`` is not from the manual ``files`` present now, or ""."""
  now = manual_sources(manual_dir, files)
  if not now:  # prepared from downloads, or the files were removed after preparing
    return ""
  recorded = read_record(data_dir)
  if recorded is None:
    return f"no record of the manual files the data under {data_dir} was prepared from"
  changes = [_change(recorded.get(split), src) for split, src in now.items()
             if recorded.get(split) != src]
  return f"manual file{'s' if len(changes) > 1 else ''} " + ", ".join(changes) if changes else ""

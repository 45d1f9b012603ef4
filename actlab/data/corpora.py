"""The corpora a run can train on: the embedded synthetic stories, or TinyStories
(tinystories.py). Each gives its splits' `texts(split)`, `num_texts(split)` and a `source_id(split)`
that changes with the texts and keys the token caches."""

from __future__ import annotations

import hashlib
from pathlib import Path


class Synthetic:
  """The embedded stories (synthetic.py), fingerprinted by their SHA-256."""

  def texts(self, split: str) -> list[str]:
    from actlab.data import synthetic
    return synthetic.texts(split)

  def num_texts(self, split: str) -> int:
    return len(self.texts(split))

  def source_id(self, split: str) -> str:
    h = hashlib.sha256()
    for t in self.texts(split):
      h.update(t.encode("utf-8") + b"\0")
    return f"synthetic/{split}:sha256={h.hexdigest()[:16]}"


def key(config) -> str:
  """The corpus' directory name under tokens/ and tokenizers/."""
  if config.data.source == "tinystories":
    return f"tinystories-{config.data.tinystories_version}"
  return config.data.source


def open_corpus(config, root: Path):
  """The corpus of `config.data.source`, its files under the data dir `root`."""
  source = config.data.source
  if source == "synthetic":
    return Synthetic()
  if source == "tinystories":
    from actlab.data import tinystories
    manual = config.data.manual_dir or str(root / "manual" / "tiny_stories")
    return tinystories.Corpus(
        version=config.data.tinystories_version,
        data_dir=root / "tfds", manual_dir=Path(manual).expanduser())
  raise ValueError(f"data.source={source!r}: choose 'tinystories' or 'synthetic'")

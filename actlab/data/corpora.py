"""The corpora a run can train on, each as its two splits' texts and a fingerprint that keys the
token caches: the embedded synthetic stories, or TinyStories (tinystories.py)."""

from __future__ import annotations

import hashlib
from pathlib import Path


class Corpus:
  """A source's two splits: texts on demand, plus a fingerprint that keys the caches."""

  key: str  # directory name under tokens/ and tokenizers/

  def texts(self, split: str):  # -> Iterable[str]
    raise NotImplementedError

  def num_texts(self, split: str) -> int | None:
    return None

  def source_id(self, split: str) -> str:
    raise NotImplementedError


class Synthetic(Corpus):
  key = "synthetic"

  def __init__(self):
    from actlab.data import synthetic
    self._mod = synthetic
    self._texts: dict[str, list[str]] = {}
    self._ids: dict[str, str] = {}

  def _get(self, split: str) -> list[str]:
    if split not in self._texts:
      self._texts[split] = list(self._mod.texts(split))
    return self._texts[split]

  def texts(self, split):
    return self._get(split)

  def num_texts(self, split):
    return len(self._get(split))

  def source_id(self, split):
    if split not in self._ids:
      h = hashlib.sha256()
      for t in self._get(split):
        h.update(t.encode("utf-8"))
        h.update(b"\0")
      self._ids[split] = f"synthetic/{split}:sha256={h.hexdigest()[:16]}"
    return self._ids[split]


def key(config) -> str:
  """The corpus' directory name under tokens/ and tokenizers/."""
  if config.data.source == "tinystories":
    return f"tinystories-{config.data.tinystories_version}"
  return config.data.source


def open_corpus(config, root: Path) -> Corpus:
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

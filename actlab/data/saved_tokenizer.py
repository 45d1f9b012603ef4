"""A tokenizer saved with a run (`<workdir>/tokenizer/`): its defining files and a manifest with
their SHA-256, so that sampling and export need nothing but the run directory, and a changed
file is refused instead of silently giving other ids."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from actlab.data import DataError
from actlab.data.tokenizer import (ByteTokenizer, HFBPETokenizer, HFWordPieceTokenizer, Tokenizer,
                                   parse_spec, write_atomic)


MANIFEST = "actlab_tokenizer.json"  # in a saved tokenizer's directory: its name and checksums


def save(tok: Tokenizer, directory: Path) -> None:
  """Writes `tok`'s defining files (`Tokenizer.files`) into `directory`, then `MANIFEST` (last: a
  directory without it holds no tokenizer). `load` gives back the same ids."""
  files = tok.files()
  for name, data in files.items():
    write_atomic(Path(directory) / name, data)
  meta = {"name": tok.name, "fingerprint": tok.fingerprint, "vocab_size": tok.vocab_size,
          "sha256": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}
  write_atomic(Path(directory) / MANIFEST, (json.dumps(meta, indent=2) + "\n").encode())


def load(directory: Path) -> Tokenizer | None:
  """The tokenizer `save` wrote into `directory`, or None if there is none. Raises DataError if
  a file differs from the one saved."""
  directory = Path(directory)
  try:
    meta = json.loads((directory / MANIFEST).read_text())
  except (OSError, ValueError):
    return None
  for name, digest in meta["sha256"].items():
    path = directory / name
    if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != digest:
      raise DataError(f"{path} is missing or differs from the tokenizer saved with the run; "
                      "restore it from a copy of the run directory")
  kind, _ = parse_spec(meta["name"])
  if kind == "byte":
    tok = ByteTokenizer()
  elif kind == "gpt2":
    from actlab.data.gpt2 import gpt2_saved  # imported here: actlab.data.gpt2 imports tokenizer.py
    tok = gpt2_saved(directory)
  else:
    cls = HFWordPieceTokenizer if kind == "wordpiece" else HFBPETokenizer
    tok = cls.load(directory / "tokenizer.json", meta["name"])
  if tok.fingerprint != meta["fingerprint"]:
    raise DataError(f"the tokenizer in {directory} is {tok.fingerprint}, saved as "
                    f"{meta['fingerprint']}; restore it from a copy of the run directory")
  return tok

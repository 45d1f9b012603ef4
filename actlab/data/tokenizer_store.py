"""A tokenizer by its spec (`get`: built, trained or loaded), and the copy saved with a run
(`<workdir>/tokenizer/`: its defining files and a manifest of their SHA-256), so that sampling and
export need only the run directory and a changed file is refused rather than giving other ids."""

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from actlab.data import gpt2
from actlab.data.tokenizer import (ByteTokenizer, HFBPETokenizer, HFWordPieceTokenizer, Tokenizer,
                                   parse_spec)
from actlab.infra.errors import DataError

MANIFEST = "actlab_tokenizer.json"  # in a saved tokenizer's directory: its name and checksums
TRAINED = {"bpe": HFBPETokenizer, "wordpiece": HFWordPieceTokenizer}  # saved as tokenizer.json


def write_atomic(path: Path, data: bytes) -> None:
  """Writes `data` to `path` whole or not at all (temp file, rename)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
  tmp.write_bytes(data)
  os.replace(tmp, path)


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
  """The tokenizer `save` wrote into `directory` (None if none); DataError if a file changed."""
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
    tok = gpt2.gpt2_saved(directory)
  else:
    tok = TRAINED[kind].load(directory / "tokenizer.json", meta["name"])
  if tok.fingerprint != meta["fingerprint"]:
    raise DataError(f"the tokenizer in {directory} is {tok.fingerprint}, saved as "
                    f"{meta['fingerprint']}; restore it from a copy of the run directory")
  return tok


def get(spec: str, *, directory: str | os.PathLike,
        train_texts: Callable[[], Iterable[str]] | None = None,
        gpt2_dir: str | os.PathLike | None = None) -> Tokenizer:
  """The tokenizer named by `spec`. A trained BPE or WordPiece is `<directory>/<kind>-<size>.json`,
  trained on `train_texts()` the first time; `gpt2_dir` holds encoder.json + vocab.bpe for an
  offline GPT-2."""
  kind, size = parse_spec(spec)
  if kind == "byte":
    return ByteTokenizer()
  if kind == "gpt2":
    return gpt2.gpt2(gpt2_dir)
  path, name = Path(directory) / f"{kind}-{size}.json", f"{kind}:{size}"
  if path.is_file():
    return TRAINED[kind].load(path, name)
  if train_texts is None:
    raise ValueError(f"{spec}: no saved tokenizer at {path} and no train_texts to train one")
  tok = TRAINED[kind].train(train_texts(), size, name)
  write_atomic(path, tok.files()["tokenizer.json"])
  return tok

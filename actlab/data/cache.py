"""Token cache: each split tokenized once into a flat `.bin` (uint16 for vocabularies up to 65,536,
else uint32; every story's tokens, then `eot_id`) under `tokens/<corpus>/`, then memory-mapped.
The `.bin` is written under a temporary name and renamed, then its JSON sidecar (`_expected_meta`,
counts, SHA-256 of the `.bin`). A cache whose sidecar, size, checksum or fingerprints disagree is
rebuilt with a log line (docs/design.md §3.11); the checksum costs about 1-2 s per GiB per open.
"""

import hashlib
import json
import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

import numpy as np

from actlab.data.tokenizer import Tokenizer
from actlab.infra.errors import DataError

log = logging.getLogger(__name__)

FORMAT_VERSION = 2        # 2: the sidecar holds the .bin's sha256
CHUNK_CHARS = 8_000_000   # characters handed to one encode_batch call
build_count = 0           # (re)builds so far: tests prove with it that an open did not tokenize


def token_dtype(vocab_size: int) -> np.dtype:
  return np.dtype(np.uint16) if vocab_size <= 65536 else np.dtype(np.uint32)


def sidecar_path(path: Path) -> Path:
  return Path(path).with_suffix(".json")


def _expected_meta(tokenizer: Tokenizer, source_id: str) -> dict:
  return {
      "format": FORMAT_VERSION,
      "dtype": token_dtype(tokenizer.vocab_size).name,
      "tokenizer": tokenizer.name,
      "tokenizer_fingerprint": tokenizer.fingerprint,
      "vocab_size": int(tokenizer.vocab_size),
      "eot_id": int(tokenizer.eot_id),
      "source": source_id,
  }


def check(path: Path, tokenizer: Tokenizer, source_id: str) -> tuple[dict | None, str]:
  """(sidecar, "") if the cache at ``path`` is complete and current, else (None, why not)."""
  path = Path(path)
  side = sidecar_path(path)
  if not side.is_file():
    return None, "no cache" if not path.exists() else "sidecar missing (partial build?)"
  try:
    meta = json.loads(side.read_text())
  except (OSError, ValueError) as e:
    return None, f"unreadable sidecar ({e})"
  if not isinstance(meta, dict):
    return None, "malformed sidecar"
  for k, v in _expected_meta(tokenizer, source_id).items():
    if meta.get(k) != v:
      return None, f"stale: {k} is {meta.get(k)!r}, now {v!r}"
  if not path.is_file():
    return None, "token file missing"
  n = meta.get("num_tokens")
  if not isinstance(n, int) or n <= 0:
    return None, "malformed sidecar (num_tokens)"
  size = path.stat().st_size
  if size != n * np.dtype(meta["dtype"]).itemsize:
    return None, f"size mismatch: {size} bytes on disk, sidecar says {n} tokens"
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    while block := f.read(1 << 24):
      digest.update(block)
  if digest.hexdigest() != meta.get("sha256"):
    return None, "checksum mismatch (file changed since it was built)"
  return meta, ""


def _chunks(texts: Iterable[str], max_chars: int) -> Iterable[list[str]]:
  chunk, n = [], 0
  for t in texts:
    chunk.append(t)
    n += len(t)
    if n >= max_chars:
      yield chunk
      chunk, n = [], 0
  if chunk:
    yield chunk


def build(path: Path, texts: Iterable[str], tokenizer: Tokenizer, source_id: str, *,
          num_texts: int | None = None, desc: str = "", progress: bool = True) -> dict:
  """Tokenize ``texts`` into ``path`` (atomically) and write the sidecar; returns the sidecar."""
  global build_count
  from tqdm.auto import tqdm

  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  side = sidecar_path(path)
  side.unlink(missing_ok=True)  # whatever happens next, the old sidecar no longer vouches
  dtype = token_dtype(tokenizer.vocab_size)
  tag = f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
  tmp = path.with_name(f".{path.name}.tmp-{tag}")
  n_tokens = n_texts = 0
  digest = hashlib.sha256()
  bar = tqdm(total=num_texts, unit=" stories", desc=desc or f"tokenizing {path.name}",
             disable=not progress, file=sys.stderr, mininterval=1.0, dynamic_ncols=True)
  try:
    with open(tmp, "wb") as f:
      for chunk in _chunks(texts, CHUNK_CHARS):
        block = tokenizer.encode_docs(chunk, dtype).tobytes()
        f.write(block)
        digest.update(block)
        n_tokens += len(block) // dtype.itemsize
        n_texts += len(chunk)
        bar.update(len(chunk))
      f.flush()
      os.fsync(f.fileno())
    if n_texts == 0:
      raise DataError(f"no stories to tokenize for {path.name} ({source_id}): the split is empty.")
    os.replace(tmp, path)
  finally:
    bar.close()
    tmp.unlink(missing_ok=True)
  meta = dict(_expected_meta(tokenizer, source_id), num_tokens=int(n_tokens),
              num_texts=int(n_texts), sha256=digest.hexdigest())
  tmp_side = side.with_name(f".{side.name}.tmp-{tag}")
  tmp_side.write_text(json.dumps(meta, indent=1) + "\n")
  os.replace(tmp_side, side)
  build_count += 1
  return meta


def build_or_open(path: Path, texts: Callable[[], Iterable[str]], tokenizer: Tokenizer,
                  source_id: str, *, num_texts: int | None = None, desc: str = "",
                  progress: bool = True) -> np.memmap:
  """The cached tokens at ``path``, built from ``texts()`` if absent or not current (built from
  another tokenizer or `source_id`, which changes whenever the source texts do)."""
  meta, why = check(path, tokenizer, source_id)
  if meta is None:
    if why != "no cache":
      log.warning("token cache %s: %s; rebuilding", path, why)
    meta = build(path, texts(), tokenizer, source_id, num_texts=num_texts, desc=desc,
                 progress=progress)
  return np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r", shape=(meta["num_tokens"],))

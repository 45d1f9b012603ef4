"""Data (docs/data.md): `load(config)` opens the corpus, its tokenizer and each split's token
cache under the data dir (`data_dir`) and returns a `Dataset` of step-indexed batches
(`labelled=True`: a `classify.ClassifyDataset`). Fixable problems raise `DataError`.
"""

import dataclasses
import fcntl
import functools
import hashlib
import json
import logging
import os
import sys
import uuid
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np

from actlab.data import gpt2, tokenizer
from actlab.data.tokenizer import (ByteTokenizer, HFBPETokenizer, HFWordPieceTokenizer, Tokenizer,
                                   parse_spec)
from actlab.infra.errors import DataError

log = logging.getLogger(__name__)

_COUNT_CHUNK = 1 << 24  # tokens per np.bincount call, which copies its input as int64


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
  """Token streams plus the rules for cutting them into windows of ``seq_len + 1`` tokens."""

  tokenizer: Tokenizer
  train_tokens: np.ndarray = dataclasses.field(repr=False)  # 1-D, np.memmap from the cache
  val_tokens: np.ndarray = dataclasses.field(repr=False)
  seq_len: int
  batch_size: int
  seed: int
  num_val_batches: int
  num_test_batches: int = 0  # > 0: the validation split's second half is held out for them

  def __post_init__(self):
    val_parts = 2 if self.num_test_batches else 1  # the test windows take the second half
    for name, toks, parts in (("training", self.train_tokens, 1),
                              ("validation", self.val_tokens, val_parts)):
      if toks.ndim != 1 or toks.shape[0] < self.window * parts:
        each_half = " in each half (data.test_batches)" if parts > 1 else ""
        raise DataError(f"the {name} split has {toks.shape[0]:,} tokens, fewer than one window of "
                        f"seq_len + 1 = {self.window}{each_half}; use a shorter data.seq_len or a "
                        "larger corpus.")
    if self.seed < 0:
      raise ValueError(f"seed must be non-negative, got {self.seed}")

  @property
  def window(self) -> int:
    return self.seq_len + 1

  def train_batch(self, step: int) -> np.ndarray:
    """int32 [batch_size, seq_len + 1]: window starts drawn from default_rng([seed, step])."""
    rng = np.random.default_rng([self.seed, int(step)])
    high = self.train_tokens.shape[0] - self.window  # last valid start, inclusive
    starts = rng.integers(0, high + 1, size=self.batch_size, dtype=np.int64)
    return self._gather(self.train_tokens, starts)

  def val_starts(self, test: bool = False) -> np.ndarray:
    """Fixed window starts, evenly spaced (with test batches: validation's in the first half)."""
    tokens = self.val_tokens.shape[0]
    half = tokens // 2 if self.num_test_batches else tokens  # where the validation windows end
    lo, hi = (half, tokens) if test else (0, half)
    n = (self.num_test_batches if test else self.num_val_batches) * self.batch_size
    return np.linspace(lo, hi - self.window, n).round().astype(np.int64)

  def val_batches(self, test: bool = False) -> list[np.ndarray]:
    """The fixed int32 [batch_size, seq_len + 1] validation (`test`: test) batches."""
    starts = self.val_starts(test).reshape(-1, self.batch_size)
    return [self._gather(self.val_tokens, s) for s in starts]

  def unigram_log_probs(self, exclude: Sequence[int] = ()) -> np.ndarray:
    """log p(v) of the training tokens, add-one smoothed; the ids in `exclude` get −inf."""
    vocab = self.tokenizer.vocab_size
    counts = np.zeros(vocab, dtype=np.int64)
    for lo in range(0, self.train_tokens.shape[0], _COUNT_CHUNK):
      counts += np.bincount(self.train_tokens[lo:lo + _COUNT_CHUNK], minlength=vocab)
    counts = counts + 1.0
    counts[list(exclude)] = 0.0
    with np.errstate(divide="ignore"):
      return np.log(counts) - np.log(counts.sum())

  def unigram_loss(self) -> float:
    """Cross-entropy (nats/token) of the unigram model on `val_batches()`' targets."""
    targets = np.concatenate([b[:, 1:].ravel() for b in self.val_batches()])
    return float(-self.unigram_log_probs()[targets].mean())

  def _gather(self, tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
    idx = starts[:, None] + np.arange(self.window, dtype=np.int64)
    return np.asarray(tokens[idx], dtype=np.int32)


def data_dir(config_dir: str = "") -> Path:
  """config.data.dir, else $ACTLAB_DATA_DIR, else ~/.cache/actlab."""
  d = config_dir or os.environ.get("ACTLAB_DATA_DIR") or "~/.cache/actlab"
  return Path(d).expanduser()


# --- Tokenizers: by spec, and the copy saved with a run ---------------------------------------
# A run's copy (`<workdir>/tokenizer/`: its defining files and a manifest of their SHA-256) lets
# sampling and export need only the run directory; a changed file is refused.

MANIFEST = "actlab_tokenizer.json"  # in a saved tokenizer's directory: its name and checksums
TRAINED = {"bpe": HFBPETokenizer, "wordpiece": HFWordPieceTokenizer}  # saved as tokenizer.json


def write_atomic(path: Path, data: bytes) -> None:
  """Writes `data` to `path` whole or not at all (temp file, rename)."""
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_name(f"{path.name}.tmp{os.getpid()}")
  tmp.write_bytes(data)
  os.replace(tmp, path)


def save_tokenizer(tok: Tokenizer, directory: Path) -> None:
  """Writes `tok`'s defining files into `directory`, then `MANIFEST` (last: it marks it whole)."""
  files = tok.files()
  for name, data in files.items():
    write_atomic(Path(directory) / name, data)
  meta = {"name": tok.name, "fingerprint": tok.fingerprint, "vocab_size": tok.vocab_size,
          "sha256": {n: hashlib.sha256(d).hexdigest() for n, d in files.items()}}
  write_atomic(Path(directory) / MANIFEST, (json.dumps(meta, indent=2) + "\n").encode())


def saved_tokenizer(directory: Path) -> Tokenizer | None:
  """What `save_tokenizer` wrote into `directory`, else None; DataError if a file changed."""
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


def tokenizer_of(spec: str, *, directory: str | os.PathLike,
        train_texts: Callable[[], Iterable[str]] | None = None,
        gpt2_dir: str | os.PathLike | None = None) -> Tokenizer:
  """The tokenizer named by `spec`; a BPE or WordPiece is trained on `train_texts()` once."""
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


# --- The token cache ---------------------------------------------------------------------------
# Each split tokenized once into a flat `.bin` under `tokens/<corpus>/`, memory-mapped, and its
# JSON sidecar written after it; a cache that disagrees is rebuilt (docs/design.md §3.11).

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


def check_cache(path: Path, tokenizer: Tokenizer, source_id: str) -> tuple[dict | None, str]:
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
  n, size = meta.get("num_tokens"), path.stat().st_size
  if not isinstance(n, int) or n <= 0 or size != n * np.dtype(meta["dtype"]).itemsize:
    return None, f"size mismatch: {size} bytes on disk, sidecar says {n!r} tokens"
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


def build_cache(path: Path, texts: Iterable[str], tokenizer: Tokenizer, source_id: str, *,
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
  write_atomic(side, (json.dumps(meta, indent=1) + "\n").encode())
  build_count += 1
  return meta


def build_or_open(path: Path, texts: Callable[[], Iterable[str]], tokenizer: Tokenizer,
                  source_id: str, *, num_texts: int | None = None, desc: str = "",
                  progress: bool = True) -> np.memmap:
  """The cached tokens at ``path``, built from ``texts()`` unless current (`check_cache`)."""
  meta, why = check_cache(path, tokenizer, source_id)
  if meta is None:
    if why != "no cache":
      log.warning("token cache %s: %s; rebuilding", path, why)
    meta = build_cache(path, texts(), tokenizer, source_id, num_texts=num_texts, desc=desc,
                 progress=progress)
  return np.memmap(path, dtype=np.dtype(meta["dtype"]), mode="r", shape=(meta["num_tokens"],))


# --- The corpora: `texts(split)`, `num_texts(split)` and a `source_id(split)` keying the caches --


def corpus_key(config) -> str:
  """The corpus' directory name under tokens/ and tokenizers/."""
  if config.data.source == "tinystories":
    return f"tinystories-{config.data.tinystories_version}"
  return config.data.source


def open_corpus(config, root: Path):
  """The corpus of `config.data.source` (synthetic.py or tinystories.py), under `root`."""
  source = config.data.source
  if source == "synthetic":
    from actlab.data import synthetic
    return synthetic
  if source == "tinystories":
    from actlab.data import tinystories
    manual = config.data.manual_dir or str(root / "manual" / "tiny_stories")
    return tinystories.Corpus(
        version=config.data.tinystories_version,
        data_dir=root / "tfds", manual_dir=Path(manual).expanduser())
  raise ValueError(f"data.source={source!r}: choose 'tinystories' or 'synthetic'")


def _get_tokenizer(config, root: Path, train_texts=None) -> Tokenizer:
  gpt2_dir = config.data.gpt2_dir or os.environ.get("ACTLAB_GPT2_DIR", "")
  default = root / "gpt2"  # convenience: <data dir>/gpt2/{encoder.json,vocab.bpe}
  if not gpt2_dir and all((default / f).is_file() for f in gpt2.GPT2_FILES):
    gpt2_dir = str(default)
  return tokenizer_of(
      config.data.tokenizer, directory=root / "tokenizers" / corpus_key(config),
      train_texts=train_texts, gpt2_dir=gpt2_dir or None)


def load_tokenizer(config, saved: Path | None = None) -> Tokenizer:
  """The config's tokenizer without its corpus: the run directory `saved`'s, else the data dir's."""
  if saved and (tok := saved_tokenizer(saved)) is not None:
    return tok
  root = data_dir(config.data.dir)
  try:
    return _get_tokenizer(config, root)
  except ValueError:  # Not trained in this data dir.
    raise DataError(
        f"the {config.data.tokenizer} tokenizer is neither saved in {saved} nor trained in "
        f"{root}; set ACTLAB_DATA_DIR (or data.dir) to the data dir the run trained with") from None


def load(config, *, progress: bool | None = None, labelled: bool = False):
  """The Dataset, its token caches built on first use (`labelled`: a `ClassifyDataset`)."""
  root = data_dir(config.data.dir)
  progress = config.train.progress if progress is None else progress
  corpus = functools.cache(lambda: open_corpus(config, root))  # opened on first use
  key, spec = corpus_key(config), config.data.tokenizer
  get_tokenizer = lambda: _get_tokenizer(config, root, train_texts=lambda: corpus().texts("train"))
  # A tokenizer that needs no corpus first: a missing GPT-2 file is said before a download.
  tok = None if tokenizer.parse_spec(spec)[0] in ("bpe", "wordpiece") else get_tokenizer()
  # One process at a time prepares a corpus, trains a tokenizer or builds a cache (sweep cells
  # share the data dir); the others wait, then open it. The corpus is opened even then: its
  # source_id validates the caches (TinyStories' prepared data under <data dir>/tfds must stay).
  (root / "locks").mkdir(parents=True, exist_ok=True)
  with open(root / "locks" / f"{key}.lock", "a") as lock:
    fcntl.flock(lock, fcntl.LOCK_EX)
    tok = tok or get_tokenizer()
    if labelled:  # Labelled examples (the classify task), tokenized like the corpus.
      from actlab.data import classify
      return classify.load(config, tok, tokenizer.special_ids(spec), root)
    arrays, c = {}, corpus()
    for split in ("train", "validation"):
      path = root / "tokens" / key / f"{split}.{tok.name.replace(':', '')}.bin"  # e.g. bpe4096
      arrays[split] = build_or_open(
          path, lambda s=split: c.texts(s), tok, c.source_id(split),
          num_texts=c.num_texts(split), desc=f"tokenizing {key} {split} ({tok.name})",
          progress=progress)
  ds = Dataset(tokenizer=tok, train_tokens=arrays["train"], val_tokens=arrays["validation"],
               seq_len=int(config.data.seq_len), batch_size=int(config.train.batch_size),
               seed=int(config.train.seed), num_val_batches=int(config.data.val_batches),
               num_test_batches=int(config.data.test_batches))
  n_windows = ds.num_val_batches * ds.batch_size
  if n_windows * ds.window > ds.val_tokens.shape[0]:
    log.warning("validation split has %d tokens: its %d windows of %d tokens overlap",
                ds.val_tokens.shape[0], n_windows, ds.window)
  log.info("data: %s/%s, %s train / %s val tokens", key, tok.name,
           f"{ds.train_tokens.shape[0]:,}", f"{ds.val_tokens.shape[0]:,}")
  return ds

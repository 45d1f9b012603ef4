"""Data: corpora, tokenizers, the token cache and step-indexed batch sampling (docs/data.md).

`load(config)` opens the corpus (`data.source`), the tokenizer (tokenizer.py) and each split's
token cache (cache.py), and returns a `Dataset` (`labelled=True`: the classify task's
`classify.ClassifyDataset`). Everything lives under the data dir (`data_dir`). Problems a user
can fix raise `DataError` with one message saying what to do.
"""

import contextlib
import dataclasses
import fcntl
import functools
import logging
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from actlab.data import cache, gpt2, tokenizer, tokenizer_store
from actlab.data.tokenizer import Tokenizer
from actlab.infra.errors import DataError

log = logging.getLogger(__name__)

__all__ = ["DataError", "Dataset", "Tokenizer", "load", "load_tokenizer",
           "data_dir"]

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
    if step < 0:
      raise ValueError(f"step must be non-negative, got {step}")
    rng = np.random.default_rng([self.seed, int(step)])
    high = self.train_tokens.shape[0] - self.window  # last valid start, inclusive
    starts = rng.integers(0, high + 1, size=self.batch_size, dtype=np.int64)
    return self._gather(self.train_tokens, starts)

  def val_starts(self, test: bool = False) -> np.ndarray:
    """The fixed validation window starts, evenly spaced over the validation split (with test
    batches: over its first half, and the test windows' (`test`) over its second half)."""
    tokens = self.val_tokens.shape[0]
    half = tokens // 2 if self.num_test_batches else tokens  # where the validation windows end
    lo, hi = (half, tokens) if test else (0, half)
    n = (self.num_test_batches if test else self.num_val_batches) * self.batch_size
    return np.linspace(lo, hi - self.window, n).round().astype(np.int64)

  def val_batches(self, test: bool = False) -> list[np.ndarray]:
    """num_val_batches (`test`: num_test_batches) arrays of int32 [batch_size, seq_len + 1];
    identical at every call."""
    starts = self.val_starts(test).reshape(-1, self.batch_size)
    return [self._gather(self.val_tokens, s) for s in starts]

  def unigram_log_probs(self, exclude: Sequence[int] = ()) -> np.ndarray:
    """log p(v) of the training tokens' unigram distribution, add-one smoothed over the
    tokenizer's vocabulary less the ids in `exclude` (which get −inf):
    p(v) = (n_v + 1) / (N + V)."""
    vocab = self.tokenizer.vocab_size
    counts = np.zeros(vocab, dtype=np.int64)
    for lo in range(0, self.train_tokens.shape[0], _COUNT_CHUNK):
      counts += np.bincount(self.train_tokens[lo:lo + _COUNT_CHUNK], minlength=vocab)
    counts = counts + 1.0
    counts[list(exclude)] = 0.0
    with np.errstate(divide="ignore"):
      return np.log(counts) - np.log(counts.sum())

  def unigram_loss(self) -> float:
    """Cross-entropy (nats/token) under `unigram_log_probs()` of `val_loss`'s targets: positions
    1..seq_len of every `val_batches()` window."""
    targets = np.concatenate([b[:, 1:].ravel() for b in self.val_batches()])
    return float(-self.unigram_log_probs()[targets].mean())

  def _gather(self, tokens: np.ndarray, starts: np.ndarray) -> np.ndarray:
    idx = starts[:, None] + np.arange(self.window, dtype=np.int64)
    return np.asarray(tokens[idx], dtype=np.int32)


def data_dir(config_dir: str = "") -> Path:
  """config.data.dir, else $ACTLAB_DATA_DIR, else ~/.cache/actlab."""
  d = config_dir or os.environ.get("ACTLAB_DATA_DIR") or "~/.cache/actlab"
  return Path(d).expanduser()


# --- The corpora ---------------------------------------------------------------------------------
# Each gives its splits' `texts(split)`, `num_texts(split)` and a `source_id(split)` that changes
# with the texts and keys the token caches.


class Synthetic:
  """The embedded stories (synthetic.py), fingerprinted by what they are made from
  (`synthetic.fingerprint`): a run whose token cache is built generates none."""

  def texts(self, split: str) -> list[str]:
    from actlab.data import synthetic
    return synthetic.texts(split)

  def num_texts(self, split: str) -> int:
    from actlab.data import synthetic
    return synthetic.SIZES[split]

  def source_id(self, split: str) -> str:
    from actlab.data import synthetic
    return f"synthetic/{split}:made_from={synthetic.fingerprint()}"


def corpus_key(config) -> str:
  """The corpus' directory name under tokens/ and tokenizers/."""
  if config.data.source == "tinystories":
    return f"tinystories-{config.data.tinystories_version}"
  return config.data.source


def open_corpus(config, root: Path):
  """The corpus of `config.data.source` (synthetic, or TinyStories: tinystories.py), its files
  under the data dir `root`."""
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


def _get_tokenizer(config, root: Path, train_texts=None) -> Tokenizer:
  gpt2_dir = config.data.gpt2_dir or os.environ.get("ACTLAB_GPT2_DIR", "")
  default = root / "gpt2"  # convenience: <data dir>/gpt2/{encoder.json,vocab.bpe}
  if not gpt2_dir and all((default / f).is_file() for f in gpt2.GPT2_FILES):
    gpt2_dir = str(default)
  return tokenizer_store.get(
      config.data.tokenizer, directory=root / "tokenizers" / corpus_key(config),
      train_texts=train_texts, gpt2_dir=gpt2_dir or None)


def load_tokenizer(config, saved: Path | None = None) -> Tokenizer:
  """The config's tokenizer without its corpus: the copy in `saved` (a run directory's) if there
  is one, else the data dir's (a trained BPE or WordPiece must be there already)."""
  if saved and (tok := tokenizer_store.load(saved)) is not None:
    return tok
  root = data_dir(config.data.dir)
  try:
    return _get_tokenizer(config, root)
  except ValueError:  # Not trained in this data dir.
    raise DataError(
        f"the {config.data.tokenizer} tokenizer is neither saved in {saved} nor trained in "
        f"{root}; set ACTLAB_DATA_DIR (or data.dir) to the data dir the run trained with") from None


@contextlib.contextmanager
def _file_lock(path: Path):
  """An exclusive advisory lock (POSIX flock), released when the file closes."""
  path.parent.mkdir(parents=True, exist_ok=True)
  with open(path, "a") as f:
    fcntl.flock(f, fcntl.LOCK_EX)
    yield


def load(config, *, progress: bool | None = None, labelled: bool = False):
  """Build (first run) or open (later runs) the token caches and return the Dataset; with
  `labelled`, the `classify.ClassifyDataset` of `config.data.classify` instead."""
  root = data_dir(config.data.dir)
  progress = config.train.progress if progress is None else progress
  corpus = functools.cache(lambda: open_corpus(config, root))  # opened on first use
  key = corpus_key(config)
  spec = config.data.tokenizer
  get_tokenizer = lambda: _get_tokenizer(config, root, train_texts=lambda: corpus().texts("train"))
  # Tokenizers that need no corpus come first, so a missing GPT-2 file is reported before a
  # multi-GB download.
  tok = None if tokenizer.parse_spec(spec)[0] in ("bpe", "wordpiece") else get_tokenizer()
  # One process at a time prepares a corpus, trains a BPE or builds a cache (parallel sweep
  # cells share the data dir); the others wait, then open what the first one built. The corpus
  # is opened even when the caches exist: its fingerprint validates them (for TinyStories, the
  # prepared TFDS data under <data dir>/tfds must therefore stay).
  with _file_lock(root / "locks" / f"{key}.lock"):
    tok = tok or get_tokenizer()
    if labelled:  # Labelled examples (the classify task), tokenized like the corpus.
      from actlab.data import classify
      return classify.load(config, tok, tokenizer.special_ids(spec), root)
    arrays, c = {}, corpus()
    for split in ("train", "validation"):
      path = root / "tokens" / key / f"{split}.{tok.name.replace(':', '')}.bin"  # e.g. bpe4096
      arrays[split] = cache.build_or_open(
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

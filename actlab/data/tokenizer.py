"""Tokenizers behind one interface, by spec (docs/data.md): `byte`, `bpe:<size>`, `gpt2` (gpt2.py)
and the encoder's `wordpiece:<size>`. Texts are encoded ordinarily: a literal `<|endoftext|>` is
text; the token cache puts `eot_id` between stories.
"""

import abc
import hashlib
import itertools
import json
import os
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from actlab.infra.errors import DataError

EOT_TEXT = "<|endoftext|>"

# Threads of tiktoken's encode_batch (HF tokenizers has its own pool: RAYON_NUM_THREADS).
DEFAULT_THREADS = max(1, min(8, os.cpu_count() or 1))

# BPE training reads at most this many characters, the head of the (TFDS-shuffled) split: of
# TinyStories V2's ~2.2 GB, plenty for a vocabulary of a few thousand, and minutes of training.
BPE_TRAIN_MAX_CHARS = 300_000_000


class Tokenizer(abc.ABC):
  """What the data pipeline and the model need from a tokenizer."""

  name: str          # spec-like name, e.g. "byte", "bpe:8192", "gpt2"
  vocab_size: int    # unpadded (the model pads it)
  eot_id: int

  @property
  def fingerprint(self) -> str:
    """Changes whenever the id assignment changes (the token cache is keyed on it)."""
    return self.name

  @abc.abstractmethod
  def encode(self, text: str) -> list[int]:
    """Ordinary encoding: special-token text is encoded as plain text."""

  @abc.abstractmethod
  def decode(self, ids: Iterable[int]) -> str:
    """Inverse of encode; ``eot_id`` decodes to ``<|endoftext|>``."""

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [self.encode(t) for t in texts]

  def files(self) -> dict[str, bytes]:
    """The files that define this tokenizer exactly (`save`); none when its name does."""
    return {}

  def encode_docs(self, texts: Sequence[str], dtype=np.uint32) -> np.ndarray:
    """Every text's ordinary encoding followed by ``eot_id``, as one flat array."""
    ids = self.encode_batch(texts)
    lens = [len(x) for x in ids]
    flat = np.fromiter(itertools.chain.from_iterable(ids), dtype=dtype, count=sum(lens))
    return self._append_eots(flat, lens)

  def _append_eots(self, flat: np.ndarray, lens: Sequence[int]) -> np.ndarray:
    """`flat`, the texts' ids, with `eot_id` after each text's `lens` ids."""
    return np.insert(flat, np.cumsum(lens, dtype=np.int64), np.asarray(self.eot_id, flat.dtype))

  def __repr__(self) -> str:
    return f"{type(self).__name__}(name={self.name!r}, vocab_size={self.vocab_size})"


class ByteTokenizer(Tokenizer):
  name = "byte"
  vocab_size = 257
  eot_id = 256

  def encode(self, text: str) -> list[int]:
    return list(text.encode("utf-8"))

  def encode_docs(self, texts: Sequence[str], dtype=np.uint16) -> np.ndarray:
    bs = [t.encode("utf-8") for t in texts]
    flat = np.frombuffer(b"".join(bs), dtype=np.uint8).astype(dtype)
    return self._append_eots(flat, [len(b) for b in bs])

  def decode(self, ids: Iterable[int]) -> str:
    ids = [int(i) for i in ids]
    if bad := [i for i in ids if not 0 <= i <= self.eot_id]:
      raise ValueError(f"byte tokenizer: id {bad[0]} out of range [0, 256]")
    runs = itertools.groupby(ids, key=lambda i: i == self.eot_id)  # bytes between eot ids
    return "".join(EOT_TEXT * len(list(run)) if eot else bytes(run).decode("utf-8", "replace")
                   for eot, run in runs)


class HFBPETokenizer(Tokenizer):
  """Byte-level BPE from Hugging Face ``tokenizers``."""

  def __init__(self, tok, name: str, path: Path | None = None):
    self._tok = tok
    # A literal "<|endoftext|>" (WordPiece: "[SEP]") in a text is text, like encode_ordinary.
    tok.encode_special_tokens = True
    self.name = name
    self.path = path
    self.vocab_size = tok.get_vocab_size(with_added_tokens=True)
    self.eot_id = self._eot_id(tok)
    self._fp = hashlib.sha256(tok.to_str().encode("utf-8")).hexdigest()[:16]

  def _eot_id(self, tok) -> int:
    eot = tok.token_to_id(EOT_TEXT)
    if eot is None:
      raise DataError(f"BPE tokenizer {self.path or self.name} has no {EOT_TEXT} token; delete it "
                      "to retrain.")
    return int(eot)

  @property
  def fingerprint(self) -> str:
    return f"{self.name}-{self._fp}"

  def encode(self, text: str) -> list[int]:
    return self._tok.encode(text, add_special_tokens=False).ids

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return [e.ids for e in self._tok.encode_batch_fast(list(texts), add_special_tokens=False)]

  def decode(self, ids: Iterable[int]) -> str:
    return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int, name: str) -> "HFBPETokenizer":
    """Trained on at most BPE_TRAIN_MAX_CHARS characters of `texts`."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, trainers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(_cap_chars(texts, BPE_TRAIN_MAX_CHARS), trainer=trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=[EOT_TEXT],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    return cls(tok, name)

  def files(self) -> dict[str, bytes]:
    return {"tokenizer.json": self._tok.to_str().encode("utf-8")}

  @classmethod
  def load(cls, path: Path, name: str) -> "HFBPETokenizer":
    from tokenizers import Tokenizer as HFTokenizer

    try:
      tok = HFTokenizer.from_file(str(path))
    except Exception as e:  # corrupt / truncated JSON
      raise DataError(f"cannot read BPE tokenizer {path} ({e}); delete it and rerun to "
                      "retrain.") from e
    return cls(tok, name, path)


WORDPIECE_SPECIALS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")  # ids 0-4, in this order


def special_ids(spec: str) -> dict[str, int]:
  """The special-token ids of a ``wordpiece:<size>`` spec, known without loading the tokenizer."""
  if parse_spec(spec)[0] != "wordpiece":
    raise ValueError(f"tokenizer {spec!r} has no [CLS]/[SEP]/[MASK]/[PAD]; use 'wordpiece:<size>'")
  return {t.strip("[]").lower(): i for i, t in enumerate(WORDPIECE_SPECIALS)}


class HFWordPieceTokenizer(HFBPETokenizer):
  """BERT-style uncased WordPiece from Hugging Face ``tokenizers``; see ``special_ids``."""

  def _eot_id(self, tok) -> int:
    ids = [tok.token_to_id(t) for t in WORDPIECE_SPECIALS]
    if ids != list(range(len(WORDPIECE_SPECIALS))):
      raise DataError(f"WordPiece tokenizer {self.path or self.name} does not have "
                      f"{' '.join(WORDPIECE_SPECIALS)} at ids 0-4 (it has {ids}); delete it to "
                      "retrain.")
    self.pad_id, self.unk_id, self.cls_id, self.sep_id, self.mask_id = ids
    return self.sep_id

  @classmethod
  def train(cls, texts: Iterable[str], vocab_size: int, name: str) -> "HFWordPieceTokenizer":
    """Trained on at most BPE_TRAIN_MAX_CHARS characters of `texts`, alike in every process: the
    trainer's `##c` tokens, in hash-map order, broke ties; given up front, sorted, they do not."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

    texts = list(_cap_chars(texts, BPE_TRAIN_MAX_CHARS))
    tok = HFTokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    words = (w for t in texts
             for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(t)))
    continuations = sorted({"##" + c for w in words for c in w[1:]})
    tok.train_from_iterator(texts, trainer=trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=[*WORDPIECE_SPECIALS, *continuations],
        show_progress=False))
    spec = json.loads(tok.to_str())
    spec["added_tokens"] = [t for t in spec["added_tokens"] if t["content"] in WORDPIECE_SPECIALS]
    return cls(HFTokenizer.from_str(json.dumps(spec)), name)


def _cap_chars(texts: Iterable[str], max_chars: int) -> Iterable[str]:
  n = 0
  for t in texts:
    yield t
    n += len(t)
    if n >= max_chars:
      return


def nominal_vocab_size(config) -> int:
  """The unpadded vocabulary `config` names without files (a trained one may have fewer ids)."""
  kind, size = parse_spec(config.data.tokenizer)
  return (config.model.vocab_size or size
          or {"byte": ByteTokenizer.vocab_size, "gpt2": 50257}[kind])


def parse_spec(spec: str) -> tuple[str, int | None]:
  """``"bpe:8192"`` -> ("bpe", 8192), ``"gpt2"`` -> ("gpt2", None); ValueError if unknown."""
  if spec in ("byte", "gpt2"):
    return spec, None
  if m := re.match(r"^(bpe|wordpiece):(\d+)$", spec or ""):
    kind, size = m.group(1), int(m.group(2))
    if kind == "bpe" and size < 257:
      raise ValueError(f"tokenizer {spec!r}: BPE size must be at least 257 (256 bytes + "
                       "<|endoftext|>)")
    if kind == "wordpiece" and size <= len(WORDPIECE_SPECIALS):
      raise ValueError(f"tokenizer {spec!r}: WordPiece size must exceed the 5 special tokens")
    return kind, size
  raise ValueError(f"unknown tokenizer {spec!r}; choose 'byte', 'gpt2', 'bpe:<size>' (e.g. "
                   "'bpe:4096') or 'wordpiece:<size>'")

"""OpenAI's GPT-2 encoding through `tiktoken` (spec `"gpt2"`: 50,257 ids, `<|endoftext|>` = 50256):
offline from the release files `encoder.json` + `vocab.bpe` (checked against tiktoken's pinned
sha256), else fetched by tiktoken; failing both, a `DataError` says where to put the files."""

import base64
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np

from actlab.data.tokenizer import DEFAULT_THREADS, EOT_TEXT, Tokenizer
from actlab.infra.errors import DataError, short_cause

GPT2_FILES = ("encoder.json", "vocab.bpe")
_GPT2_FILES_HELP = ("OpenAI's GPT-2 files encoder.json and vocab.bpe "
                   "(https://openaipublic.blob.core.windows.net/gpt-2/encodings/main/<file>)")
# A saved copy (actlab.data.save_tokenizer): tiktoken's "<base64 token> <rank>" lines.
RANKS_FILE = "gpt2.tiktoken"
# sha256 pinned by tiktoken for OpenAI's GPT-2 release files.
GPT2_HASHES = {
  "encoder.json": "196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783",
  "vocab.bpe": "1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5",
}
# tiktoken's (faster, equivalent) form of the GPT-2 pre-tokenisation pattern (r50k_pat_str).
GPT2_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""


class TiktokenTokenizer(Tokenizer):
  def __init__(self, enc, name: str, threads: int = DEFAULT_THREADS):
    self._enc = enc
    self.name = name
    self.vocab_size = int(enc.n_vocab)
    self.eot_id = int(enc.eot_token)
    self.threads = threads

  def encode(self, text: str) -> list[int]:
    return self._enc.encode_ordinary(text)

  def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
    return self._enc.encode_ordinary_batch(list(texts), num_threads=self.threads)

  def encode_docs(self, texts: Sequence[str], dtype=np.uint32) -> np.ndarray:
    if any(EOT_TEXT in t for t in texts):
      return super().encode_docs(texts, dtype)
    # Text segments between allowed special tokens are encoded independently, so this equals
    # encoding one by one and appending eot_id, with a few large texts (4 per thread).
    k = max(1, -(-len(texts) // (self.threads * 4)))  # stories per text
    parts = ["".join(t + EOT_TEXT for t in texts[i:i + k]) for i in range(0, len(texts), k)]
    ids = self._enc.encode_batch(parts, num_threads=self.threads, allowed_special={EOT_TEXT},
                                 disallowed_special=())
    return np.concatenate([np.asarray(x, dtype=dtype) for x in ids])

  def decode(self, ids: Iterable[int]) -> str:
    return self._enc.decode([int(i) for i in ids])

  def mergeable_ranks(self) -> dict[bytes, int]:
    """The byte-level BPE: token bytes -> id (the merges' order), special tokens aside."""
    return self._enc._mergeable_ranks

  def files(self) -> dict[str, bytes]:
    ranks = sorted(self.mergeable_ranks().items(), key=lambda kv: kv[1])
    return {RANKS_FILE: b"".join(base64.b64encode(t) + b" %d\n" % r for t, r in ranks)}


def gpt2_saved(directory: str | os.PathLike) -> TiktokenTokenizer:
  """The GPT-2 encoding from the copy `TiktokenTokenizer.files` wrote (`data.save_tokenizer`)."""
  lines = (Path(directory) / RANKS_FILE).read_bytes().splitlines()
  return _from_ranks({base64.b64decode(t): int(r) for t, r in (x.split() for x in lines)})


def _from_ranks(ranks: dict[bytes, int], threads: int = DEFAULT_THREADS) -> TiktokenTokenizer:
  import tiktoken

  enc = tiktoken.Encoding(name="gpt2", pat_str=GPT2_PAT, mergeable_ranks=ranks,
                          special_tokens={EOT_TEXT: 50256}, explicit_n_vocab=50257)
  return TiktokenTokenizer(enc, "gpt2", threads)


def gpt2(gpt2_dir: str | os.PathLike | None = None,
         threads: int = DEFAULT_THREADS) -> TiktokenTokenizer:
  """GPT-2: offline from ``gpt2_dir``'s encoder.json and vocab.bpe when given, else tiktoken's."""
  import tiktoken
  from tiktoken.load import data_gym_to_mergeable_bpe_ranks

  if gpt2_dir:
    d = Path(gpt2_dir).expanduser()
    if missing := [f for f in GPT2_FILES if not (d / f).is_file()]:
      raise DataError(f"GPT-2 tokenizer directory {d} lacks {' and '.join(missing)}. It must hold "
                      f"{_GPT2_FILES_HELP}.")
    try:
      ranks = data_gym_to_mergeable_bpe_ranks(
          vocab_bpe_file=str(d / "vocab.bpe"), encoder_json_file=str(d / "encoder.json"),
          vocab_bpe_hash=GPT2_HASHES["vocab.bpe"], encoder_json_hash=GPT2_HASHES["encoder.json"])
    except Exception as e:
      raise DataError(f"GPT-2 files in {d} are not OpenAI's encoder.json / vocab.bpe "
                      f"({short_cause(e)}). Replace them with the originals.") from e
    return _from_ranks(ranks, threads)

  try:
    enc = tiktoken.get_encoding("gpt2")
  except Exception as e:  # no network, proxy, blocked host ...
    raise DataError(
        f"The GPT-2 tokenizer is not available: tiktoken could not fetch it ({short_cause(e)}).\n"
        f"Fix: put {_GPT2_FILES_HELP} in a directory and point config.data.gpt2_dir or the "
        "environment variable ACTLAB_GPT2_DIR at it (or put them in <data dir>/gpt2); or use a "
        "':smoke' config (synthetic data, byte tokenizer), which needs no downloads.") from e
  return TiktokenTokenizer(enc, "gpt2", threads)

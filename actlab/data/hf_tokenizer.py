"""actlab's tokenizers as Hugging Face tokenizers giving the same ids (`hf_tokenizer`, and `write`
for `AutoTokenizer`). A literal special token in a text (`<|endoftext|>`, `[SEP]`) is the special
id for Hugging Face and plain text for actlab; every other text encodes alike.
"""

import pathlib

from actlab.data.tokenizer import EOT_TEXT, WORDPIECE_SPECIALS


def bytes_to_unicode() -> dict[int, str]:
  """GPT-2's printable stand-in character of each byte (the symbols of a byte-level BPE)."""
  printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
               *range(ord("®"), ord("ÿ") + 1)]
  others = [b for b in range(256) if b not in printable]
  return {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def merges_of(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
  """The merges of a byte-level BPE given as tiktoken ranks, in rank order: each token of rank
  r is the merge of the two parts that BPE with the ranks below r leaves of it."""
  merges = []
  for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
    parts = [bytes([b]) for b in token]
    while len(parts) > 2:
      pairs = [(ranks.get(a + b, rank), i) for i, (a, b) in enumerate(zip(parts, parts[1:]))]
      best, i = min(pairs)
      if best >= rank:
        break
      parts[i:i + 2] = [parts[i] + parts[i + 1]]
    if len(parts) == 2:
      merges.append(tuple(parts))
  return merges


def hf_tokenizer(tok):
  """`tok` as a Hugging Face `tokenizers.Tokenizer` giving the same ids: a byte-level BPE for
  `byte` and `gpt2`, the saved JSON for `bpe:N` and `wordpiece:N` (adding `[CLS] … [SEP]`)."""
  from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

  if "tokenizer.json" in tok.files():
    hf_tok = Tokenizer.from_str(tok.files()["tokenizer.json"].decode("utf-8"))
    if tok.name.startswith("wordpiece"):
      hf_tok.post_processor = processors.BertProcessing(("[SEP]", tok.sep_id),
                                                        ("[CLS]", tok.cls_id))
    return hf_tok
  ranks = tok.mergeable_ranks() if tok.name == "gpt2" else {bytes([b]): b for b in range(256)}
  symbol = bytes_to_unicode()
  word = lambda t: "".join(symbol[b] for b in t)
  hf_tok = Tokenizer(models.BPE({word(t): i for t, i in ranks.items()},
                                [(word(a), word(b)) for a, b in merges_of(ranks)]))
  hf_tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  hf_tok.decoder = decoders.ByteLevel()
  hf_tok.add_special_tokens([EOT_TEXT])  # id len(ranks): 256, or GPT-2's 50256
  return hf_tok


def write(tok, directory: pathlib.Path, max_len: int) -> None:
  """The tokenizer's files for `AutoTokenizer.from_pretrained(directory)`."""
  from transformers import PreTrainedTokenizerFast

  if tok.name.startswith("wordpiece"):
    specials = dict(zip(("pad_token", "unk_token", "cls_token", "sep_token", "mask_token"),
                        WORDPIECE_SPECIALS))
  else:
    specials = {"bos_token": EOT_TEXT, "eos_token": EOT_TEXT, "unk_token": EOT_TEXT}
  PreTrainedTokenizerFast(tokenizer_object=hf_tokenizer(tok), model_max_length=max_len,
                          **specials).save_pretrained(directory)

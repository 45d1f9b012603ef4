"""actlab.data.tokenizer and actlab.data.gpt2: byte, trained BPE and GPT-2 (offline from the
release files)."""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from actlab import data
from actlab import data
from actlab.data import gpt2, tokenizer
from conftest import data_config

SHARED = (Path(__file__).parents[1] / ".." / "shared" / "data").resolve()
GPT2_DIR = SHARED / "gpt2"
needs_gpt2 = pytest.mark.skipif(
    not (GPT2_DIR / "encoder.json").is_file(),
    reason=f"GPT-2 reference files not found at {GPT2_DIR}")

LILY = "Once upon a time, there was a little girl named Lily."
LILY_IDS = [7454, 2402, 257, 640, 11, 612, 373, 257, 1310, 2576, 3706, 20037, 13]
HARD = "Tom said, â€œHi!â€\x9d\n\n  Über-cool 🐱 naïve\tcafé — 123,456.78 <|endoftext|> end\n"


make_config = data_config


def test_parse_spec():
  assert tokenizer.parse_spec("byte") == ("byte", None)
  assert tokenizer.parse_spec("gpt2") == ("gpt2", None)
  assert tokenizer.parse_spec("bpe:4096") == ("bpe", 4096)
  for bad in ("bpe", "bpe:", "bpe:100", "bpe:x", "gpt-2", "", "BYTE"):
    with pytest.raises(ValueError, match="byte"):
      tokenizer.parse_spec(bad)


def test_byte_tokenizer():
  tok = data.tokenizer_of("byte", directory="unused")
  assert (tok.name, tok.vocab_size, tok.eot_id) == ("byte", 257, 256)
  assert tok.encode("Hé") == [72, 0xC3, 0xA9]
  assert tok.decode(tok.encode(HARD)) == HARD
  assert 256 not in tok.encode(HARD)  # the literal "<|endoftext|>" stays text
  assert tok.decode([72, 105, 256, 72]) == "Hi<|endoftext|>H"
  assert tok.encode_batch(["a", "b"]) == [[97], [98]]
  with pytest.raises(ValueError):
    tok.decode([300])


def test_bpe_trains_saves_reloads(tmp_path):
  stories = [f"Story {i}: Lily and Tom played in the park. They were happy. â€œYes!â€\x9d"
             for i in range(300)]
  calls = []

  def train_texts():
    calls.append(1)
    return iter(stories)

  tok = data.tokenizer_of("bpe:300", directory=tmp_path, train_texts=train_texts)
  assert calls == [1] and (tmp_path / "bpe-300.json").is_file()
  assert tok.name == "bpe:300" and tok.vocab_size == 300 and tok.eot_id == 0
  for s in (stories[3], HARD):
    assert tok.decode(tok.encode(s)) == s
  assert len(tok.encode(stories[0])) < len(stories[0]) / 2
  assert tok.eot_id not in tok.encode(HARD)  # ordinary encoding of the literal marker
  assert tok.decode([tok.eot_id]) == "<|endoftext|>"
  assert tok.encode_batch(stories[:3]) == [tok.encode(s) for s in stories[:3]]
  again = data.tokenizer_of("bpe:300", directory=tmp_path, train_texts=train_texts)
  assert calls == [1] and again.fingerprint == tok.fingerprint
  assert again.encode(HARD) == tok.encode(HARD)
  (tmp_path / "bpe-300.json").write_text('{"version": "1.0", "trunc')
  with pytest.raises(data.DataError, match="delete it"):
    data.tokenizer_of("bpe:300", directory=tmp_path)


@needs_gpt2
def test_gpt2_offline_ids():
  tok = data.tokenizer_of("gpt2", directory="unused", gpt2_dir=GPT2_DIR)
  assert (tok.name, tok.vocab_size, tok.eot_id) == ("gpt2", 50257, 50256)
  assert tok.encode(LILY) == LILY_IDS
  assert tok.decode(LILY_IDS) == LILY
  assert tok.decode([50256]) == "<|endoftext|>"
  assert 50256 not in tok.encode(HARD)
  assert tok.decode(tok.encode(HARD)) == HARD
  assert tok.encode_batch([LILY, HARD, ""]) == [LILY_IDS, tok.encode(HARD), []]
  sample = (SHARED / "tinystories" / "valid.txt").read_text(encoding="utf-8")[:50_000]
  assert tok.decode(tok.encode(sample)) == sample


@needs_gpt2
def test_gpt2_dir_with_wrong_files_is_a_data_error(tmp_path):
  shutil.copy(GPT2_DIR / "vocab.bpe", tmp_path / "vocab.bpe")
  with pytest.raises(data.DataError, match="encoder.json"):
    gpt2.gpt2(tmp_path)
  (tmp_path / "encoder.json").write_text('{"!": 0}')
  with pytest.raises(data.DataError, match="originals"):
    gpt2.gpt2(tmp_path)


def test_gpt2_offline_without_files_says_what_to_do(monkeypatch, tmp_path):
  import tiktoken

  def no_network(name):
    raise ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'")

  monkeypatch.setattr(tiktoken, "get_encoding", no_network)
  with pytest.raises(data.DataError) as e:
    data.tokenizer_of("gpt2", directory=tmp_path, gpt2_dir=None)
  msg = str(e.value)
  for needed in ("encoder.json", "vocab.bpe", "gpt2_dir", "ACTLAB_GPT2_DIR", ":smoke"):
    assert needed in msg, needed


@needs_gpt2
def test_load_with_gpt2_from_config_dir(tmp_path, monkeypatch):
  import tiktoken
  monkeypatch.setattr(tiktoken, "get_encoding", lambda name: pytest.fail("went online"))
  ds = data.load(make_config(tmp_path, tokenizer="gpt2", gpt2_dir=str(GPT2_DIR)))
  assert ds.tokenizer.vocab_size == 50257 and ds.train_tokens.dtype.name == "uint16"
  assert ds.train_tokens.max() == 50256  # eot
  assert (tmp_path / "tokens" / "synthetic" / "train.gpt2.bin").is_file()
  # also found through the environment variable
  monkeypatch.setenv("ACTLAB_GPT2_DIR", str(GPT2_DIR))
  ds2 = data.load(make_config(tmp_path, tokenizer="gpt2"))
  assert ds2.tokenizer.encode(LILY) == LILY_IDS


def _one_by_one(tok, texts):
  out = []
  for t in texts:
    out += tok.encode(t) + [tok.eot_id]
  return out


DOCS = ["Once upon a time.", "", " leading space", "trailing space ", "\n\nnew\nlines\n\n",
        "a", "  ", "é€🐱 â€œquoteâ€\x9d", "Lily's 3 cats' toys -- 'yes'!"] * 7


@pytest.mark.parametrize("literal_eot", [False, True])
def test_encode_docs_equals_one_by_one(tmp_path, literal_eot):
  """The cache's fast path (texts joined at <|endoftext|>) must equal encoding one by one."""
  docs = DOCS + (["a literal <|endoftext|> inside"] if literal_eot else [])
  toks = [tokenizer.ByteTokenizer(),
          data.tokenizer_of("bpe:320", directory=tmp_path, train_texts=lambda: DOCS * 20)]
  if (GPT2_DIR / "encoder.json").is_file():
    toks.append(gpt2.gpt2(GPT2_DIR, threads=2))
  for tok in toks:
    got = tok.encode_docs(docs, dtype="uint32")
    assert got.dtype == "uint32"
    assert got.tolist() == _one_by_one(tok, docs), tok.name
    assert int((got == tok.eot_id).sum()) == len(docs)


@needs_gpt2
def test_encode_docs_real_text():
  tok = gpt2.gpt2(GPT2_DIR, threads=2)
  text = (SHARED / "tinystories" / "valid.txt").read_text(encoding="utf-8")
  docs = [s.strip() for s in text.split("<|endoftext|>") if s.strip()][:300]
  assert tok.encode_docs(docs, dtype="uint16").tolist() == _one_by_one(tok, docs)


def test_load_gpt2_offline_without_dir_is_a_user_error(tmp_path, monkeypatch):
  import tiktoken

  from actlab.infra import errors

  def no_network(name):
    raise ConnectionError("Failed to resolve 'openaipublic.blob.core.windows.net'")

  monkeypatch.setattr(tiktoken, "get_encoding", no_network)
  monkeypatch.delenv("ACTLAB_GPT2_DIR", raising=False)
  with pytest.raises(errors.UserError, match=":smoke") as e:
    data.load(make_config(tmp_path, tokenizer="gpt2"))
  assert isinstance(e.value, data.DataError) and "encoder.json" in str(e.value)


@pytest.mark.slow
def test_wordpiece_trains_the_same_vocabulary_in_every_process():
  """Hugging Face's trainer alone numbers `##` tokens in hash-map order, so two processes trained
  different vocabularies on the same texts (on this corpus, in every one of six tries); actlab's
  is the same in two processes, each with its own hash seed, and `##` tokens stay ordinary
  entries: literal text is not special."""
  script = ("import hashlib; from actlab.data import synthetic, tokenizer; "
            "t = tokenizer.HFWordPieceTokenizer.train(synthetic.texts('train')[:2000], 600, 'wp'); "
            "print(hashlib.sha256(t._tok.to_str().encode()).hexdigest(), t.vocab_size, "
            "t.encode('a ##b'), sorted(x.content for x in t._tok.get_added_tokens_decoder().values()))")
  processes = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
               for _ in range(2)]
  outs = {p.communicate()[0] for p in processes}
  assert all(p.returncode == 0 for p in processes)
  assert len(outs) == 1, outs
  digest, size, *rest = outs.pop().split(" ", 2)
  assert int(size) == 600 and "'[MASK]', '[PAD]', '[SEP]', '[UNK]'" in rest[0]
  assert "##" not in rest[0].split("[", 2)[-1]  # no `##` token among the added (special) ones

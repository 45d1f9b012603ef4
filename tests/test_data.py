"""actlab.data: load(), the token cache and step-indexed batch sampling (synthetic source)."""

import json
import logging
import os
import time
import types

import numpy as np
import pytest

from actlab import data
from actlab import data as cache
from actlab.data import synthetic, tokenizer
from conftest import data_config


make_config = data_config


@pytest.fixture(scope="module")
def byte_dir(tmp_path_factory):
  return tmp_path_factory.mktemp("data_byte")


@pytest.fixture(scope="module")
def byte_ds(byte_dir):
  return data.load(make_config(byte_dir))


def test_synthetic_byte_tokens_are_the_stories_with_eot(byte_ds):
  ds = byte_ds
  assert ds.tokenizer.name == "byte" and ds.tokenizer.vocab_size == 257
  assert isinstance(ds.train_tokens, np.memmap) and ds.train_tokens.dtype == np.uint16
  for split, toks in (("train", ds.train_tokens), ("validation", ds.val_tokens)):
    stories = synthetic.texts(split)
    expected = sum(len(s.encode()) + 1 for s in stories)
    assert toks.shape == (expected,)
    assert int((toks == 256).sum()) == len(stories)  # one eot after each story
    n0 = len(stories[0].encode())
    assert ds.tokenizer.decode(toks[:n0]) == stories[0]
    assert toks[n0] == 256 and toks[-1] == 256
    assert ds.tokenizer.decode(toks[n0 + 1:n0 + 1 + len(stories[1].encode())]) == stories[1]


def test_second_load_opens_cache_without_retokenizing(byte_dir, byte_ds, monkeypatch):
  """... nor generating the embedded stories: their cache is checked against what they are made
  from (`synthetic.fingerprint`)."""
  bins = sorted((byte_dir / "tokens" / "synthetic").glob("*.bin"))
  assert [p.name for p in bins] == ["train.byte.bin", "validation.byte.bin"]
  mtimes = [p.stat().st_mtime_ns for p in bins]
  builds = cache.build_count
  monkeypatch.setattr(synthetic, "_split", lambda split: pytest.fail("generated the stories"))
  ds2 = data.load(make_config(byte_dir))
  monkeypatch.undo()
  assert cache.build_count == builds
  assert [p.stat().st_mtime_ns for p in bins] == mtimes
  np.testing.assert_array_equal(ds2.train_tokens, byte_ds.train_tokens)
  meta = json.loads(bins[0].with_suffix(".json").read_text())
  assert meta["tokenizer"] == "byte" and meta["dtype"] == "uint16"
  assert meta["num_tokens"] == byte_ds.train_tokens.shape[0]
  assert meta["num_texts"] == synthetic.SIZES["train"] == len(synthetic.texts("train"))


def test_batches_shape_dtype_and_contents(byte_ds):
  ds = byte_ds
  b = ds.train_batch(0)
  assert b.shape == (8, 33) and b.dtype == np.int32 and type(b) is np.ndarray
  toks = np.asarray(ds.train_tokens)
  # every row is a contiguous window of the training tokens, at the documented starts
  starts = np.random.default_rng([1337, 0]).integers(0, toks.size - 33 + 1, size=8)
  for row, s in zip(b, starts):
    np.testing.assert_array_equal(row, toks[s:s + 33])
  vb = ds.val_batches()
  assert len(vb) == 3 and all(v.shape == (8, 33) and v.dtype == np.int32 for v in vb)


def test_train_batch_is_a_pure_function_of_seed_and_step(byte_dir, byte_ds):
  other = data.load(make_config(byte_dir))
  for k in (0, 1, 7, 123456):
    np.testing.assert_array_equal(byte_ds.train_batch(k), other.train_batch(k))
  # independent of what was drawn before (resume-stable): draw k fresh vs after others
  fresh = data.load(make_config(byte_dir)).train_batch(42)
  for k in range(10):
    other.train_batch(k)
  np.testing.assert_array_equal(other.train_batch(42), fresh)
  assert not np.array_equal(byte_ds.train_batch(1), byte_ds.train_batch(2))
  ds_seed2 = data.Dataset(**{**byte_ds.__dict__, "seed": 2})
  assert not np.array_equal(ds_seed2.train_batch(1), byte_ds.train_batch(1))


def test_val_windows_fixed_across_calls_and_seeds(byte_ds):
  ds = byte_ds
  a, b = ds.val_batches(), ds.val_batches()
  ds_other_seed = data.Dataset(**{**ds.__dict__, "seed": 99})
  c = ds_other_seed.val_batches()
  for x, y, z in zip(a, b, c):
    np.testing.assert_array_equal(x, y)
    np.testing.assert_array_equal(x, z)
  starts = ds.val_starts()
  assert starts[0] == 0 and starts[-1] == ds.val_tokens.shape[0] - 33
  gaps = np.diff(starts)
  assert gaps.min() >= 1 and gaps.max() - gaps.min() <= 1  # evenly spaced
  np.testing.assert_array_equal(a[1][0], np.asarray(ds.val_tokens[starts[8]:starts[8] + 33]))


def test_too_short_corpus_is_a_data_error(byte_ds):
  with pytest.raises(data.DataError, match="seq_len"):
    data.Dataset(**{**byte_ds.__dict__, "val_tokens": byte_ds.val_tokens[:20]})


def test_unigram_loss_is_the_closed_form(byte_ds, monkeypatch):
  train = np.array([0, 0, 0, 1, 1, 2, 0, 1], dtype=np.uint16)  # counts 4, 3, 1, 0, 0 of V = 5
  val = np.array([3, 0, 1, 2, 4, 0], dtype=np.uint16)
  ds = data.Dataset(tokenizer=types.SimpleNamespace(vocab_size=5), train_tokens=train,
                    val_tokens=val, seq_len=2, batch_size=2, seed=0, num_val_batches=1)
  np.testing.assert_array_equal(np.concatenate(ds.val_batches()), [[3, 0, 1], [2, 4, 0]])
  # Targets 0, 1, 4, 0 (not the windows' first tokens 3 and 2); p(v) = (n_v + 1) / (8 + 5).
  expected = -(2 * np.log(5 / 13) + np.log(4 / 13) + np.log(1 / 13)) / 4
  assert ds.unigram_loss() == pytest.approx(expected, rel=1e-12)
  assert 2.0 < byte_ds.unigram_loss() < np.log(257)  # English bytes: ~3 nats, below uniform
  monkeypatch.setattr(data, "_COUNT_CHUNK", 3)  # counted in chunks: the same
  assert ds.unigram_loss() == pytest.approx(expected, rel=1e-12)


# ----------------------------------------------------------------------------- the cache

TEXTS = ["Once upon a time there was a cat.", "The cat sat.\n\nIt was happy. â€œHi!â€\x9d", "End."]


def test_cache_partial_or_stale_is_rebuilt(tmp_path):
  tok = tokenizer.ByteTokenizer()
  path = tmp_path / "t" / "train.byte.bin"
  side = cache.sidecar_path(path)
  first = cache.build_or_open(path, lambda: TEXTS, tok, "src-A", progress=False)
  expected = np.asarray(first).copy()
  assert expected.size == sum(len(t.encode()) + 1 for t in TEXTS)

  def reopen(source="src-A"):
    before = cache.build_count
    arr = cache.build_or_open(path, lambda: TEXTS, tok, source, progress=False)
    return arr, cache.build_count - before

  assert reopen()[1] == 0
  side.unlink()                                   # partial: sidecar never written
  arr, rebuilt = reopen()
  assert rebuilt == 1 and side.is_file()
  np.testing.assert_array_equal(arr, expected)
  with open(path, "r+b") as f:                    # truncated token file
    f.truncate(10)
  arr, rebuilt = reopen()
  assert rebuilt == 1 and path.stat().st_size == expected.size * 2
  meta = json.loads(side.read_text())             # built by another tokenizer
  side.write_text(json.dumps({**meta, "tokenizer": "gpt2", "tokenizer_fingerprint": "gpt2"}))
  assert reopen()[1] == 1
  side.write_text("{not json")                    # corrupt sidecar
  assert reopen()[1] == 1
  assert reopen("src-B")[1] == 1                  # the source changed
  assert reopen("src-B")[1] == 0


def test_cache_overwritten_in_place_is_rebuilt(tmp_path, caplog):
  """Same size and mtime, other bytes: the checksum catches it, the tokens are rebuilt."""
  tok = tokenizer.ByteTokenizer()
  path = tmp_path / "train.byte.bin"
  cache.build_or_open(path, lambda: TEXTS, tok, "src", progress=False)
  fresh = tok.encode_docs(TEXTS, np.dtype(np.uint16))
  stat = path.stat()
  with open(path, "r+b") as f:
    f.write(np.arange(5, dtype=np.uint16).tobytes())
  os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
  assert path.stat().st_size == stat.st_size
  before = cache.build_count
  with caplog.at_level(logging.WARNING, logger="actlab.data"):
    arr = cache.build_or_open(path, lambda: TEXTS, tok, "src", progress=False)
  assert cache.build_count == before + 1
  np.testing.assert_array_equal(arr, fresh)
  assert caplog.messages == [
      f"token cache {path}: checksum mismatch (file changed since it was built); rebuilding"]
  caplog.clear()
  cache.build_or_open(path, lambda: TEXTS, tok, "src", progress=False)
  assert cache.build_count == before + 1 and caplog.messages == []


def test_cache_without_checksum_is_rebuilt_once(tmp_path, caplog):
  tok = tokenizer.ByteTokenizer()
  path = tmp_path / "train.byte.bin"
  cache.build_or_open(path, lambda: TEXTS, tok, "src", progress=False)
  side = cache.sidecar_path(path)
  meta = json.loads(side.read_text())
  meta.pop("sha256", None)
  side.write_text(json.dumps({**meta, "format": 1}))  # written by an older actlab
  before = cache.build_count
  with caplog.at_level(logging.WARNING, logger="actlab.data"):
    cache.build_or_open(path, lambda: TEXTS, tok, "src", progress=False)
    cache.build_or_open(path, lambda: TEXTS, tok, "src", progress=False)
  assert cache.build_count == before + 1
  assert len(caplog.messages) == 1 and "format is 1" in caplog.messages[0], caplog.messages


def test_interrupted_build_leaves_no_cache(tmp_path):
  tok = tokenizer.ByteTokenizer()
  path = tmp_path / "train.byte.bin"

  def exploding():
    yield "one story"
    raise KeyboardInterrupt

  with pytest.raises(KeyboardInterrupt):
    cache.build_or_open(path, exploding, tok, "src", progress=False)
  assert list(tmp_path.iterdir()) == []  # no .bin, no sidecar, no temporary file
  with pytest.raises(data.DataError, match="no stories"):
    cache.build_or_open(path, lambda: [], tok, "src", progress=False)


def test_large_vocab_uses_uint32():
  assert cache.token_dtype(257) == np.uint16
  assert cache.token_dtype(65536) == np.uint16
  assert cache.token_dtype(65537) == np.uint32


# ----------------------------------------------------------------------------- BPE source


@pytest.mark.slow
def test_synthetic_bpe_trains_once_and_reloads(tmp_path):
  cfg = make_config(tmp_path, tokenizer="bpe:512")
  ds = data.load(cfg)
  tok = ds.tokenizer
  assert tok.name == "bpe:512" and 257 <= tok.vocab_size <= 512
  js = tmp_path / "tokenizers" / "synthetic" / "bpe-512.json"
  assert js.is_file()
  assert (tmp_path / "tokens" / "synthetic" / "train.bpe512.bin").is_file()
  story = synthetic.texts("validation")[0]
  ids = tok.encode(story)
  assert len(ids) < len(story.encode()) / 2  # it actually compresses
  assert tok.decode(ids) == story
  assert ds.val_tokens[len(ids)] == tok.eot_id
  np.testing.assert_array_equal(ds.val_tokens[:len(ids)], ids)
  mtime, builds = js.stat().st_mtime_ns, cache.build_count
  ds2 = data.load(cfg)
  assert js.stat().st_mtime_ns == mtime and cache.build_count == builds
  assert ds2.tokenizer.fingerprint == tok.fingerprint
  np.testing.assert_array_equal(ds2.train_batch(5), ds.train_batch(5))
  # A cache made by a tokenizer with other merges (another fingerprint) is rebuilt.
  (tmp_path / "tokens" / "synthetic" / "train.bpe512.json").write_text(
      (tmp_path / "tokens" / "synthetic" / "train.bpe512.json").read_text().replace(
          tok.fingerprint, "bpe:512-0000000000000000"))
  data.load(cfg)
  assert cache.build_count == builds + 1  # only train was stale


def test_data_dir_resolution(monkeypatch, tmp_path):
  monkeypatch.setenv("ACTLAB_DATA_DIR", str(tmp_path / "env"))
  assert data.data_dir("") == tmp_path / "env"
  assert data.data_dir(str(tmp_path / "cfg")) == tmp_path / "cfg"
  monkeypatch.delenv("ACTLAB_DATA_DIR")
  monkeypatch.setenv("HOME", str(tmp_path / "home"))
  assert data.data_dir("") == tmp_path / "home" / ".cache" / "actlab"


def test_concurrent_loads_build_each_cache_once(tmp_path, monkeypatch):
  """Parallel sweep cells sharing a fresh data dir: one builds, the others open its cache."""
  import threading

  real_build = cache.build_cache

  def slow_build(*args, **kwargs):
    time.sleep(0.2)  # widen the race window
    return real_build(*args, **kwargs)

  monkeypatch.setattr(cache, "build_cache", slow_build)
  before = cache.build_count
  results, errors = [], []

  def run():
    try:
      results.append(data.load(make_config(tmp_path)))
    except Exception as e:  # pragma: no cover - reported below
      errors.append(e)

  threads = [threading.Thread(target=run) for _ in range(3)]
  for t in threads:
    t.start()
  for t in threads:
    t.join()
  assert not errors and len(results) == 3
  assert cache.build_count == before + 2  # train and validation, once each
  for r in results[1:]:
    np.testing.assert_array_equal(r.train_batch(0), results[0].train_batch(0))


def test_test_windows_are_held_out_from_the_validation_windows():
  """With data.test_batches the validation windows keep the split's first half and the test
  windows take its second, sharing no token; without, the validation windows are as before."""
  val = np.arange(1000, dtype=np.uint16)
  common = dict(tokenizer=types.SimpleNamespace(vocab_size=1000), train_tokens=val, val_tokens=val,
                seq_len=9, batch_size=4, seed=0, num_val_batches=2)
  before = data.Dataset(**common)
  np.testing.assert_array_equal(before.val_starts(), np.linspace(0, 990, 8).round())
  held = data.Dataset(**common, num_test_batches=3)
  val_tokens = np.concatenate(held.val_batches()).ravel()
  test_tokens = np.concatenate(held.val_batches(test=True)).ravel()
  assert len(held.val_batches()) == 2 and len(held.val_batches(test=True)) == 3
  assert val_tokens.max() < 500 <= test_tokens.min() and test_tokens.max() == 999
  with pytest.raises(data.DataError, match="in each half"):
    data.Dataset(**{**common, "val_tokens": val[:15]}, num_test_batches=1)

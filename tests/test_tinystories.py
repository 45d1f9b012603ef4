"""actlab.data.tinystories: the TFDS builder (array_record, no TF), its parser and its errors."""

import collections
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import pytest

from actlab import data
from actlab import data as cache
from actlab.data import provenance
from actlab.data import tinystories as ts
from conftest import data_config

SHARED = (Path(__file__).parents[1] / ".." / "shared" / "data").resolve()
SHARED_TS = SHARED / "tinystories"
needs_shared = pytest.mark.skipif(
    not (SHARED_TS / "train.txt").is_file(),
    reason=f"TinyStories reference sample not found at {SHARED_TS}")
needs_gpt2 = pytest.mark.skipif(
    not (SHARED / "gpt2" / "encoder.json").is_file(),
    reason=f"GPT-2 reference files not found at {SHARED / 'gpt2'}")

# Stories in the release format: V2 paragraphs separated by blank lines, V1 by single newlines,
# mojibake quotes, whitespace around separators, an empty story, CRLF line ends.
STORIES_TRAIN = [
    "Once upon a time, there was a little girl named Lily.\n\nShe liked to play outside.",
    "Tom had a red ball. He said, â€œLet's play!â€\x9d\nSue was happy.",
    "The sun was hot. The cat slept under a tree.",
    "Max saw a big dog 🐶. They became friends.\n\nThe end.",
] * 5
STORIES_VALID = ["Ben found a shell by the sea.", "Mia and her mom baked a cake. It was yummy!"]


def write_tinystories(path: Path, stories, crlf=False):
  nl = "\r\n" if crlf else "\n"
  parts = []
  for i, s in enumerate(stories):
    parts.append(s.replace("\n", nl) + nl + ("  " if i % 3 == 0 else "") + "<|endoftext|>" + nl)
    if i == 2:
      parts.append("   " + nl + "<|endoftext|>" + nl)  # an empty story: dropped
  path.write_bytes("".join(parts).encode("utf-8"))


def make_config(data_dir, **data_overrides):
  return data_config(data_dir, batch_size=4, **{"source": "tinystories", "seq_len": 16,
                                                "val_batches": 2, **data_overrides})


@pytest.fixture
def offline(monkeypatch):
  """No network: every HTTP request fails at once, like a machine without DNS."""
  import requests

  calls = []

  def send(self, request, **kwargs):
    calls.append(request.url)
    raise requests.ConnectionError(f"Failed to resolve host for {request.url} (offline test)")

  monkeypatch.setattr(requests.Session, "send", send)
  return calls


# ----------------------------------------------------------------------------- the parser


def test_parse_stories_splits_trims_and_drops_empty(tmp_path):
  f = tmp_path / "a.txt"
  write_tinystories(f, STORIES_TRAIN[:4], crlf=False)
  assert list(ts.parse_stories(f)) == STORIES_TRAIN[:4]
  write_tinystories(f, STORIES_TRAIN[:4], crlf=True)
  assert [s.replace("\r\n", "\n") for s in ts.parse_stories(f)] == STORIES_TRAIN[:4]


@pytest.mark.parametrize("content, why", [
    (b"", "no stories"),
    (b"\n  \n<|endoftext|>\n\n<|endoftext|>\n", "no stories"),
    (b"Just some text.\nNo separators at all.\n", "no <|endoftext|> separator"),
    (bytes(range(256)) * 50, "NUL"),
    (bytes(range(128, 256)) * 50 + b"\n<|endoftext|>\n", "not UTF-8"),
    (b"First story.\n<|endoftext|>\nA last story, cut sh", "it ends inside story 2 (no "
                                                           "<|endoftext|> line after it"),
])
def test_parse_stories_rejects_wrong_files(tmp_path, content, why):
  f = tmp_path / "bad.txt"
  f.write_bytes(content)
  with pytest.raises(data.DataError, match="not a TinyStories text file") as e:
    list(ts.parse_stories(f))
  assert why in str(e.value) and "bad.txt" in str(e.value)


def test_parse_stories_rejects_endless_story(tmp_path, monkeypatch):
  monkeypatch.setattr(ts, "MAX_STORY_CHARS", 1000)
  f = tmp_path / "TinyStories-train.txt"
  f.write_text("word " * 100 + "\n<|endoftext|>\n" + "word word\n" * 200)
  with pytest.raises(data.DataError, match="no <\\|endoftext\\|> separator line within"):
    list(ts.parse_stories(f))


def test_manual_instructions_name_every_file():
  for cfg in ts.CONFIGS.values():
    for name in (cfg.train_file, cfg.valid_file):
      assert name in ts.TinyStories.MANUAL_DOWNLOAD_INSTRUCTIONS
  assert ts.TinyStories.name == "tiny_stories"
  assert {c.name for c in ts.TinyStories.BUILDER_CONFIGS} == {"v1", "v2"}


# ----------------------------------------------------------------------------- the builder


def test_builder_prepares_from_manual_dir_offline(tmp_path, offline, capfd, caplog, monkeypatch):
  manual = tmp_path / "manual" / "tiny_stories"
  manual.mkdir(parents=True)
  write_tinystories(manual / "TinyStoriesV2-GPT4-train.txt", STORIES_TRAIN)
  write_tinystories(manual / "TinyStoriesV2-GPT4-valid.txt", STORIES_VALID)
  scratch = tmp_path / "scratch"
  scratch.mkdir()
  monkeypatch.setattr(tempfile, "tempdir", str(scratch))  # the system's temporary directory
  capfd.readouterr()
  with caplog.at_level(logging.INFO, logger="absl"):
    corpus = ts.Corpus("v2", tmp_path / "tfds", manual)
  assert offline == []  # the manual files were used, nothing was fetched
  assert list(scratch.iterdir()) == []  # nothing left in /tmp (TFDS's bucket lookup would)
  # Nothing downloaded: one line, none of TFDS's "Downloading and preparing", bars or warnings.
  assert capfd.readouterr() == ("", f"actlab: preparing TinyStories v2 from {manual} into "
                                    f"{tmp_path / 'tfds'} (once: later runs read it from there)\n")
  assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
  files = sorted(p.name for p in (tmp_path / "tfds" / "tiny_stories" / "v2" / "1.0.0").iterdir())
  assert any(".array_record-" in n for n in files), files
  assert corpus.num_texts("train") == len(STORIES_TRAIN)
  assert collections.Counter(corpus.texts("train")) == collections.Counter(STORIES_TRAIN)
  assert sorted(corpus.texts("validation")) == sorted(STORIES_VALID)
  assert list(corpus.texts("train")) == list(corpus.texts("train"))  # a fixed order
  assert "v2" in corpus.source_id("train") and str(len(STORIES_TRAIN)) in corpus.source_id("train")

  # load(): the default manual dir is <data dir>/manual/tiny_stories; caches per version
  builds = cache.build_count
  ds = data.load(make_config(tmp_path))
  assert cache.build_count == builds + 2
  assert (tmp_path / "tokens" / "tinystories-v2" / "train.byte.bin").is_file()
  n_expected = sum(len(s.encode()) + 1 for s in STORIES_TRAIN)
  assert ds.train_tokens.shape == (n_expected,)
  text = ds.tokenizer.decode(ds.train_tokens)
  assert collections.Counter(text.split("<|endoftext|>")[:-1]) == collections.Counter(STORIES_TRAIN)
  b = ds.train_batch(3)
  assert b.shape == (4, 17) and b.dtype == np.int32
  ds2 = data.load(make_config(tmp_path))  # reopened, not re-tokenized
  assert cache.build_count == builds + 2
  np.testing.assert_array_equal(ds2.train_batch(3), b)
  for x, y in zip(ds.val_batches(), ds2.val_batches()):
    np.testing.assert_array_equal(x, y)


def test_replaced_manual_file_is_prepared_again(tmp_path, offline, caplog):
  """A shorter copy, then the full file, then an edit of the same size: each load sees it."""
  manual = tmp_path / "manual" / "tiny_stories"
  manual.mkdir(parents=True)
  train = manual / "TinyStoriesV2-GPT4-train.txt"
  write_tinystories(train, STORIES_TRAIN)
  full = train.read_bytes()
  cut = full[:full.index(b"<|endoftext|>\n", len(full) // 2) + 14]  # fewer stories, all whole
  train.write_bytes(cut)
  write_tinystories(manual / "TinyStoriesV2-GPT4-valid.txt", STORIES_VALID)

  def load_and_check():
    """Loads; asserts the tokens are the current file's stories; returns the preparing lines."""
    expected = list(ts.parse_stories(train))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="actlab.data.tinystories"):
      ds = data.load(make_config(tmp_path))
    text = ds.tokenizer.decode(ds.train_tokens)
    assert collections.Counter(text.split("<|endoftext|>")[:-1]) == collections.Counter(expected)
    assert ts.Corpus("v2", tmp_path / "tfds", manual).num_texts("train") == len(expected)
    return len(expected), [m for m in caplog.messages if "preparing again" in m]

  n_truncated, lines = load_and_check()
  assert n_truncated < len(STORIES_TRAIN) and lines == []
  builds = cache.build_count
  train.write_bytes(full)
  n, lines = load_and_check()
  assert n == len(STORIES_TRAIN) and cache.build_count == builds + 1  # train only
  assert lines == [f"TinyStories v2: manual file {train.name} changed (size {len(cut):,} "
                   f"→ {len(full):,}); preparing again"]
  assert load_and_check() == (n, []) and cache.build_count == builds + 1
  # Same size, new mtime (e.g. an edit; the clock may not tick between two quick writes).
  mtime = train.stat().st_mtime_ns
  train.write_bytes(full.replace(b"Lily", b"Lucy"))
  os.utime(train, ns=(mtime + 10**9, mtime + 10**9))
  n, lines = load_and_check()
  assert n == len(STORIES_TRAIN) and cache.build_count == builds + 2
  assert len(lines) == 1 and lines[0].startswith(
      f"TinyStories v2: manual file {train.name} changed (modified "), lines
  # Prepared before actlab kept a record: prepared again once; the same files, the same caches.
  (tmp_path / "tfds" / "tiny_stories" / "v2" / "1.0.0" / provenance.SOURCES_FILE).unlink()
  n, lines = load_and_check()
  assert len(lines) == 1 and "no record of the manual files" in lines[0], lines
  assert load_and_check() == (n, []) and cache.build_count == builds + 2
  # Manual files removed after preparing (e.g. to save space): the prepared data stays.
  train.unlink()
  (manual / "TinyStoriesV2-GPT4-valid.txt").unlink()
  corpus = ts.Corpus("v2", tmp_path / "tfds", manual)
  assert corpus.num_texts("train") == len(STORIES_TRAIN) and offline == []
  assert any("Lucy" in t for t in corpus.texts("train"))


def test_missing_files_offline_is_one_data_error(tmp_path, offline, capfd, caplog):
  """One line naming the missing files, with nothing of TFDS's or absl's before it."""
  manual = tmp_path / "my_manual"
  with pytest.raises(data.DataError) as e, caplog.at_level(logging.INFO, logger="absl"):
    data.load(make_config(tmp_path, tinystories_version="v1", manual_dir=str(manual)))
  msg = str(e.value)
  for needed in ("TinyStories-train.txt and TinyStories-valid.txt are not in", str(manual),
                 ":smoke", "manual_dir"):
    assert needed in msg, (needed, msg)
  assert "\n" not in msg and len(offline) == 1  # one quick probe, not minutes of retries
  assert capfd.readouterr() == ("", "") and not caplog.records
  manual.mkdir()  # one file there: the other is the one named
  write_tinystories(manual / "TinyStories-train.txt", STORIES_TRAIN)
  with pytest.raises(data.DataError) as e:
    data.load(make_config(tmp_path, tinystories_version="v1", manual_dir=str(manual)))
  assert str(e.value).startswith(f"TinyStories v1: TinyStories-valid.txt is not in {manual} and "
                                 "could not be downloaded (ConnectionError: ")
  assert "TinyStories-train.txt" not in str(e.value)


def test_download_failure_is_a_data_error(tmp_path, monkeypatch):
  import tensorflow_datasets as tfds

  def fail(self, *args, **kwargs):
    raise OSError("simulated download failure")

  monkeypatch.setattr(ts, "probe", lambda urls: None)
  monkeypatch.setattr(tfds.download.DownloadManager, "download", fail)
  manual = tmp_path / "manual"
  manual.mkdir()
  write_tinystories(manual / "TinyStoriesV2-GPT4-valid.txt", STORIES_VALID)  # train missing
  with pytest.raises(data.DataError, match="TinyStoriesV2-GPT4-train.txt is not in") as e:
    ts.Corpus("v2", tmp_path / "tfds", manual)
  assert "simulated download failure" in str(e.value) and ":smoke" in str(e.value)
  assert "TinyStoriesV2-GPT4-valid.txt" not in str(e.value)


def test_garbage_file_is_a_data_error_and_prepares_nothing(tmp_path, offline):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "TinyStories-train.txt").write_bytes(os.urandom(200_000))
  write_tinystories(manual / "TinyStories-valid.txt", STORIES_VALID)
  with pytest.raises(data.DataError, match="TinyStories-train.txt is not a TinyStories text"):
    ts.Corpus("v1", tmp_path / "tfds", manual)
  assert not ts.builder("v1", tmp_path / "tfds").is_prepared()
  # Replacing the file fixes it.
  write_tinystories(manual / "TinyStories-train.txt", STORIES_TRAIN)
  assert ts.Corpus("v1", tmp_path / "tfds", manual).num_texts("train") == len(STORIES_TRAIN)


def test_file_without_separators_is_a_data_error(tmp_path, offline):
  manual = tmp_path / "manual"
  manual.mkdir()
  (manual / "TinyStoriesV2-GPT4-train.txt").write_text("An HTML error page.\n<html></html>\n")
  write_tinystories(manual / "TinyStoriesV2-GPT4-valid.txt", STORIES_VALID)
  with pytest.raises(data.DataError, match="no <\\|endoftext\\|> separator lines"):
    data.load(make_config(tmp_path, manual_dir=str(manual)))


@pytest.mark.parametrize("source", ["made", pytest.param("shared", marks=needs_shared)])
def test_a_file_cut_inside_a_story_is_refused_and_nothing_kept(tmp_path, offline, source):
  """A training file cut mid-story (a download cut short; here: the first 1 MB of the shared
  sample's 3.5, or half of a made one) is refused in one line naming the story it ends in; no
  data is prepared and no token cache written, so the whole file, put in its place, is used."""
  manual = tmp_path / "manual" / "tiny_stories"
  manual.mkdir(parents=True)
  train = manual / "TinyStories-train.txt"
  if source == "shared":
    full, stories = (SHARED_TS / "train.txt").read_bytes(), 4042
    train.write_bytes(full[:1_000_000])
  else:
    write_tinystories(train, STORIES_TRAIN)
    full, stories = train.read_bytes(), len(STORIES_TRAIN)
    train.write_bytes(full[:len(full) // 2 + 20])
  whole = train.read_bytes().count(b"<|endoftext|>") - (source == "made")  # an empty one dropped
  write_tinystories(manual / "TinyStories-valid.txt", STORIES_VALID)
  config = make_config(tmp_path, tinystories_version="v1")
  with pytest.raises(data.DataError) as e:
    data.load(config)
  assert str(e.value).startswith(f"{train} is not a TinyStories text file: it ends inside story "
                                 f"{whole + 1:,} (no <|endoftext|> line after it")
  assert "\n" not in str(e.value)
  assert not ts.builder("v1", tmp_path / "tfds").is_prepared()
  assert not (tmp_path / "tokens").exists()
  train.write_bytes(full)
  ds = data.load(config)
  assert int((ds.train_tokens == ds.tokenizer.eot_id).sum()) == stories


# ----------------------------------------------------------------------------- real data


@pytest.fixture(scope="module")
def shared_manual(tmp_path_factory):
  """The shared real sample under the V1 file names (its validation part is V1)."""
  d = tmp_path_factory.mktemp("ts_real")
  manual = d / "manual" / "tiny_stories"
  manual.mkdir(parents=True)
  (manual / "TinyStories-train.txt").symlink_to(SHARED_TS / "train.txt")
  (manual / "TinyStories-valid.txt").symlink_to(SHARED_TS / "valid.txt")
  return d


@needs_shared
def test_real_sample_prepares_with_mojibake(shared_manual):
  corpus = ts.Corpus("v1", shared_manual / "tfds", shared_manual / "manual" / "tiny_stories")
  assert corpus.num_texts("train") == 4042 and corpus.num_texts("validation") == 1000
  valid = list(corpus.texts("validation"))
  raw = (SHARED_TS / "valid.txt").read_text(encoding="utf-8")
  expected = [s.strip() for s in raw.split("<|endoftext|>") if s.strip()]
  assert collections.Counter(valid) == collections.Counter(expected)
  assert sum("â€" in s for s in valid) == 51  # the mojibake survives untouched
  assert any("\n\n" in s for s in corpus.texts("train"))  # V2 paragraphs kept


@pytest.mark.slow
@needs_shared
@needs_gpt2
def test_real_sample_end_to_end_with_gpt2(shared_manual):
  cfg = make_config(shared_manual, tinystories_version="v1", tokenizer="gpt2",
                    gpt2_dir=str(SHARED / "gpt2"), seq_len=128, val_batches=4)
  cfg.train.batch_size = 32
  ds = data.load(cfg)
  assert ds.tokenizer.vocab_size == 50257 and ds.train_tokens.dtype == np.uint16
  # README: 857,684 / 196,559 GPT-2 tokens for the raw files including the separator lines
  # ("<|endoftext|>" as text is 7 tokens plus newlines); the stories alone are fewer.
  assert 800_000 < ds.train_tokens.shape[0] < 857_684
  assert int((ds.train_tokens == 50256).sum()) == 4042
  assert int((ds.val_tokens == 50256).sum()) == 1000
  assert all(v.shape == (32, 129) for v in ds.val_batches())
  assert ds.tokenizer.decode(ds.val_batches()[0][0]).count(" ") > 50
  builds = cache.build_count
  again = data.load(cfg)
  assert cache.build_count == builds
  np.testing.assert_array_equal(again.train_batch(4999), ds.train_batch(4999))

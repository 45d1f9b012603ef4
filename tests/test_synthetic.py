"""The embedded synthetic corpus: deterministic, disjoint splits, sane sizes, consistent text."""

import collections
import hashlib
import os
import pathlib
import re
import subprocess
import sys

import pytest

from actlab.data import synthetic

_WORD = re.compile(r"[A-Za-z]+")
_SENTENCE_END = re.compile(r'(?<=[.!?])"?\s+')
_HE = {"he", "him", "his", "himself"}
_SHE = {"she", "her", "hers", "herself"}


def _digest(stories):
  return hashlib.sha256("\n\n".join(stories).encode("utf-8")).hexdigest()


def _hero(story):
  """The main character: the first word of the story that is a name from the lexicon."""
  names = set(synthetic.GIRL_NAMES) | set(synthetic.BOY_NAMES)
  return next((w for w in _WORD.findall(story) if w in names), None)


@pytest.fixture(scope="module")
def train():
  return synthetic.texts("train")


@pytest.fixture(scope="module")
def validation():
  return synthetic.texts("validation")


def test_splits_constant():
  assert synthetic.SPLITS == ("train", "validation")


@pytest.mark.parametrize("bad", ["test", "Train", "", "valid"])
def test_unknown_split_raises_and_names_valid_ones(bad):
  with pytest.raises(ValueError, match="train") as info:
    synthetic.texts(bad)
  assert "validation" in str(info.value)


@pytest.mark.slow
def test_deterministic_across_processes_and_hash_seeds(train, validation):
  here = {split: _digest(synthetic.texts(split)) for split in synthetic.SPLITS}
  assert here == {"train": _digest(train), "validation": _digest(validation)}
  code = (
      "import hashlib; from actlab.data import synthetic as s\n"
      "for split in s.SPLITS:\n"
      "    print(split, hashlib.sha256('\\n\\n'.join(s.texts(split)).encode()).hexdigest())\n"
  )
  # Different PYTHONHASHSEEDs: the corpus must not depend on hash() or set iteration order.
  for hash_seed in ("0", "12345"):
    env = dict(os.environ, PYTHONHASHSEED=hash_seed)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True, timeout=60).stdout
    there = dict(line.split() for line in out.strip().splitlines())
    assert there == here, f"corpus differs in a fresh process (PYTHONHASHSEED={hash_seed})"


def test_the_grammar_ships_in_the_wheel():
  """pyproject.toml names synthetic_grammar.json as package data, so installs hold it."""
  pyproject = (pathlib.Path(__file__).parent.parent / "pyproject.toml").read_text()
  package_data = pyproject.split("[tool.setuptools.package-data]", 1)[1].split("\n[", 1)[0]
  assert '"synthetic_grammar.json"' in package_data


def test_returns_a_fresh_list():
  a = synthetic.texts("validation")
  a.clear()
  assert len(synthetic.texts("validation")) == 600


def test_sizes(train, validation):
  assert len(train) == 6000
  assert len(validation) == 600
  assert 2_500_000 <= sum(map(len, train)) <= 3_800_000
  assert 250_000 <= sum(map(len, validation)) <= 380_000
  for story in train + validation:
    assert 300 <= len(story) <= 700, story


def test_stories_are_distinct_and_splits_disjoint(train, validation):
  assert len(set(train)) == len(train)
  assert len(set(validation)) == len(validation)
  assert not set(train) & set(validation)


def test_text_hygiene(train, validation):
  for story in train + validation:
    assert story and story == story.strip()
    assert story.isascii()
    assert "<|endoftext|>" not in story
    assert "{" not in story and "}" not in story, story  # an unfilled template slot
    assert "\n" not in story and "  " not in story
    assert story[0].isupper() or story[0] == '"'
    assert story[-1] in '.!?"', story
    assert story.count('"') % 2 == 0, story  # quotes are balanced


def test_name_lists_are_disjoint():
  # The pronoun check below infers the hero's gender from the name lists.
  assert not set(synthetic.GIRL_NAMES) & set(synthetic.BOY_NAMES)
  assert len(set(synthetic.GIRL_NAMES)) >= 20 and len(set(synthetic.BOY_NAMES)) >= 20


def test_pronouns_match_the_hero(train, validation):
  # Only the hero is ever referred to by a gendered pronoun, so every he/she matches the hero.
  for story in train[::7] + validation:
    hero = _hero(story)
    assert hero is not None, story
    words = {w.lower() for w in _WORD.findall(story)}
    own, other = (_SHE, _HE) if hero in synthetic.GIRL_NAMES else (_HE, _SHE)
    assert words & own, story
    assert not words & other, story


def test_entities_are_referred_back(train):
  objects = [noun for noun, _ in synthetic._GRAMMAR["objects"]]
  for story in train[::11]:
    hero = _hero(story)
    assert len(re.findall(rf"\b{hero}\b", story)) >= 2, story
    counts = [len(re.findall(rf"\b{re.escape(o)}\b", story)) for o in objects]
    assert max(counts) >= 2, story  # the hero's object comes back later in the story


def test_variety(train):
  sentences = collections.Counter(s for story in train for s in _SENTENCE_END.split(story))
  assert len(sentences) > 15_000
  # no sentence is a large share of the corpus (the openers vary)
  assert sentences.most_common(1)[0][1] < 0.1 * len(train)
  heroes = collections.Counter(_hero(story) for story in train)
  assert set(heroes) == set(synthetic.GIRL_NAMES) | set(synthetic.BOY_NAMES)
  assert sum('"' in story for story in train) > 0.8 * len(train)  # most stories have dialogue
  first_words = collections.Counter(" ".join(story.split()[:3]) for story in train)
  assert len(first_words) > 50


def test_the_fingerprint_follows_the_code_and_the_grammar(monkeypatch, tmp_path):
  """A token cache of the stories is checked against `fingerprint` rather than the stories: a
  change to this module's code or to the grammar changes it (and the NumPy and Python versions
  are part of it)."""
  before = synthetic.fingerprint()
  code, grammar = tmp_path / "synthetic.py", tmp_path / "synthetic_grammar.json"
  code.write_bytes(pathlib.Path(synthetic.__file__).read_bytes() + b"\n# changed\n")
  grammar.write_bytes(synthetic._GRAMMAR_FILE.read_bytes() + b" ")
  try:
    for name, changed in (("__file__", str(code)), ("_GRAMMAR_FILE", grammar)):
      with monkeypatch.context() as m:
        m.setattr(synthetic, name, changed)
        synthetic.fingerprint.cache_clear()
        assert synthetic.fingerprint() != before, name
      synthetic.fingerprint.cache_clear()
      assert synthetic.fingerprint() == before
  finally:
    synthetic.fingerprint.cache_clear()
  assert {split: len(synthetic.texts(split)) for split in synthetic.SPLITS} == synthetic.SIZES

"""The embedded corpus: SYNTHETIC children's stories generated from a small grammar
(`synthetic_grammar.json`) with fixed numpy seeds, so that smoke runs need no downloads
(docs/data.md). It is NOT TinyStories and much more regular than real text. `texts(split)`:
6,000 "train" / 600 "validation" distinct stories of 300-700 ASCII characters, none of
validation's in train, without end-of-text markers; about 0.2 s for both, then cached.
"""

import functools
import hashlib
import json
import pathlib
import sys
from collections.abc import Sequence
from importlib import resources

import numpy as np

SPLITS = ("train", "validation")

SIZES = {"train": 6000, "validation": 600}  # each split's stories, exactly
# One numpy stream per split. Generator.random() (PCG64, 53-bit doubles) is stable across numpy
# versions, and the grammar below only ever turns a uniform u into an index int(u * len).
_SEEDS = {"train": 20240611, "validation": 20240612}
_UNIFORMS_PER_STORY = 48  # fixed block per story, so each story consumes the same stream length
_CHUNK = 512
_MIN_CHARS, _MAX_CHARS = 300, 700  # the rare story outside this range is skipped


# The lexicon and the templates, formatted with a story's slots (_story). Helpers are never a
# gendered pronoun, so every he/she is the hero. A plot is a list of stages, each a list of
# variants ("" skips the stage); its last two (a feeling, a moral) are pooled into one closing line.
_GRAMMAR_FILE = resources.files(__package__).joinpath("synthetic_grammar.json")
_GRAMMAR = json.loads(_GRAMMAR_FILE.read_text("utf-8"))

GIRL_NAMES = _GRAMMAR["girl_names"]
BOY_NAMES = _GRAMMAR["boy_names"]
_PRONOUNS = {
    "girl": {"he": "she", "him": "her", "his": "her", "himself": "herself"},
    "boy": {"he": "he", "him": "him", "his": "his", "himself": "himself"},
}
_HELPERS_PEOPLE = _GRAMMAR["helpers_people"]
_HELPERS = _HELPERS_PEOPLE + _GRAMMAR["helpers_animals"]
_PLOTS = tuple((plot["stages"], _HELPERS_PEOPLE if plot["helpers"] == "people" else _HELPERS)
               for plot in _GRAMMAR["plots"].values())


def _cap(s: str) -> str:
  return s[:1].upper() + s[1:]


def _a(word: str) -> str:
  return ("an " if word[0] in "aeiou" else "a ") + word


class _Picker:
  """Turns a fixed block of uniforms into choices; raises if the grammar needs more."""

  def __init__(self, u: list[float]):
    self._u = u
    self._i = 0

  def index(self, n: int) -> int:
    u = self._u[self._i]
    self._i += 1
    return min(int(u * n), n - 1)

  def pick(self, seq: Sequence):
    return seq[self.index(len(seq))]

  def distinct(self, seq: Sequence, k: int) -> list:
    pool = list(seq)
    return [pool.pop(self.index(len(pool))) for _ in range(k)]


def _story(u: list[float]) -> str:
  p, g = _Picker(u), _GRAMMAR
  kid = p.pick(("girl", "boy"))
  name = p.pick(GIRL_NAMES if kid == "girl" else BOY_NAMES)
  fkid = p.pick(("girl", "boy"))
  friend = p.pick([n for n in (GIRL_NAMES if fkid == "girl" else BOY_NAMES) if n != name])
  pron = _PRONOUNS[kid]
  place, prep = p.pick(g["places"])
  obj, use = p.pick(g["objects"])
  obj_adj = p.pick(g["object_adjectives"])
  trait = p.pick(g["traits"])
  stages, helpers = p.pick(_PLOTS)
  h_intro, h_ref, h_voc = (h.format(his=pron["his"], friend=friend) for h in p.pick(helpers))
  fear, fear_event, fear_fix = p.pick(g["fears"])
  found1, found2, found3 = p.distinct(g["found"], 3)
  hide1, hide2 = p.distinct(g["hide_nouns"], 2)
  slots = {
      "name": name, "kid": kid, "fkid": fkid, "friend": friend, "trait": trait,
      "a_trait": _a(trait), "age": p.pick(("four", "five", "six", "seven")),
      "the_place": f"the {place}", "at_place": f"{prep} the {place}",
      "to_place": f"to the {place}", "obj": obj, "use": use, "obj_adj": obj_adj,
      "a_obj_adj": _a(obj_adj), "time": p.pick(g["times"]), "helper_intro": h_intro,
      "Helper_intro": _cap(h_intro), "helper": h_ref, "Helper": _cap(h_ref),
      "helper_voc": h_voc, "sight": p.pick(g["sights"]), "hide1": hide1, "hide2": hide2,
      "hide_spot": p.pick(g["hide_spots"]), "stuck_spot": p.pick(g["stuck_spots"]),
      "fear": fear, "found1": found1, "found2": found2, "found3": found3,
      "craft": p.pick(g["crafts"]),
  }
  slots |= pron | {_cap(k): _cap(v) for k, v in pron.items()}
  slots["fear_event"] = fear_event.format_map(slots)
  slots["fear_fix"] = fear_fix.format_map(slots)
  if p.index(2):
    parts = [p.pick(g["intro"]), p.pick(g["object"])]
  else:
    parts = [p.pick(g["setup_short"])]
  parts += [p.pick(stage) for stage in stages[:-2]]
  parts.append(p.pick(stages[-2] + stages[-1]))  # one closing line: a feeling or a moral
  return " ".join(x for x in parts if x).format_map(slots)


@functools.lru_cache(maxsize=None)
def _split(split: str) -> tuple[str, ...]:
  """The stories of `split`, distinct, and for validation none of train's."""
  rng = np.random.default_rng(_SEEDS[split])
  want = SIZES[split]
  out: list[str] = []
  seen = set(_split("train")) if split == "validation" else set()
  while len(out) < want:
    for u in rng.random((_CHUNK, _UNIFORMS_PER_STORY)).tolist():
      s = _story(u)
      if _MIN_CHARS <= len(s) <= _MAX_CHARS and s not in seen:
        seen.add(s)
        out.append(s)
        if len(out) == want:
          break
  return tuple(out)


@functools.cache
def fingerprint() -> str:
  """What the stories are made from, hashed (this code, the grammar, the NumPy and Python
  versions): a token cache is checked against it without generating the stories."""
  h = hashlib.sha256(pathlib.Path(__file__).read_bytes())
  h.update(_GRAMMAR_FILE.read_bytes())
  h.update(f"numpy {np.__version__}, python {sys.version_info[0]}.{sys.version_info[1]}".encode())
  return h.hexdigest()[:16]


def num_texts(split: str) -> int:
  return SIZES[split]


def source_id(split: str) -> str:
  """Keys the token cache: a run whose cache is built generates no story."""
  return f"synthetic/{split}:made_from={fingerprint()}"


def texts(split: str) -> list[str]:
  """The stories of `split` ("train" or "validation"), deterministic; a fresh list each call."""
  if split not in SPLITS:
    raise ValueError(f"unknown split {split!r}: choose one of {', '.join(SPLITS)}")
  return list(_split(split))

"""Sequence-classification data for the encoder (`model.task="classify"`), by `data.classify`
(docs/encoder.md, "Fine-tuning"): `synthetic/hero_gender` (offline, `hero_gender`) or `glue/sst2`
(1 = positive; GLUE's dev set as validation), from `<data dir>/manual/glue_sst2/` or TFDS.
"""

import csv
import dataclasses
import re
import socket
from pathlib import Path

import numpy as np

from actlab.infra.errors import DataError

NUM_CLASSES = {"synthetic/hero_gender": 2, "glue/sst2": 2}
SOURCES = tuple(NUM_CLASSES)
SST2_URL = "https://dl.fbaipublicfiles.com/glue/data/SST-2.zip"


@dataclasses.dataclass(frozen=True, eq=False)
class ClassifyDataset:
  """Labelled `[CLS] text [SEP] [PAD]…` rows, with the LM Dataset's sampling interface."""

  tokenizer: object
  train_tokens: np.ndarray = dataclasses.field(repr=False)  # int32 [N, seq_len]
  train_labels: np.ndarray = dataclasses.field(repr=False)  # int32 [N]
  val_tokens: np.ndarray = dataclasses.field(repr=False)
  val_labels: np.ndarray = dataclasses.field(repr=False)
  seq_len: int
  batch_size: int
  seed: int
  pad_id: int
  num_classes: int

  def train_batch(self, step: int) -> dict[str, np.ndarray]:
    """{"tokens": int32 [B, seq_len], "labels": int32 [B]}: rows from default_rng([seed, step])."""
    rows = np.random.default_rng([self.seed, int(step)]).integers(
        0, len(self.train_labels), self.batch_size)
    return {"tokens": self.train_tokens[rows], "labels": self.train_labels[rows]}

  def val_batches(self, test: bool = False) -> list[dict[str, np.ndarray]]:
    """The validation split in order, the last batch padded with label −1 rows; no test split."""
    if test:
      return []
    n, B = len(self.val_labels), self.batch_size
    tokens = np.pad(self.val_tokens, ((0, -n % B), (0, 0)), constant_values=self.pad_id)
    labels = np.pad(self.val_labels, (0, -n % B), constant_values=-1)
    return [{"tokens": tokens[i:i + B], "labels": labels[i:i + B]} for i in range(0, n, B)]


def encode(tokenizer, texts: list[str], seq_len: int, cls_id: int, sep_id: int,
           pad_id: int) -> np.ndarray:
  """int32 [N, seq_len]: `[CLS] text [SEP]` (text cut to seq_len − 2 tokens), [PAD] after."""
  out = np.full((len(texts), seq_len), pad_id, np.int32)
  for i, ids in enumerate(tokenizer.encode_batch(texts)):
    ids = [cls_id, *ids[:seq_len - 2], sep_id]
    out[i, :len(ids)] = ids
  return out


def hero_gender(text: str) -> int:
  """1 if the first name in `text` (the hero's) is a girl's, 0 if a boy's; ValueError if none."""
  from actlab.data import synthetic
  girls, boys = set(synthetic.GIRL_NAMES), set(synthetic.BOY_NAMES)
  for word in re.findall(r"[A-Za-z]+", text):
    if word in girls:
      return 1
    if word in boys:
      return 0
  raise ValueError(f"no hero name in {text[:60]!r}…")


def _read_tsv(path: Path) -> tuple[list[str], list[int]]:
  with open(path, newline="", encoding="utf-8") as f:
    reader = csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    if not reader.fieldnames or not {"sentence", "label"} <= set(reader.fieldnames):
      raise DataError(f"{path} is not GLUE's SST-2 TSV (a header 'sentence<TAB>label' and one "
                      "sentence per line); replace it with the file from SST-2.zip")
    rows = list(reader)
  return [r["sentence"] for r in rows], [int(r["label"]) for r in rows]


def _sst2_tfds(tfds_dir: Path) -> dict[str, tuple[list[str], list[int]]]:
  import tensorflow_datasets as tfds
  import tensorflow_datasets.text.glue  # noqa: F401  (registers glue/*)
  builder = tfds.builder("glue/sst2", data_dir=str(tfds_dir), file_format="array_record")
  if not builder.is_prepared():
    try:  # Fail fast without a network instead of TFDS's minutes of retries.
      socket.getaddrinfo("dl.fbaipublicfiles.com", 443)
    except OSError as e:
      raise DataError(
          f"glue/sst2 is not prepared under {tfds_dir} and cannot be downloaded ({e}). Offline: "
          f"put train.tsv and dev.tsv from {SST2_URL} in <data dir>/manual/glue_sst2/, or use "
          "data.classify='synthetic/hero_gender' (the ':smoke_classify' variant).") from e
    builder.download_and_prepare()
  out = {}
  for split in ("train", "validation"):
    source = builder.as_data_source(split=split)
    records = source[:] if len(source) else []
    out[split] = ([r["sentence"].decode() if isinstance(r["sentence"], bytes) else r["sentence"]
                   for r in records], [int(r["label"]) for r in records])
  return out


def examples(name: str, root: Path) -> dict[str, tuple[list[str], list[int]]]:
  """{"train": (texts, labels), "validation": (texts, labels)} of the dataset `name`."""
  if name == "synthetic/hero_gender":
    from actlab.data import synthetic
    texts = {split: synthetic.texts(split) for split in synthetic.SPLITS}
    return {split: (t, [hero_gender(x) for x in t]) for split, t in texts.items()}
  if name == "glue/sst2":
    manual = root / "manual" / "glue_sst2"
    if (manual / "train.tsv").is_file() and (manual / "dev.tsv").is_file():
      return {"train": _read_tsv(manual / "train.tsv"),
              "validation": _read_tsv(manual / "dev.tsv")}
    return _sst2_tfds(root / "tfds")
  raise ValueError(f"data.classify={name!r}: choose one of {', '.join(SOURCES)}")


def load(config, tokenizer, specials: dict, root: Path) -> ClassifyDataset:
  """The classification dataset of `config.data.classify`, in the encoder's tokens."""
  name, seq_len = config.data.classify, int(config.data.seq_len)
  if config.model.num_classes != NUM_CLASSES[name]:
    raise DataError(f"data.classify={name!r} has {NUM_CLASSES[name]} classes but "
                    f"model.num_classes={config.model.num_classes}; set them to agree")
  arrays = {}
  for split, (texts, labels) in examples(name, root).items():
    if not texts:
      raise DataError(f"{name}: the {split} split is empty")
    arrays[split] = (encode(tokenizer, texts, seq_len, specials["cls"], specials["sep"],
                            specials["pad"]), np.asarray(labels, np.int32))
  return ClassifyDataset(tokenizer, *arrays["train"], *arrays["validation"], seq_len=seq_len,
                         batch_size=int(config.train.batch_size), seed=int(config.train.seed),
                         pad_id=specials["pad"], num_classes=NUM_CLASSES[name])

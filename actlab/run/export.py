"""Writes a trained run as a Hugging Face model directory for `from_pretrained`
(docs/huggingface.md): `python -m actlab.run.export --workdir=runs/gelu --out=hf/gelu`. Needs the
`hf` extra (no torch).
"""

import importlib.util
import os
import pathlib

from absl import flags, logging

from actlab import tasks
from actlab.data import hf_tokenizer
from actlab.hf import checkpoint as hf_checkpoint
from actlab.hf.mapping import FAMILIES
from actlab.infra import errors
from actlab.infra import workdir as workdir_lib
from actlab.infra.workdir import recorded_path
from actlab.run import pretrained


def check_out(out: pathlib.Path) -> None:
  """Refuses an `--out` that is a file, is in a run directory, or holds anything but an earlier
  export."""
  workdir_lib.check_usable(out, "--out")
  if where := workdir_lib.in_run(out):
    raise errors.UserError(f"--out {out} {where} a run directory; export into a new or empty "
                           "directory outside it")
  entry = (workdir_lib.read_json(out / "config.json") or {}).get(hf_checkpoint.EXPORTED)
  exported = isinstance(entry, dict) and "exported_from" in entry
  if out.is_dir() and any(out.iterdir()) and not exported:
    raise errors.UserError(f"--out {out} holds files that actlab.run.export did not write; give a "
                           "new or empty directory, or one an earlier export wrote")


def write(workdir: pathlib.Path, out: pathlib.Path, family: str | None = None) -> str:
  """Writes the run in `workdir` into `out` as its model's family (`family`, if given, must be it);
  returns a line saying what it wrote."""
  missing = [m for m in ("transformers", "safetensors", "tokenizers")
             if importlib.util.find_spec(m) is None]
  if missing:
    raise errors.UserError(f"export needs {', '.join(missing)}: {hf_checkpoint.INSTALL}")
  check_out(out)
  config, tokenizer, _, params, step = pretrained.load_run(workdir)
  summary = workdir_lib.read_summary(workdir)  # Written when the run ended, or diverged.
  status = summary["status"] if summary else None
  run = {"exported_from": recorded_path(str(workdir.resolve()), out), "step": step,
         "steps": config.train.steps, "finished": summary is not None, "status": status}
  cls = hf_checkpoint.write(out, config, family, tasks.name(config), params, tokenizer.vocab_size,
                           tokenizer.eot_id, run)
  hf_tokenizer.write(tokenizer, out, config.model.max_len)
  state = {None: " (unfinished)", "diverged": " (diverged)"}.get(status, "")
  return (f"wrote {out}: {cls} from {workdir} step {step} of {config.train.steps}{state}, "
          f"tokenizer {tokenizer.name}; load it with "
          f"transformers.{cls}.from_pretrained({str(out)!r})")


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")  # "PyTorch was not found"
  print(write(pathlib.Path(flags.FLAGS.workdir), pathlib.Path(flags.FLAGS.out),
              flags.FLAGS.family))


if __name__ == "__main__":
  # The flags, not on import: --workdir would clash with actlab.sample's (tests import both).
  flags.DEFINE_string("workdir", None, "Run directory of a trained model.")
  flags.DEFINE_string("out", None, "Directory to write the Hugging Face model into: new, empty, "
                      "or one an earlier export wrote.")
  classes = "; ".join(f"{name} ({', '.join(f.classes.values())})" for name, f in FAMILIES.items())
  flags.DEFINE_enum("family", None, list(FAMILIES), "Optional: the transformers family the "
                    "run's model must be (its config.json decides it; another is refused): "
                    f"{classes}.")
  errors.require("workdir", "out")
  errors.run(main)

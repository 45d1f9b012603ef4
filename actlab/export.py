"""Writes a trained run as a Hugging Face model directory: `config.json`, `model.safetensors` and
the tokenizer's files, which `transformers` loads with `from_pretrained` (docs/huggingface.md).

  python -m actlab.export --workdir=runs/gelu --out=hf/gelu

A decoder becomes `GPT2LMHeadModel`, an encoder `BertForMaskedLM` (task mlm) or
`BertForSequenceClassification` (task classify); the padded vocabulary rows are dropped. What
GPT-2 or BERT cannot express (a gated FFN, another LayerNorm placement, ...) is refused in one
line (models/hf_checkpoint.py); the tokenizer's files: models/hf_tokenizer.py. Needs the `hf` extra: pip install -e ".[hf]".
"""

import importlib.util
import pathlib

from absl import flags, logging

from actlab import errors, tasks, train
from actlab.models import hf_checkpoint, hf_tokenizer

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory of a trained model.")
_OUT = flags.DEFINE_string("out", None, "Directory to write the Hugging Face model into.")
flags.mark_flags_as_required(["workdir", "out"])


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  missing = [m for m in ("transformers", "safetensors", "tokenizers")
             if importlib.util.find_spec(m) is None]
  if missing:
    raise errors.UserError(f"export needs {', '.join(missing)}: {hf_checkpoint.INSTALL}")
  config, tokenizer, _, params, step = train.load_run(pathlib.Path(_WORKDIR.value))
  arch, out = tasks.get(config).HF, pathlib.Path(_OUT.value)
  hf_checkpoint.write(out, config, arch, params, tokenizer.vocab_size, tokenizer.eot_id)
  hf_tokenizer.write(tokenizer, out, config.model.max_len)
  print(f"wrote {out}: {arch.cls} from {_WORKDIR.value} step {step}, tokenizer {tokenizer.name}; "
        f"load it with transformers.{arch.cls}.from_pretrained({str(out)!r})")


if __name__ == "__main__":
  errors.run(main)

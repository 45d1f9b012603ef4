"""A BERT-style encoder by argument: `configs/encoder.py:size=<size>,act=<activation>,task=<task>`.

    python -m actlab.main --config=configs/encoder.py:size=smoke,act=relu --workdir=runs/x

`size`: an encoder size of `actlab.config.sizes.SIZES` (its `bert_<size>` rows; default small; also the
first word alone); `act`: the FFN activation (default gelu); `task`: mlm (pretraining, the
default) or classify (fine-tuning; set `--config.train.init_from=<MLM workdir>`).
`configs/bert_<activation>.py:<size>[_classify]` is the same config.
"""

from actlab import config


def get_config(arg=None):
  a = config.parse_arg(arg, size="small", act="gelu", task="mlm")
  return config.encoder(a.act, a.size, a.task)

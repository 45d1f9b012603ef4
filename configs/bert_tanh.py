"""BERT-style encoder with the `tanh` FFN activation (pooler: tanh, `model.pooler_activation`).

Variants: `:smoke` (embedded corpus), `:base` (BERT-base) or another encoder size of
`actlab.config.sizes.SIZES`; `:classify`, `:smoke_classify`, `:base_classify` fine-tune (set
`--config.train.init_from=<MLM workdir>`).
"""

from actlab import config


def get_config(arg=None):
  return config.encoder("tanh", arg)

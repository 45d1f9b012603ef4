"""Decoder on TinyStories with the `elu` FFN activation.

Variants: `:smoke` (embedded corpus) or another decoder size of `actlab.config.sizes.SIZES` (`:cpu`, ...).
"""

from actlab import config


def get_config(arg=None):
  return config.decoder("elu", arg)

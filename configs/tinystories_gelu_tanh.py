"""Decoder on TinyStories with the `gelu_tanh` FFN activation.

Variants: `:smoke` (embedded corpus) or another decoder size of `actlab.config.sizes.SIZES` (`:cpu`, ...).
"""

from actlab import config


def get_config(arg=None):
  return config.decoder("gelu_tanh", arg)

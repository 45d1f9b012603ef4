"""Decoder on TinyStories with the `relu` FFN activation. Variants: `:smoke` (embedded corpus)."""

from actlab import config


def get_config(arg=None):
  return config.decoder("relu", arg)

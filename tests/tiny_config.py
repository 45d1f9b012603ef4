"""The tests' config, also as a file: `actlab.config.sizes.SIZES["tiny"]`, a 1-layer, d_model 32
decoder on the synthetic corpus (`conftest.DEEP`: 2 layers)."""

from actlab import config as config_lib


def get_config(arg=None):
  return config_lib.decoder(arg or "gelu", "tiny")

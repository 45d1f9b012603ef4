"""A GPT-style decoder by argument: `configs/decoder.py:size=<size>,act=<activation>`.

    python -m actlab.main --config=configs/decoder.py:size=smoke,act=swiglu --workdir=runs/x

`size`: a decoder size of `actlab.config.sizes.SIZES` (default reference; also the first word alone,
`decoder.py:smoke,act=swiglu`); `act`: a name from `actlab.models.activations.NAMES` (default gelu).
`configs/tinystories_<activation>.py:<size>` is the same config.
"""

from actlab import config


def get_config(arg=None):
  a = config.parse_arg(arg, size="reference", act="gelu")
  return config.decoder(a.act, a.size)

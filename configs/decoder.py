"""A decoder by argument: `configs/decoder.py:size=<size>,act=<activation>,block=<block>`.

    python -m actlab.main --config=configs/decoder.py:size=smoke,act=swiglu --workdir=runs/x
    python -m actlab.main --config=configs/decoder.py:smoke,act=relu,block=llama --workdir=runs/y

`size`: a decoder size of `actlab.config.sizes.SIZES` (default reference; also the first word alone,
`decoder.py:smoke,act=swiglu`); `act`: a name from `actlab.core.activations.NAMES` (default gelu);
`block`: `gpt2` (default) or `llama` (RMSNorm, rotary positions, no biases, an untied head, the
FFN gated for any `act`; `--config.model.ffn=plain` for a plain one). `configs/tinystories_
<activation>.py:<size>` is the GPT-2 block's config.
"""

from actlab import config


def get_config(arg=None):
  a = config.parse_arg(arg, size="reference", act="gelu", block="gpt2")
  return config.decoder(a.act, a.size, a.block)

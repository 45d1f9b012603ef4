"""A 2-layer, d_model 32 decoder on the synthetic corpus: the tests' config (also as a file)."""

from actlab import config as config_lib


def get_config(arg=None):
  c = config_lib.decoder(arg or "gelu", "smoke")
  c.model.update(num_layers=2, d_model=32, num_heads=2, d_ff=64, max_len=32)
  c.optim.update(lr=3e-3, warmup_steps=5)
  c.train.update(steps=50, batch_size=8, log_every=10, eval_every=25, checkpoint_every=25,
                 progress=False)
  c.data.update(seq_len=32, val_batches=2)
  return c

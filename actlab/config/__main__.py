"""python -m actlab.config: every field with its default and meaning (`config.listing`), or with
--config=FILE[:arg] the config it resolves to, as JSON (what a run writes to its config.json,
which records absolute paths relative to the run directory: docs/running.md)."""

from actlab import config as config_lib
from actlab.infra import errors

_CONFIG = errors.define_config_file(
    "config", "Config file to print as it resolves, e.g. configs/x.py:smoke (without it: every "
    "field with its default and meaning).")


def main(argv):
  del argv
  if _CONFIG.value is not None:
    print(_CONFIG.value.to_json(indent=2))
    return
  print("Every config field: its default (the decoder's, config.base()), the encoder's where it "
        "differs, and what it does.\nOverride any with --config.<section>.<field>=<value>; print "
        "a config as it resolves with --config=FILE[:arg].\n")
  print(config_lib.listing())


errors.run(main)

"""python -m actlab.config: every field with its default and meaning, or with FILE[:arg] (or
--config=FILE[:arg]) the config it resolves to, as JSON."""

import sys

from absl import flags

from actlab import config as config_lib
from actlab.infra import errors

_CONFIG = errors.define_config_file(
    "config", "Config file to print as it resolves, e.g. configs/x.py:smoke, also given as the "
    "one positional argument (without it: every field with its default and meaning).")


def positional(argv: list[str]) -> list[str]:
  """`argv` with a positional FILE[:arg] as --config=FILE[:arg] (one, and not beside --config)."""
  given, rest, args = [], [], iter(argv[1:])
  for arg in args:
    name = arg.lstrip("-").partition("=")[0]
    if arg == "--":
      given += args
    elif arg.startswith("-") and arg != "-":
      rest.append(arg)
      if "=" not in arg and name in flags.FLAGS and not flags.FLAGS[name].boolean:
        rest += [next(args, "")]  # the flag's value: `--flag value`
    else:
      given.append(arg)
  if not given:
    return argv
  if len(given) > 1:
    raise errors.UserError(f"one config file, as FILE[:arg] or --config=FILE[:arg]; got "
                           f"{' '.join(given)}")
  if any(arg.lstrip("-").partition("=")[0] == "config" for arg in rest):
    raise errors.UserError(f"a config file twice: {given[0]} and --config; give one")
  return [argv[0], f"--config={given[0]}", *rest]


def main(argv):
  del argv
  if _CONFIG.value is not None:
    print(_CONFIG.value.to_json(indent=2))
    return
  print("Every config field: its default (the decoder's, config.base()), the encoder's where it "
        "differs, and what it does.\nOverride any with --config.<section>.<field>=<value>; print "
        "a config as it resolves with python -m actlab.config FILE[:arg].\n")
  print(config_lib.listing())


with errors.reported():
  sys.argv = positional(sys.argv)
errors.run(main)

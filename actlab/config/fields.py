"""The listing `python -m actlab.config` prints: every config field with its default and comment,
by section. The comments are read from the source of the sections in schema.py, the names an
activation field takes from `actlab.core.activations`: the listing cannot drift.
"""

import inspect
import re

from actlab import config as config_lib
from actlab.config import schema
from actlab.core import activations

_FIELD = re.compile(r"^  (\w+): [^=]+ = .*?(?:#\s*(.*))?$")
_MORE = re.compile(r"^ {3,}#\s*(.*)$")


def comments() -> dict[str, str]:
  """{"section.field": its comment} from the sections' source in schema.py: the comment beside
  the field and the comment lines below it indented further."""
  out = {}
  for section, cls in [*schema.SECTIONS.items(), *schema.ENCODER.items()]:
    last = None
    for line in inspect.getsource(cls).splitlines():
      if field := _FIELD.match(line):
        last = f"{section}.{field.group(1)}"
        out[last] = field.group(2) or ""
      elif (more := _MORE.match(line)) and last:
        out[last] = f"{out[last]} {more.group(1)}".strip()
      else:
        last = None
  return out


def names() -> dict[str, str]:
  """{"section.field": the names it accepts} for the activation fields: the FFN's takes any, the
  pooler's a plain one."""
  plain = ", ".join(n for n in activations.NAMES if not activations.get(n).gated)
  return {"model.activation": f"{plain}; gated (GLU): {', '.join(activations.GATE_BASE)}",
          "model.pooler_activation": plain}


def listing() -> str:
  """The fields in source order, each with its default (the decoder's, and the encoder's where it
  differs), its comment and the names it accepts."""
  decoder, encoder = config_lib.base().to_dict(), config_lib.encoder().to_dict()
  notes, accepted = comments(), names()
  order = list(notes) + [f"{s}.{f}" for s in encoder for f in encoder[s]]  # source order first
  lines, section = [], None
  for key in dict.fromkeys(order):
    name, field = key.split(".")
    if name != section:
      section = name
      lines.append(f"\n{section}")
    value, mine = encoder[name][field], decoder.get(name, {})
    tag = (" [encoder]" if field not in mine else
           f" [encoder: {value!r}]" if value != mine[field] else "")
    lines.append(f"  {key} = {mine.get(field, value)!r}{tag}")
    if notes.get(key):
      lines.append(f"      {notes[key]}")
    if key in accepted:
      lines.append(f"      one of: {accepted[key]}")
  return "\n".join(lines).lstrip("\n")

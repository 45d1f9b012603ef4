"""ReLU − GELU under each option of docs/recipe.md, at smoke size: `relu_gelu.py:smoke` with one
option set, a check that each option runs through `ask` from `plan` to its verdict (issue 100).

`:mup` (μP, base width 32: the smoke model's width 64 is twice it), `:muon` (Muon on the blocks'
matrices), `:wsd` (warm-up–stable–decay, the last 20% decaying linearly). Smaller than
`relu_gelu.py:smoke` so that the three run in minutes on 2 CPU cores: a 2-LR pilot on 2 seeds, at
least 4 fresh seeds, at most 6. A verdict here says that the machinery runs, not what the option
does to the gap: the smoke model trains 150 steps on the embedded corpus.
"""

import pathlib
import runpy

RELU_GELU = runpy.run_path(str(pathlib.Path(__file__).with_name("relu_gelu.py")))

OPTIONS = {
    "mup": {"model.parametrization": "mup", "model.mup_base_width": 32},
    "muon": {"optim.name": "muon"},
    "wsd": {"optim.schedule": "wsd", "optim.decay_fraction": 0.2},
}


def get_question(arg=None):
  if arg not in OPTIONS:
    raise ValueError(f"recipe_smoke: unknown option {arg!r}; use one of {', '.join(OPTIONS)}")
  q = RELU_GELU["get_question"]("smoke")
  return {**q, "question": f"{q['question']} ({arg}, smoke size)",
          "fixed": {**q["fixed"], **OPTIONS[arg]},
          "pilot": {"lrs": [3e-3, 1e-2], "seeds": [0, 1]},
          "fresh": {"first_seed": 100, "cap": 6},
          "rule": {**q["rule"], "min_seeds": 4}}

"""The coordinate check, the standard proof that μP is implemented (Yang et al. 2022; microsoft/
mup's `coord_check`): the decoder of `--config` at widths 64 → 1024 (its heads and layers kept,
d_ff 4 × the width), trained a few steps on the same batches under SP and under μP (base
`--base`), and the size per coordinate (RMS) of what each layer puts out after steps 1 … k: the
embedding's output, attention's, the FFN's pre- and post-activation (means over the layers) and
the logits. Under μP they stay put as the width grows; under SP the logits grow with it.

  python -m actlab.bench.coord --config=configs/tinystories_gelu.py:smoke --out=coord.png

The LR is the config's, held constant (no warm-up or decay), so that steps 1 … k show the
updates' own size. docs/recipe.md shows the figure.
"""


import functools

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags, logging

from actlab import config as config_lib, core, data
from actlab.infra import errors
from actlab.run import program

SITES = ("embedding", "attention", "ffn_pre", "ffn_post", "logits")
PARAMETRIZATIONS = ("sp", "mup")


def width_config(config, width: int, parametrization: str, base: int, steps: int):
  """`config` at `width` (d_ff 4 × width) under `parametrization`, trained `steps` steps at its
  LR held constant."""
  return config_lib.override(config.copy_and_resolve_references(), {
      "model.d_model": width, "model.d_ff": 4 * width, "model.parametrization": parametrization,
      "model.mup_base_width": base, "train.steps": steps, "optim.warmup_steps": 0,
      "optim.min_lr_ratio": 1.0})


def sizes(model, params, tokens_BL) -> dict[str, jax.Array]:
  """Each site's RMS per coordinate on `tokens_BL` (jitted once per model by `measure`)."""
  logits_BLV, state = model.apply({"params": params}, tokens_BL, capture_intermediates=True,
                                  mutable=["stats", "intermediates"])
  seen = state["intermediates"]
  rms = lambda x: jnp.sqrt(jnp.mean(jnp.square(x.astype(jnp.float32))))
  mean_rms = lambda xs: jnp.mean(jnp.stack([rms(x) for x in xs]))
  embedded = seen["wte"]["__call__"][0]
  if "wpe" in seen:
    embedded = embedded + seen["wpe"]["__call__"][0]
  ffn = core.model.per_layer(state["stats"], core.FFNStats)
  attention = [v["attn"]["__call__"][0] for k, v in seen.items() if k.startswith("block_")]
  return {"embedding": rms(embedded), "attention": mean_rms(attention),
          "ffn_pre": mean_rms([f.z for f in ffn]), "ffn_post": mean_rms([f.h for f in ffn]),
          "logits": rms(logits_BLV)}


def measure(config, widths=(64, 128, 256, 512, 1024), steps: int = 4, base: int = 128,
            parametrizations=PARAMETRIZATIONS) -> list[dict]:
  """Rows {parametrization, width, step, <site>: RMS} after each of `steps` steps (step 0: at
  initialisation); every width trains on the same batches from the config's seed, and is measured
  on the first one."""
  config = config_lib.override(config.copy_and_resolve_references(), {"train.progress": False})
  if config.model.scan_layers:
    raise config_lib.ConfigError("the coordinate check reads each block's output: run it with "
                                 "model.scan_layers=false")
  dataset = data.load(config)
  batches = [dataset.train_batch(i) for i in range(steps)]
  probe_BL = jnp.asarray(batches[0][:, :-1])
  rows = []
  for parametrization in parametrizations:
    for width in widths:
      c = width_config(config, width, parametrization, base, steps)
      step = program.create_step(c, dataset.tokenizer.vocab_size)
      state = jax.jit(step.init)(c.train.seed)
      train_step = jax.jit(lambda s, b, step=step: step.train_step(s, b, diagnostics=False))
      measured = jax.jit(functools.partial(sizes, step.objective.model))
      for i in range(steps + 1):
        rows.append({"parametrization": parametrization, "width": width, "step": i,
                     **{site: float(v) for site, v in measured(state.params, probe_BL).items()}})
        if i < steps:
          state, _ = train_step(state, jnp.asarray(batches[i]))
  return rows


def spread(rows: list[dict], parametrization: str, site: str, step: int) -> float:
  """The site's RMS at the widest width over the narrowest's, after `step` steps."""
  at = {r["width"]: r[site] for r in rows
        if r["parametrization"] == parametrization and r["step"] == step}
  return at[max(at)] / at[min(at)]


def table(rows: list[dict]) -> str:
  """Each parametrization's sites against the width, after the last step."""
  last = max(r["step"] for r in rows)
  lines = [f"RMS per coordinate after {last} steps (widest / narrowest in the last column)",
           "| parametrization | site | " + " | ".join(
               str(w) for w in sorted({r['width'] for r in rows})) + " | ratio |",
           "|---|---|" + "---|" * (len({r["width"] for r in rows}) + 1)]
  for p in dict.fromkeys(r["parametrization"] for r in rows):
    for site in SITES:
      at = sorted((r["width"], r[site]) for r in rows
                  if r["parametrization"] == p and r["step"] == last)
      lines.append(f"| {p} | {site} | " + " | ".join(f"{v:.3g}" for _, v in at)
                   + f" | {spread(rows, p, site, last):.2f} |")
  return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
  """SP's and μP's rows of panels, one panel per site: RMS against the width, a line per step."""
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  parametrizations = list(dict.fromkeys(r["parametrization"] for r in rows))
  steps = sorted({r["step"] for r in rows})
  fig, axes = plt.subplots(len(parametrizations), len(SITES), sharex=True,
                           figsize=(3 * len(SITES), 2.8 * len(parametrizations)), squeeze=False)
  colors = plt.cm.viridis(np.linspace(0, 0.9, len(steps)))
  for i, p in enumerate(parametrizations):
    for j, site in enumerate(SITES):
      ax = axes[i, j]
      for step, color in zip(steps, colors):
        at = sorted((r["width"], r[site]) for r in rows
                    if r["parametrization"] == p and r["step"] == step)
        ax.plot(*zip(*at), marker="o", ms=3, color=color, label=f"step {step}")
      ax.set_xscale("log", base=2)
      ax.set_yscale("log")
      ax.set_title(f"{'μP' if p == 'mup' else 'SP'}: {site}", fontsize=9)
      if i == len(parametrizations) - 1:
        ax.set_xlabel("width (d_model)")
  axes[0, 0].set_ylabel("RMS per coordinate")
  axes[-1, 0].set_ylabel("RMS per coordinate")
  axes[0, -1].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  plt.close(fig)


def main(argv):
  del argv
  F = flags.FLAGS
  if not F["verbosity"].present:
    logging.set_verbosity(logging.WARNING)
  widths = [int(w) for w in F.widths.split(",")]
  if min(widths) <= 0 or any(w % F.config.model.num_heads for w in widths):
    raise config_lib.ConfigError(f"--widths={F.widths}: each must be a positive multiple of "
                                 f"model.num_heads={F.config.model.num_heads}")
  rows = measure(F.config, widths, F.steps, F.base)
  print(table(rows))
  if F.out:
    plot(rows, F.out)
    print(f"wrote {F.out}")


if __name__ == "__main__":
  errors.define_config_file("config", "Config file, e.g. configs/tinystories_gelu.py:smoke.")
  errors.require("config")
  flags.DEFINE_string("widths", "64,128,256,512,1024", "the widths (d_model), comma-separated")
  flags.DEFINE_integer("steps", 4, "training steps (sizes after each)")
  flags.DEFINE_integer("base", 128, "μP's base width (model.mup_base_width)")
  flags.DEFINE_string("out", "", "the figure's path (PNG); none if empty")
  errors.run(main)

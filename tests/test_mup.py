"""μP (`model.parametrization="mup"`): at its base width it is the SP run, bitwise; away from it
each multiplier is where the table puts it (init, the per-parameter LR, the logits, attention),
the export folds them into transformers' weights; and the coordinate check passes as built and
fails on a planted mistake."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from actlab import config as config_lib, core
from actlab.bench import coord
from actlab.hf import checkpoint as hf_checkpoint
from actlab.run import program as program_lib
from conftest import tiny

VOCAB = 257


def mup(width: int, base: int, **overrides):
  return tiny(**{"model.d_model": width, "model.d_ff": 4 * width, "model.parametrization": "mup",
                 "model.mup_base_width": base, **overrides})


def trained(config, steps: int = 3):
  """The params and per-step metrics after `steps` jitted steps on fixed random batches."""
  step = program_lib.create_step(config, VOCAB)
  state = step.init(0)
  train_step = jax.jit(step.train_step)
  batches = jax.random.randint(jax.random.PRNGKey(1), (steps, 4, 17), 0, VOCAB)
  metrics = []
  for batch in batches:
    state, m = train_step(state, batch)
    metrics.append(jax.device_get(m))
  return state.params, metrics


def test_mup_at_its_base_width_is_the_sp_run_bitwise():
  """Every μP factor is exactly 1 at the base and is then not applied: the same initial
  parameters, the same losses and gradient norms, the same parameters after three steps, to the
  bit (not merely within rounding)."""
  sp, at_base = tiny(), mup(32, 32, **{"model.d_ff": tiny().model.d_ff})
  (p_sp, m_sp), (p_mup, m_mup) = trained(sp), trained(at_base)
  for a, b in zip(m_sp, m_mup):
    assert a.keys() == b.keys()
    for k in a:
      np.testing.assert_array_equal(a[k], b[k], err_msg=k)
  jax.tree.map(np.testing.assert_array_equal, p_sp, p_mup)


def test_the_width_multiplier_scales_init_lr_logits_and_attention_as_the_table_says():
  """At 4 × the base: hidden matrices start at SP's std / 2 and step at AdamW's LR / 4;
  embeddings, biases and norms as SP; the logits are the head's × 1/4 and attention's logits
  q·k · √K_base / K (queries × 1/2 beyond SP's 1/√K)."""
  spec = program_lib.create_step(mup(128, 32), VOCAB).objective.model.spec
  assert core.model.width_multiplier(spec) == 4.0
  assert core.model.hidden_std(spec) == 0.01
  assert core.model.output_multiplier(spec) == 0.25
  assert core.model.attention_multiplier(spec) == 0.5
  assert core.model.lr_factor(spec, ("block_0", "ffn", "up", "kernel")) == 0.25
  for path in (("wte", "embedding"), ("lm_head",), ("block_0", "ffn", "up", "bias"),
               ("ln_f", "scale")):
    assert core.model.lr_factor(spec, path) == 1.0
  params = program_lib.create_step(mup(512, 32), VOCAB).init(0).params
  flat = {"/".join(k): np.asarray(v) for k, v in flatten_dict(params).items()}
  np.testing.assert_allclose(flat["block_0/ffn/up/kernel"].std(), 0.02 / 4, rtol=0.02)
  np.testing.assert_allclose(flat["block_0/attn/query/kernel"].std(), 0.02 / 4, rtol=0.02)
  np.testing.assert_allclose(flat["wte/embedding"].std(), 0.02, rtol=0.02)


def test_mup_steps_hidden_matrices_at_the_lr_over_m_and_the_rest_at_the_lr():
  """One optimizer step on the same gradient: μP's update of a hidden matrix is −(lr / m)·(1 + wd·W)
  (Adam's first step is ±1), weight decay scaled with the LR as in mup's MuAdamW; every other
  parameter (embeddings, biases, norms: the same initial values) steps exactly as under SP."""
  def first_update(config):
    step = program_lib.create_step(config, VOCAB)
    state = step.init(0)
    grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5), state.params)
    return flatten_dict(step.tx.update(grads, state.opt_state, state.params)[0])

  sp = tiny(**{"model.d_model": 128, "model.d_ff": 512, "optim.warmup_steps": 0})
  up_sp, up_mup = first_update(sp), first_update(mup(128, 32, **{"optim.warmup_steps": 0}))
  for path, u in up_sp.items():
    if path[-1] == "kernel":  # another init under μP, so another decay term: below, by hand
      continue
    np.testing.assert_array_equal(up_mup[path], u, err_msg="/".join(path))
  kernel = ("block_0", "ffn", "up", "kernel")
  lr, wd = sp.optim.lr, sp.optim.weight_decay
  params = flatten_dict(program_lib.create_step(mup(128, 32), VOCAB).init(0).params)
  np.testing.assert_allclose(up_mup[kernel], -lr / 4 * (1.0 + wd * np.asarray(params[kernel])),
                             rtol=1e-5)


def test_under_muon_mups_matrices_take_muons_shape_factor_not_the_lr_over_m():
  """μP with Muon: the blocks' matrices step as under SP with Muon (the same parameters and
  gradient give the same update: no LR / m), and only with Muon's own factor ("width")."""
  muon = {"optim.name": "muon", "optim.muon_scale": "width", "optim.warmup_steps": 0}
  sp = program_lib.create_step(tiny(**{"model.d_model": 128, "model.d_ff": 512, **muon}), VOCAB)
  mu = program_lib.create_step(mup(128, 32, **muon), VOCAB)
  state = sp.init(0)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.5) + p, state.params)
  updates = [flatten_dict(s.tx.update(grads, s.tx.init(state.params), state.params)[0])
             for s in (sp, mu)]
  for path, u in updates[0].items():
    np.testing.assert_array_equal(updates[1][path], u, err_msg="/".join(path))
  with pytest.raises(config_lib.ConfigError, match="muon_scale='width'"):
    config_lib.typed(mup(128, 32, **{**muon, "optim.muon_scale": "rms"}))


def test_export_folds_mups_multipliers_into_an_untied_head_and_the_queries():
  """The μP model's logits equal those of the SP model (transformers' function) holding
  `mup_folded` parameters; a tied head cannot hold the logits' multiplier and is refused."""
  llama = {"model.tie_head": False, "model.position": "rope", "model.bias": False}
  mup_config, sp_config = mup(128, 32, **llama), tiny(**{"model.d_model": 128,
                                                         "model.d_ff": 512, **llama})
  mup_model = program_lib.create_step(mup_config, VOCAB).objective.model
  sp_model = program_lib.create_step(sp_config, VOCAB).objective.model
  params = program_lib.create_step(mup_config, VOCAB).init(0).params
  tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 16), 0, VOCAB)
  folded = hf_checkpoint.mup_folded(config_lib.typed(mup_config), params)
  np.testing.assert_allclose(sp_model.apply({"params": folded}, tokens),
                             mup_model.apply({"params": params}, tokens), rtol=1e-4, atol=1e-6)
  why = hf_checkpoint._unlike(config_lib.typed(mup(128, 32)), "gpt2", "causal_lm")
  assert why and "μP" in why and "tie_head" in why


@pytest.mark.parametrize("overrides, says", [
    ({"model.parametrization": "mup"}, "needs model.mup_base_width"),
    ({"model.parametrization": "mup", "model.mup_base_width": -8}, "must be >= 0"),
    ({"model.parametrization": "mu"}, "choose 'sp' or 'mup'"),
])
def test_a_bad_mup_config_is_one_line(overrides, says):
  with pytest.raises(config_lib.ConfigError, match=says) as e:
    config_lib.typed(tiny(**overrides))
  assert "\n" not in str(e.value)


# --- The coordinate check ------------------------------------------------------------------------
# Widths 64 → 256 (4×), two layers, three steps at LR 1e-2 (held): under μP every site's RMS at
# 256 stays within a factor of 1.5 of its value at 64; under SP attention's output and the logits
# grow past it. The same check fails when μP loses its LR scaling or its logit multiplier.
COORD_FACTOR = 1.5


def coordinate_rows(parametrizations=coord.PARAMETRIZATIONS):
  config = tiny(**{"model.num_layers": 2, "train.batch_size": 4, "data.seq_len": 32,
                   "optim.lr": 1e-2})
  return coord.measure(config, widths=(64, 256), steps=3, base=64,
                       parametrizations=parametrizations)


def stays_put(rows) -> bool:
  last = max(r["step"] for r in rows)
  return all(1 / COORD_FACTOR <= coord.spread(rows, "mup", site, last) <= COORD_FACTOR
             for site in coord.SITES)


def test_the_coordinate_check_holds_under_mup_and_sp_grows_with_the_width():
  rows = coordinate_rows()
  last = max(r["step"] for r in rows)
  assert stays_put(rows), coord.table(rows)
  assert coord.spread(rows, "sp", "logits", last) > COORD_FACTOR, coord.table(rows)
  assert coord.spread(rows, "sp", "attention", last) > COORD_FACTOR, coord.table(rows)


@pytest.mark.parametrize("planted", ["lr_factor", "output_multiplier"])
def test_the_coordinate_check_fails_on_a_planted_mistake(monkeypatch, planted):
  """μP without its hidden matrices' LR / m, or without the logits' 1/m, fails the check."""
  target = core.step if planted == "lr_factor" else core.model
  monkeypatch.setattr(target, planted, lambda *args: 1.0)
  rows = coordinate_rows(parametrizations=("mup",))
  assert not stays_put(rows), coord.table(rows)


def test_results_md_prints_the_lr_transfer_table_its_committed_runs_give(capsys):
  """RESULTS.md's exploratory study 5: every mean loss, best LR and the base check as
  `python experiments/mup_transfer.py` computes them from results/mup_transfer_cpu_epoch."""
  import re
  import runpy
  from conftest import REPO
  runpy.run_path(str(REPO / "experiments" / "mup_transfer.py"))["table"](
      str(REPO / "results" / "mup_transfer_cpu_epoch"))
  printed = capsys.readouterr().out
  # Each table row's cells, numbers as numbers (the page writes 3e-3 where the script prints 0.003)
  value = lambda cell: float(cell) if re.fullmatch(r"[\d.e-]+", cell) else cell.replace("μp", "mup")
  rows = lambda text: [[value(c.strip("* ").lower()) for c in line.split("|")[1:-1]]
                       for line in text.splitlines() if re.match(r"\| (64|128|256) \|", line)]
  section = (REPO / "RESULTS.md").read_text().split("## Exploratory study 5")[1].split("\n## ")[0]
  assert len(rows(section)) == 6 and rows(section) == rows(printed)
  assert "8 of 8 finished pairs" in printed and "(8 of 8 pairs)" in section

"""The masked-LM objective (`core.MaskedLM`, actlab/core/encoder.py) and task
(actlab/tasks/mlm.py): BERT's masking (15% of maskable tokens; 80/10/10) on the device,
reproducible from the key; loss and accuracy over the selected positions. (That the MLM loss
falls on the embedded corpus through `train.run` is in tests/test_classify.py.)"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from actlab import core, tasks
from actlab.core import encoder

SPECIALS = core.Specials(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 1000


def sequences(B=64, L=128, seed=0):
  """[CLS] text [SEP] rows with internal [SEP]s, a few [UNK]s and right padding of varied length."""
  rng = np.random.default_rng(seed)
  t = rng.integers(5, VOCAB, (B, L))
  t[rng.random((B, L)) < 0.03] = SPECIALS.sep
  t[rng.random((B, L)) < 0.02] = SPECIALS.unk
  t[:, 0] = SPECIALS.cls
  lengths = rng.integers(L // 4, L + 1, B)
  for b, n in enumerate(lengths):
    t[b, n - 1] = SPECIALS.sep
    t[b, n:] = SPECIALS.pad
  return jnp.asarray(t, jnp.int32)


@pytest.fixture(scope="module")
def draws():
  tokens = sequences()
  keys = jax.random.split(jax.random.PRNGKey(0), 40)
  fn = jax.jit(jax.vmap(lambda k: encoder.mask_tokens(k, tokens, SPECIALS, VOCAB)))
  return tokens, jax.device_get(fn(keys))


@pytest.mark.slow
def test_selection_counts_and_never_special(draws):
  tokens, (inputs, positions, targets, weights) = draws
  tokens = np.asarray(tokens)
  assert positions.shape == (40, 64, encoder.max_predictions(128, 0.15)) == (40, 64, 20)
  maskable = ~np.isin(tokens, [0, 2, 3, 4])
  n = maskable.sum(1).astype(np.float32)
  k = np.maximum(1, np.round(np.float32(0.15) * n))  # float32, as on the device
  np.testing.assert_array_equal(weights.sum(-1), np.broadcast_to(k, (40, 64)))
  for d in range(40):
    for b in range(64):
      sel = positions[d, b][weights[d, b]]
      assert len(set(sel)) == len(sel)                      # distinct positions
      assert maskable[b, sel].all()                         # never [CLS], [SEP], [PAD], [MASK]
      np.testing.assert_array_equal(targets[d, b][weights[d, b]], tokens[b, sel])
      unselected = np.setdiff1d(np.arange(128), sel)
      np.testing.assert_array_equal(inputs[d, b, unselected], tokens[b, unselected])
  # [UNK] stands for text: it can be selected.
  selected_tokens = np.take_along_axis(np.broadcast_to(tokens, (40, 64, 128)), positions, -1)
  assert (selected_tokens[weights] == SPECIALS.unk).any()


@pytest.mark.slow
def test_selection_is_uniform_over_maskable_positions(draws):
  tokens, (_, positions, _, weights) = draws
  maskable = ~np.isin(np.asarray(tokens), [0, 2, 3, 4])
  hits = np.zeros((64, 128))
  for d in range(40):
    for b in range(64):
      hits[b, positions[d, b][weights[d, b]]] += 1
  rate = hits[maskable].sum() / (40 * maskable.sum())
  assert abs(rate - 0.15) < 0.005
  # Early and late maskable positions are equally likely (no bias towards the start).
  early = hits[:, :32][maskable[:, :32]].mean() / 40
  late = hits[:, 32:][maskable[:, 32:]].mean() / 40
  assert abs(early - late) < 0.02


def test_80_10_10(draws):
  tokens, (inputs, positions, targets, weights) = draws
  new = np.take_along_axis(inputs, positions, -1)[weights]
  orig = targets[weights]
  n = len(new)
  assert n > 20_000
  masked = (new == SPECIALS.mask).mean()
  same = (new == orig).mean()
  random = ((new != SPECIALS.mask) & (new != orig)).mean()
  assert abs(masked - 0.8) < 0.01 and abs(random - 0.1) < 0.01 and abs(same - 0.1) < 0.01
  replaced = new[(new != SPECIALS.mask) & (new != orig)]
  assert replaced.min() >= 5 and replaced.max() < VOCAB      # random tokens are ordinary
  assert len(np.unique(replaced)) > 0.9 * (VOCAB - 5) * (1 - np.exp(-len(replaced) / (VOCAB - 5)))


@pytest.mark.slow
def test_masking_is_a_function_of_the_key():
  tokens = sequences(8, 64)
  mask = jax.jit(lambda k: encoder.mask_tokens(k, tokens, SPECIALS, VOCAB))
  a, b, c = mask(jax.random.PRNGKey(3)), mask(jax.random.PRNGKey(3)), mask(jax.random.PRNGKey(4))
  jax.tree.map(np.testing.assert_array_equal, a, b)
  assert not np.array_equal(a[0], c[0])


@pytest.mark.slow
def test_proportions_follow_the_config():
  tokens = sequences(64, 128)
  keys = jax.random.split(jax.random.PRNGKey(1), 10)
  fn = jax.jit(jax.vmap(lambda k: encoder.mask_tokens(k, tokens, SPECIALS, VOCAB, 0.3, 0.5,
                                                         0.0)))
  inputs, positions, targets, weights = jax.device_get(fn(keys))
  n = (~np.isin(np.asarray(tokens), [0, 2, 3, 4])).sum(1).astype(np.float32)
  k = np.maximum(1, np.round(np.float32(0.3) * n))  # float32, as on the device
  np.testing.assert_array_equal(weights[0].sum(-1), k)
  new = np.take_along_axis(inputs, positions, -1)[weights]
  assert abs((new == SPECIALS.mask).mean() - 0.5) < 0.02
  assert ((new == SPECIALS.mask) | (new == targets[weights])).all()  # random_frac = 0


def test_encoder_sequences():
  windows = jnp.arange(2 * 9).reshape(2, 9) + 10
  seq = encoder.encoder_sequences(windows, SPECIALS)
  assert seq.shape == (2, 8)
  np.testing.assert_array_equal(seq[0], [2, 10, 11, 12, 13, 14, 15, 3])


SPEC = core.Spec("gelu", num_layers=2, d_model=32, num_heads=2, d_ff=64, max_len=32,
            vocab_size=320, norm="post", norm_eps=1e-12)


@pytest.mark.slow
def test_masked_lm_loss_and_accuracy_over_selected_positions():
  model = core.Encoder(SPEC, head="mlm")
  params = jax.jit(model.init)(jax.random.PRNGKey(0), jnp.zeros((1, 8), jnp.int32))["params"]
  windows = jnp.asarray(np.random.default_rng(0).integers(5, 261, (4, 33)), jnp.int32)
  loss = jax.jit(lambda p, k: core.MaskedLM(model, SPECIALS, 261)(p, windows, k, train=False))
  out = loss(params, jax.random.PRNGKey(0))
  assert int(out.count) == 4 * round(0.15 * 30)             # 30 maskable of [CLS] 30 [SEP]
  np.testing.assert_allclose(out.loss_sum / out.count, np.log(320), rtol=0.05)  # at init
  again = loss(params, jax.random.PRNGKey(0))
  assert float(again.loss_sum) == float(out.loss_sum)   # fixed key: fixed mask
  other = loss(params, jax.random.PRNGKey(1))
  assert float(other.loss_sum) != float(out.loss_sum)
  # By hand: the full-sequence logits at the selected positions give the same loss.
  @jax.jit
  def by_hand(params):
    tokens = encoder.encoder_sequences(windows, SPECIALS)
    inputs, positions, targets, weights = encoder.mask_tokens(
        jax.random.split(jax.random.PRNGKey(0))[0], tokens, SPECIALS, 261)
    logits = model.apply({"params": params}, inputs)
    picked = jnp.take_along_axis(logits, positions[..., None], 1)
    ce = -jnp.take_along_axis(jax.nn.log_softmax(picked), targets[..., None], -1)[..., 0]
    return (ce * weights).sum(), ((picked.argmax(-1) == targets) & weights).sum()
  loss_sum, correct = by_hand(params)
  np.testing.assert_allclose(float(loss_sum), float(out.loss_sum), rtol=1e-4)
  assert int(correct) == int(out.correct)


class Oracle:
  """A stand-in model that predicts `params["answers"]` at the masked positions, surely."""

  def apply(self, variables, inputs_BL, *args, masked_positions_BP, **kwargs):
    answers_BP = jnp.take_along_axis(variables["params"]["answers"], masked_positions_BP, 1)
    return 10.0 * jax.nn.one_hot(answers_BP, 320)


def test_masked_lm_accuracy_counts_right_predictions_at_selected_positions_only():
  windows = jnp.asarray(np.random.default_rng(1).integers(5, 261, (4, 33)), jnp.int32)
  tokens = encoder.encoder_sequences(windows, SPECIALS)
  score = jax.jit(lambda answers: core.MaskedLM(Oracle(), SPECIALS, 261)(
      {"answers": answers}, windows, jax.random.PRNGKey(0), train=False))
  right, wrong, row_0_right = score(tokens), score(tokens + 1), score(tokens.at[1:].add(1))
  # Each row has unused prediction slots (weight 0); right answers there must not count.
  assert encoder.max_predictions(32, 0.15) > round(0.15 * 30)
  assert int(right.count) == 4 * round(0.15 * 30)
  assert int(right.correct) == int(right.count)
  assert int(wrong.correct) == 0
  assert int(row_0_right.correct) == round(0.15 * 30)


class IidTokens:
  """A stand-in Dataset: validation windows of i.i.d. tokens drawn from a known unigram `u`."""

  def __init__(self, u, windows=400, length=33, seed=0):
    with np.errstate(divide="ignore"):  # the specials' probability 0: log -inf
      self.log_u = np.log(u)
    # One batch: every batch of an evaluation gets the same mask (one fixed key).
    self.batches = [np.random.default_rng(seed).choice(len(u), size=(windows, length), p=u)]
    self.tokenizer = type("Tok", (), {"vocab_size": len(u)})

  def val_batches(self):
    return self.batches

  def unigram_log_probs(self, exclude=()):
    return self.log_u


def mlm_config(mask_frac=0.8, random_frac=0.1):
  import ml_collections
  return ml_collections.ConfigDict({"data": {
      "tokenizer": "wordpiece:300", "mlm_prob": 0.15, "mlm_mask_frac": mask_frac,
      "mlm_random_frac": random_frac}})


def skewed_unigram(vocab=12):
  """Specials 0-4 never occur; the ordinary tokens 5.. have skewed frequencies."""
  u = np.zeros(vocab)
  u[5:] = np.arange(vocab - 5, 0, -1, dtype=float)
  return u / u.sum()


def test_copy_loss_is_the_context_free_predictors_and_below_the_unigram():
  """The posterior p(target = x | visible x) that `copy_loss` uses equals the frequency with
  which masking leaves x's own token there, counted over many draws; with BERT's 10% kept the
  copy predictor beats the unigram, and with every selection [MASK]ed it is the unigram."""
  u = skewed_unigram()
  ds = IidTokens(u, windows=20000)
  inputs, targets = tasks.mlm_selections(mlm_config(), ds, tasks.specials(mlm_config()))
  keep, r, n = 0.1, 0.1, len(u) - 5
  for x in (5, 11):  # a frequent and a rare token
    seen = inputs == x
    predicted = (keep * u[x] + r * u[x] / n) / (keep * u[x] + r / n)  # kept, or drawn again
    np.testing.assert_allclose((targets[seen] == x).mean(), predicted, atol=0.03)
  # Its loss is the conditional entropy of the target given the visible token, estimated here
  # from the same selections (a plug-in estimate: 12 tokens, ~100k selections).
  joint = np.zeros((len(u), len(u)))
  np.add.at(joint, (inputs, targets), 1)
  conditional = joint / joint.sum(1, keepdims=True).clip(1)
  plug_in = -np.log(conditional[inputs, targets]).mean()
  np.testing.assert_allclose(tasks.mlm_baselines(mlm_config(), ds)["copy_loss"], plug_in, atol=0.005)
  small = IidTokens(u)
  bert, all_masked = tasks.mlm_baselines(mlm_config(), small), tasks.mlm_baselines(mlm_config(1.0, 0.0), small)
  assert bert["copy_loss"] < bert["unigram_loss"] - 0.05
  np.testing.assert_allclose(all_masked["copy_loss"], all_masked["unigram_loss"], rtol=1e-12)


def test_mask_positions_are_scored_apart():
  """`mask_*` sums count exactly the selected positions whose input is [MASK]."""
  windows = jnp.asarray(np.random.default_rng(2).integers(5, 261, (8, 33)), jnp.int32)
  out = jax.jit(lambda w: core.MaskedLM(Oracle(), SPECIALS, 261)(
      {"answers": encoder.encoder_sequences(w, SPECIALS)}, w, jax.random.PRNGKey(0),
      train=False))(windows)
  (inputs, positions, _, weights), _ = jax.jit(lambda w: encoder.masked_batch(
      jax.random.PRNGKey(0), w, SPECIALS, 261, 0.15, 0.8, 0.1))(windows)
  masked = np.asarray(weights) & (np.take_along_axis(np.asarray(inputs), np.asarray(positions), 1)
                                  == SPECIALS.mask)
  assert 0 < int(out.mask.count) == masked.sum() < int(out.count)
  assert int(out.mask.correct) == masked.sum()  # the oracle is right everywhere
  np.testing.assert_allclose(float(out.mask.loss_sum) / masked.sum(),
                             float(out.loss_sum) / float(out.count), rtol=1e-5)

"""What a run learns. A task owns the model it trains (the trunk with its head), its loss, its
batches, its chance level and its head's FLOPs; `get(config)` is the task of a config, and no
module outside this package asks what kind of model or task a config is.

| task        | model                              | a batch                         | loss                                    |
|-------------|------------------------------------|---------------------------------|-----------------------------------------|
| `causal_lm` | decoder (GPT), tied LM head        | windows of L+1 tokens           | next-token cross-entropy                |
| `mlm`       | encoder (BERT), MLM head           | the same windows, as `[CLS] … [SEP]`, masked on the device | cross-entropy at the masked positions |
| `classify`  | encoder, pooler and classifier     | `{"tokens", "labels"}`          | cross-entropy of the class              |

A task module defines:

- `model(config, vocab_size) -> nn.Module`;
- `objective(config, vocab_size) -> (model, params, batch, rng, train, stats=False) ->
  {"loss_sum", "count"}` (sums, so that evaluation pools exactly over batches; `"correct"` too
  where accuracy applies; with `stats`, `"sown"`: the statistics of `models.apply`, and
  `"logz_sum"`; in training with `optim.z_loss` > 0, `loss_sum` includes the z-loss and
  `"z_loss_sum"` is that part: `models.logit_sums`);
- `dataset(config)`: training batches `train_batch(step)` and fixed `val_batches()`;
- `random_batch(config, vocab_size, seed)`: a batch of the right form for benchmarks;
- `chance_loss(config, vocab_size)`: the loss of predicting uniformly (ln of the outputs);
- `head_matmul_params(config, vocab_size)`: the head's matrix entries per token (actlab.measure.flops);
- `baselines(config, dataset)`: summary entries, the val losses of predictors that use no
  context, where they are comparable with the task's loss: `unigram_loss` (a unigram model of
  the training tokens) and, where the input shows the token to predict (MLM), `copy_loss` (the
  best predictor that uses nothing else); the lower is the report's "not learned" bar;
- `CAUSAL`: it predicts the next token (`actlab.sample` continues text; the PyTorch reference
  of `actlab.bench` computes the same step);
- `HF`: the transformers model it is (`models.hf_checkpoint.Architecture`), for `actlab.export`
  and `train.init_from=hf:DIR`.

Adding a task is one module here and one line in `TASKS`.
"""

from types import ModuleType

import ml_collections

from actlab.tasks import causal_lm, classify, mlm

TASKS = {"causal_lm": causal_lm, "mlm": mlm, "classify": classify}


def name(config: ml_collections.ConfigDict) -> str:
  """The task of `config`: the decoder's is `causal_lm`; the encoder's is `model.task`."""
  m = config.model
  return "causal_lm" if m.kind == "decoder" else m.task


def get(config: ml_collections.ConfigDict) -> ModuleType:
  return TASKS[name(config)]

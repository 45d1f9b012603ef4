"""Continues a prompt with a trained decoder in one jitted `lax.scan` over a key/value cache:
`python -m actlab.sample --workdir=runs/gelu --prompt="Once upon a time" --temperature=0.8`.
"""

import pathlib

import jax
import jax.numpy as jnp
from absl import flags, logging

from actlab import tasks
from actlab.infra import errors
from actlab.run.pretrained import load_run  # also `sample.load_run`, as before

_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory of a trained decoder.")
_PROMPT = flags.DEFINE_string("prompt", "", "Text to continue, after <|endoftext|> (the "
                              "tokenizer's end of text, as each training document follows one); "
                              "empty: a story start.")
_MAX_TOKENS = flags.DEFINE_integer("max_tokens", None,
                                   "Tokens to generate (default: fill the context).")
_TEMPERATURE = flags.DEFINE_float("temperature", 0.8, "Softmax temperature; 0 means greedy.",
                                  lower_bound=0.0)
_TOP_K = flags.DEFINE_integer("top_k", 40, "Sample among the k likeliest tokens; 0 means all.",
                              lower_bound=0)
_SEED = flags.DEFINE_integer("seed", 0, "Sampling seed.")
errors.require("workdir")


def sample_token(logits_BV, key, temperature: float, top_k: int, vocab_size: int):
  """One token per row; padded vocabulary entries are never drawn."""
  logits_BV = jnp.where(jnp.arange(logits_BV.shape[-1]) < vocab_size, logits_BV, -jnp.inf)
  if temperature == 0:
    return jnp.argmax(logits_BV, axis=-1)
  if top_k:
    kth_B1 = jax.lax.top_k(logits_BV, top_k)[0][:, -1:]
    logits_BV = jnp.where(logits_BV < kth_B1, -jnp.inf, logits_BV)
  return jax.random.categorical(key, logits_BV / temperature)


def make_generate(model, vocab_size: int, max_new: int, temperature: float, top_k: int):
  """A jitted `(params, prompt_BP, key) -> tokens_BN`: prefill the cache, then scan."""

  def apply(params, cache, tokens_BL):
    logits_BLV, variables = model.apply({"params": params, "cache": cache}, tokens_BL,
                                        decode=True, mutable=["cache"])
    return logits_BLV[:, -1], variables["cache"]

  @jax.jit
  def generate(params, prompt_BP, key):
    shapes = jax.eval_shape(lambda: model.init(key, prompt_BP, decode=True))["cache"]
    cache = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
    logits_BV, cache = apply(params, cache, prompt_BP)

    def step(carry, key_t):
      logits_BV, cache = carry
      token_B = sample_token(logits_BV, key_t, temperature, top_k, vocab_size)
      return apply(params, cache, token_B[:, None]), token_B

    _, tokens_NB = jax.lax.scan(step, (logits_BV, cache), jax.random.split(key, max_new))
    return tokens_NB.T

  return generate


def continue_prompt(workdir: pathlib.Path, prompt: str, max_tokens: int | None,
                    temperature: float, top_k: int, seed: int) -> str:
  """`prompt` continued by the run in `workdir`, `max_tokens` new tokens at most (None: up to its
  context)."""
  config, tokenizer, task, params, _ = load_run(workdir)
  if not tasks.get(config).causal:
    raise errors.UserError(f"sampling needs a causal LM (decoder) run; {workdir} is "
                           f"{tasks.name(config)!r}")
  if top_k > tokenizer.vocab_size:
    raise errors.UserError(f"--top_k={top_k} must be between 0 and the vocabulary size "
                           f"{tokenizer.vocab_size}")
  tokens = [tokenizer.eot_id] + tokenizer.encode(prompt)
  room = config.model.max_len - len(tokens)
  if room < 1:
    raise errors.UserError(f"the prompt takes {len(tokens)} tokens and the model's context is "
                           f"{config.model.max_len}; shorten the prompt")
  max_new = room if max_tokens is None else max_tokens
  if not 0 < max_new <= room:
    raise errors.UserError(
        f"the prompt takes {len(tokens)} of the model's {config.model.max_len} positions; "
        f"--max_tokens must be between 1 and {room}")
  generate = make_generate(task.objective.model, tokenizer.vocab_size, max_new, temperature, top_k)
  new = generate(params, jnp.asarray([tokens]), jax.random.PRNGKey(seed))[0].tolist()
  if tokenizer.eot_id in new:
    new = new[:new.index(tokenizer.eot_id)]
  return prompt + tokenizer.decode(new)


def main(argv):
  del argv
  logging.set_verbosity(logging.WARNING)
  print(continue_prompt(pathlib.Path(_WORKDIR.value), _PROMPT.value, _MAX_TOKENS.value,
                        _TEMPERATURE.value, _TOP_K.value, _SEED.value))


if __name__ == "__main__":
  errors.run(main)

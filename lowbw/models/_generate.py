"""Sampling text from a trained language model: one token at a time from
``model.apply``'s logits, with temperature and top-k."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from lowbw import _validate


def generate(model, params, prompt_ids, max_tokens: int = 100,
             temperature: float = 1.0, top_k: int | None = None,
             seed: int = 0, stop_id: int | None = None,
             on_token=None) -> list[int]:
  """Continues ``prompt_ids`` by up to ``max_tokens`` sampled tokens.

  The model sees the last ``seq_len`` tokens (its context) at each step;
  one compiled program serves every step (the window is padded on the
  right, which a causal model never attends to).

  Args:
    model: an ``"lm"`` model with ``apply``.
    params: its parameters.
    prompt_ids: the prompt's token ids (at least one).
    max_tokens: tokens to add, >= 1.
    temperature: > 0 divides the logits; 0 takes the most likely token.
    top_k: sample among the k most likely tokens only (None: all).
    seed: the sampling key's seed (same seed, same text).
    stop_id: stop after this token (e.g. the end-of-text token).
    on_token: called with the number of tokens made so far after each one
      (a progress bar; the command line shows one on a terminal).

  Returns:
    The new token ids (the prompt not included).
  """
  if model.task != "lm" or getattr(model, "apply", None) is None:
    raise _validate.fail("model", model.name, "generation needs a language "
                         "model with apply (gpt, moe_gpt)")
  _validate.positive_int("max_tokens", max_tokens)
  _validate.non_negative("temperature", temperature)
  vocab, seq_len = model.config["vocab"], model.config["seq_len"]
  if top_k is not None:
    _validate.positive_int("top_k", top_k)
    top_k = min(top_k, vocab)
  ids = [int(i) for i in prompt_ids]
  if not ids:
    raise _validate.fail("prompt", "", "expected at least one token")
  if min(ids) < 0 or max(ids) >= vocab:
    raise _validate.fail("prompt", ids[:8], f"token ids must lie in [0, "
                         f"{vocab}), the model's vocabulary")
  step = _sampler(model.apply, top_k)
  key = jax.random.key(seed)
  temperature = jnp.float32(temperature)
  out = []
  for i in range(max_tokens):
    window = (ids + out)[-seq_len:]
    padded = np.zeros((1, seq_len), np.int32)
    padded[0, :len(window)] = window
    token = int(step(params, padded, len(window), temperature,
                     jax.random.fold_in(key, i)))
    out.append(token)
    if on_token is not None:
      on_token(len(out))
    if token == stop_id:
      break
  return out


@functools.lru_cache(maxsize=32)
def _sampler(apply, top_k: int | None):
  """One compiled step per model and top-k (the temperature is traced, so
  a new one compiles nothing)."""
  @jax.jit
  def step(params, tokens_1xT, length, temperature, key):
    logits_V = apply(params, tokens_1xT)[0, length - 1].astype(jnp.float32)
    scaled_V = logits_V / jnp.maximum(temperature, 1e-30)
    if top_k is not None:
      kth = jax.lax.top_k(scaled_V, top_k)[0][-1]
      scaled_V = jnp.where(scaled_V < kth, -jnp.inf, scaled_V)
    sampled = jax.random.categorical(key, scaled_V)
    return jnp.where(temperature == 0, jnp.argmax(logits_V), sampled)
  return step

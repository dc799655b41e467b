"""Sampling text from a trained language model: one token at a time from
``model.apply``'s logits, with temperature and top-k."""

import jax
import jax.numpy as jnp
import numpy as np

from lowbw import _validate


def generate(model, params, prompt_ids, max_tokens: int = 100,
             temperature: float = 1.0, top_k: int | None = None,
             seed: int = 0, stop_id: int | None = None) -> list[int]:
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
  step = _sampler(model, seq_len, float(temperature), top_k)
  key = jax.random.key(seed)
  out = []
  for i in range(max_tokens):
    window = (ids + out)[-seq_len:]
    padded = np.zeros((1, seq_len), np.int32)
    padded[0, :len(window)] = window
    token = int(step(params, padded, len(window), jax.random.fold_in(key, i)))
    out.append(token)
    if token == stop_id:
      break
  return out


def _sampler(model, seq_len: int, temperature: float, top_k: int | None):
  @jax.jit
  def step(params, tokens_1xT, length, key):
    logits_V = model.apply(params, tokens_1xT)[0, length - 1].astype(
        jnp.float32)
    if temperature == 0:
      return jnp.argmax(logits_V)
    logits_V = logits_V / temperature
    if top_k is not None:
      kth = jax.lax.top_k(logits_V, top_k)[0][-1]
      logits_V = jnp.where(logits_V < kth, -jnp.inf, logits_V)
    return jax.random.categorical(key, logits_V)
  return step

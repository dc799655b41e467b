"""FLOPs per trained token of a model: what the simulated clock charges for
compute and what ``lowbw bench`` divides by for MFU."""

from lowbw.models import _gpt


def flops_per_token(model, num_params: int, seq_len: int | None) -> float:
  """A :func:`~lowbw.models.gpt`'s exact matmul FLOPs per token, forward
  and backward (:func:`~lowbw.models.gpt_flops_per_token`, attention and a
  tied head included); ``6 * num_params`` for any other model (the usual
  estimate: 2 per parameter forward, 4 backward), unless the model's
  config gives its own ``flops_per_token`` (a wrapped model's, e.g.
  :func:`~lowbw.models.from_nnx`'s)."""
  given = getattr(model, "config", None)
  if isinstance(given, dict) and given.get("flops_per_token"):
    return float(given["flops_per_token"])
  if getattr(model, "name", None) == "gpt" and isinstance(
      getattr(model, "config", None), dict) and model.config.get(
          "name") == "gpt":
    return float(_gpt.flops_per_token(model.config, seq_len))
  return 6.0 * num_params

"""Datasets and their sharding over W virtual workers.

A factory (``digits``, ``text_bytes``, ``arrays``, ``token_file``) returns a
``DataSource`` in host memory; ``DataSource.build(num_workers, batch_size,
seed)`` shards it and returns a ``WorkerSampler``, a pytree whose
``sample(key, step)`` draws every worker's batch inside jit.

Example:
  >>> import jax
  >>> from lowbw import data
  >>> sampler = data.get("digits", sharding="dirichlet", alpha=1.0).build(
  ...     num_workers=4, batch_size=8, seed=0)
  >>> sampler.sample(jax.random.key(0), 0)["y"].shape
  (4, 8)
"""

from collections.abc import Callable

from lowbw import _validate
from lowbw.data._arrays import arrays
from lowbw.data._arrays import token_file
from lowbw.data._clients import ClientSampler
from lowbw.data._clients import available_clients
from lowbw.data._clients import client_sampler
from lowbw.data._clients import client_shards
from lowbw.data._clients import read_availability
from lowbw.data._clients import round_clients
from lowbw.data._digits import digits
from lowbw.data._images import cifar10
from lowbw.data._images import cifar10_arrays
from lowbw.data._images import fashion_mnist
from lowbw.data._images import mnist
from lowbw.data._images import mnist_arrays
from lowbw.data._images import read_idx
from lowbw.data._per_worker import per_worker
from lowbw.data._prepare import RECIPES
from lowbw.data._prepare import prepare
from lowbw.data._prepared import prepared
from lowbw.data._sampler import WorkerSampler
from lowbw.data._source import DataSource
from lowbw.data._text import text_bytes

_REGISTRY: dict[str, Callable[..., DataSource]] = {
    "digits": digits,
    "text": text_bytes,
    "arrays": arrays,
    "tokens": token_file,
    "prepared": prepared,
    "mnist": mnist,
    "fashion_mnist": fashion_mnist,
    "cifar10": cifar10,
    "per_worker": per_worker,
}
# Sources record their factory's own name in `config["name"]`; accepting it
# too lets `get(**source.config)` rebuild a source.
_ALIASES = {"text_bytes": "text", "token_file": "tokens"}


def names() -> tuple[str, ...]:
  """The dataset names ``get`` accepts (the CLI's ``--data`` choices)."""
  return tuple(_REGISTRY)


def get(name: str, **kwargs) -> DataSource:
  """Builds a dataset by name: the CLI's ``--data``.

  Args:
    name: ``"digits"``, ``"text"`` (``text_bytes``), ``"arrays"`` or
      ``"tokens"`` (``token_file``); the factory names also work.
    **kwargs: passed to the factory.

  Returns:
    The factory's ``DataSource``.

  Example:
    >>> from lowbw import data
    >>> source = data.get("text", seq_len=32)
    >>> data.get(**source.config).seq_len
    32
  """
  key = _ALIASES.get(name, name)
  if key not in _REGISTRY:
    raise _validate.fail("data", name, "expected one of " + ", ".join(
        map(repr, _REGISTRY)))
  return _REGISTRY[key](**kwargs)


__all__ = [
    "ClientSampler",
    "DataSource",
    "RECIPES",
    "WorkerSampler",
    "arrays",
    "available_clients",
    "cifar10",
    "cifar10_arrays",
    "client_sampler",
    "client_shards",
    "digits",
    "fashion_mnist",
    "get",
    "mnist",
    "mnist_arrays",
    "names",
    "per_worker",
    "prepare",
    "prepared",
    "read_availability",
    "read_idx",
    "round_clients",
    "text_bytes",
    "token_file",
]

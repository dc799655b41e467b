"""Codecs from short text specs, as the CLI's ``--codec`` takes them.

A spec is a comma-separated chain of stages (``"topk:0.1,quant:4"`` is
``top_k(0.1) | quantize(4)``):

  topk:F[:chunk=N]   top_k(F), of the whole tensor or of each chunk of N
                     entries (``:block=N``: each block of at most N x N)
  randk:F            random_k(F)
  quant:B[:OPT...]   quantize(B); OPT: linear | statistical | muloco (the
                     MuLoCo authors' statistical grid) | stochastic | chunk=N
                     | sigmas=S (statistical bins over mean +- S sigma)
  sign               sign()
  lowrank:R          low_rank(R): PowerSGD's rank-R factors, warm-started
  int8[:chunk=N]     int8(N): INTELLECT-1's 8 bits over mean +- 6 sigma,
                     bin means decoded
  e3m0[:chunk=N]     e3m0(N): 4-bit floats, Streaming DiLoCo's format
  cast:T             cast(T); T: float32, bf16, fp16, fp8 (e4m3), e5m2
  dct[:CHUNK[:K]]    dct_top_k(CHUNK, K); defaults 64, 32
  none               no codec

Every codec's ``name`` is its spec, so ``parse_codec(c.name)`` rebuilds ``c``.
"""

import math
from collections.abc import Callable
from typing import NamedTuple

import jax

from lowbw import _validate
from lowbw.transforms._cast import cast
from lowbw.transforms._codec import Codec, payload_nbytes
from lowbw.transforms._dct import dct_top_k
from lowbw.transforms._lowrank import low_rank
from lowbw.transforms._quantize import e3m0, int8, quantize, sign
from lowbw.transforms._topk import random_k, top_k

# Specs that mean no codec: the values are sent as they are (float32).
UNCOMPRESSED = ("none", "float32", "fp32")


def parse_codec(spec: str, field: str = "codec") -> Codec | None:
  """The codec a spec names (None for ``"none"`` or ``"float32"``: the
  values as they are); errors name ``field``."""
  if not isinstance(spec, str) or not spec.strip():
    raise _validate.fail(field, spec, "expected a codec spec such as "
                         "'topk:0.1,quant:4'")
  if spec.strip().lower() in UNCOMPRESSED:
    return None
  codec = None
  for stage in spec.split(","):
    try:
      part = _stage(stage.strip())
    except _validate.ConfigError as e:  # a known stage with a bad value
      raise _validate.fail(field, spec, f"stage {stage.strip()!r}: {e}"
                           ) from None
    except ValueError as e:
      raise _validate.fail(field, spec, f"stage {stage.strip()!r}: {e}; "
                           "stages are " + ", ".join(forms())) from None
    codec = part if codec is None else _chain(codec, part, field, spec)
  return codec


def as_codec(field: str, value) -> Codec | None:
  """A codec from a ``Codec``, a spec string such as ``"topk:0.1,quant:4"``
  (``"none"``: None) or None: what a strategy's ``codec=`` accepts. Anything
  else is an error naming ``field``."""
  if value is None or isinstance(value, Codec):
    return value
  if isinstance(value, str):
    return parse_codec(value, field)
  raise _validate.fail(field, value, "expected a lowbw codec (lowbw.transforms"
                       ".top_k, quantize, ...), a codec spec such as "
                       "'topk:0.1,quant:4', or None")


def float32_excess(codec: Codec | None, tree) -> str | None:
  """A sentence when ``codec`` sends more bytes for ``tree`` (arrays or
  ``jax.ShapeDtypeStruct``s) than the tree's float32 values would, else None.

  Not an error: lossless settings (``topk:1``, a DCT keeping every
  coefficient) are useful references, and whether a codec pays off depends
  on the tensors' shapes (scales and indices cost more on small tensors).
  Callers that know the model show it as a warning.

  Example:
    >>> import numpy as np
    >>> w = {"w": np.zeros((64, 64), np.float32)}
    >>> float32_excess(parse_codec("topk:0.1"), w) is None
    True
    >>> float32_excess(parse_codec("topk:1"), w)[:40]
    'codec topk:1 sends 24,576 bytes per mess'
  """
  if codec is None:
    return None
  dense = 4 * sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(tree))
  sent = payload_nbytes(codec, tree)
  if sent <= dense:
    return None
  return (f"codec {codec.name} sends {sent:,} bytes per message for these "
          f"parameters, more than their {dense:,} bytes as float32")


def _chain(first, second, field, spec):
  try:
    return first | second
  except ValueError as e:
    raise _validate.fail(field, spec, str(e).split(": ", 1)[-1]) from None


def _e3m0(args):
  if args and not args[0].startswith("chunk="):
    raise ValueError(f"unknown e3m0 option {args[0]!r}")
  return e3m0(_integer(args[0][len("chunk="):]) if args else None)


class _Stage(NamedTuple):
  form: str        # as errors and ``lowbw train --help`` show it
  arity: tuple     # (fewest, most) arguments after the name
  build: Callable  # arguments -> Codec


# The grammar, once: a stage's name -> its form, arguments and codec.
STAGES = {
    "topk": _Stage("topk:F[:chunk=N|:block=N]", (1, 2), lambda a: top_k(
        _number(a[0]), **_options(a[1:], ("chunk", "block")))),
    "randk": _Stage("randk:F", (1, 1), lambda a: random_k(_number(a[0]))),
    "quant": _Stage("quant:BITS[:statistical[:muloco]][:stochastic]"
                    "[:sigmas=S][:chunk=N]", (1, 99), lambda a: _quantize(a)),
    "int8": _Stage("int8[:chunk=N]", (0, 1),
                   lambda a: int8(**_options(a, ("chunk",)))),
    "lowrank": _Stage("lowrank:R", (1, 1), lambda a: low_rank(_integer(a[0]))),
    "sign": _Stage("sign", (0, 0), lambda a: sign()),
    "e3m0": _Stage("e3m0[:chunk=N]", (0, 1), _e3m0),
    "cast": _Stage("cast:DTYPE (float32, bf16, fp16, fp8, e5m2)", (1, 1),
                   lambda a: cast(a[0])),
    "dct": _Stage("dct[:CHUNK[:K]]", (0, 2),
                  lambda a: dct_top_k(*[_integer(x) for x in a])),
}
_BUILT_IN = frozenset(STAGES)


def forms() -> tuple[str, ...]:
  """Every form a spec may take: the stages (a user's registered ones too)
  and no codec."""
  return (*(stage.form for stage in STAGES.values()), *UNCOMPRESSED[:2])


def register_codec(name: str, build, form: str | None = None,
                   arity: tuple[int, int] = (0, 0)) -> None:
  """Makes ``name`` a codec spec stage, as the built-in ones are: ``--codec
  NAME[:ARG...]`` on the command line, ``codec: NAME`` in a config file, a
  study's grid, and ``parse_codec`` in Python.

  Args:
    name: the stage's name (letters, digits, ``_``); not a built-in's.
    build: a ``Codec`` (a stage without arguments), or a function of the
      stage's arguments (a list of strings, ``"mine:4:x"`` -> ``["4",
      "x"]``) returning a ``Codec``. The codec's ``name`` should be the spec
      that rebuilds it, so a saved run's config repeats it.
    form: how help and errors show it (default: the name).
    arity: the fewest and most arguments it takes (default none).

  Example:
    >>> absmax8 = lowbw.transforms.make_codec("absmax8", encode, decode)
    >>> lowbw.transforms.register_codec("absmax8", absmax8)
    >>> lowbw.Config(codec="absmax8,cast:bf16")  # chains like a built-in
  """
  _validate.identifier("name", name, "codec stage")
  if name in _BUILT_IN or name in UNCOMPRESSED:
    raise _validate.fail("name", name, "is a built-in codec stage")
  if isinstance(build, Codec):
    codec, build = build, (lambda args, codec=build: codec)
  elif not callable(build):
    raise _validate.fail("build", build, "expected a Codec or a function "
                         "of the stage's arguments returning one")
  STAGES[name] = _Stage(form or name, tuple(arity), build)


def _stage(stage: str) -> Codec:
  name, *args = stage.split(":")
  entry = STAGES.get(name.lower())
  if entry is None or not entry.arity[0] <= len(args) <= entry.arity[1]:
    raise ValueError("unknown stage or wrong number of arguments")
  return entry.build(args)


def _quantize(args):
  kwargs = {"scheme": "linear", "stochastic": False, "chunk": None}
  for opt in args[1:]:
    if opt in ("linear", "statistical"):
      kwargs["scheme"] = opt
    elif opt == "muloco":
      kwargs["grid"] = "muloco"
    elif opt == "stochastic":
      kwargs["stochastic"] = True
    elif opt.startswith("chunk="):
      kwargs["chunk"] = _integer(opt[len("chunk="):])
    elif opt.startswith("sigmas="):
      kwargs["sigmas"] = _number(opt[len("sigmas="):])
    else:
      raise ValueError(f"unknown quant option {opt!r}")
  return quantize(_integer(args[0]), **kwargs)


def _options(args, allowed):
  """``{"chunk": 64}`` from ``["chunk=64"]``: integer options by name."""
  out = {}
  for arg in args:
    name, _, value = arg.partition("=")
    if name not in allowed or not value:
      raise ValueError(f"unknown option {arg!r} (options: " + ", ".join(
          f"{a}=N" for a in allowed) + ")")
    out[name] = _integer(value)
  return out


def _number(text):
  try:
    return float(text)
  except ValueError:
    raise ValueError(f"{text!r} is not a number") from None


def _integer(text):
  try:
    return int(text)
  except ValueError:
    raise ValueError(f"{text!r} is not an integer") from None

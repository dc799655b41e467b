"""The keyword options of ``lowbw.simulate`` and ``lowbw.build``, read from
the functions that take them instead of being typed again.

``check_settings``'s signature is the one list of build settings and
``Simulator.run``'s the one list of run options; ``build`` and ``simulate``
take ``**options`` and show (``help()``, ``inspect.signature``) the
signature composed from those, so a new option is written once, where it is
checked.
"""

import inspect

from lowbw import _validate


def keywords(function, skip=()) -> dict[str, inspect.Parameter]:
  """``function``'s parameters that may be given by keyword (not ``self``,
  ``*args``/``**kwargs`` or ``skip``), keyword-only."""
  out = {}
  for name, p in inspect.signature(function).parameters.items():
    if name in ("self", *skip) or p.kind in (p.VAR_POSITIONAL,
                                              p.VAR_KEYWORD):
      continue
    out[name] = p.replace(kind=p.KEYWORD_ONLY)
  return out


def compose(function, *sources: dict[str, inspect.Parameter]):
  """Sets ``function.__signature__``: its own positional parameters, then
  the keyword parameters of ``sources`` in order, then its own keyword-only
  ones; its return annotation."""
  own = inspect.signature(function)
  positional = [p for p in own.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
  keyword = {}
  for source in sources:
    keyword.update(source)
  keyword.update((n, p) for n, p in own.parameters.items()
                 if p.kind == p.KEYWORD_ONLY)
  for p in positional:  # a source's own positional ones (build's model)
    keyword.pop(p.name, None)
  function.__signature__ = own.replace(
      parameters=[*positional, *keyword.values()])
  return function


def check(what: str, options: dict, allowed) -> None:
  """A TypeError, as Python gives for an unknown keyword, with the nearest
  allowed names."""
  for name in options:
    if name not in allowed:
      raise TypeError(f"{what}() got an unexpected keyword argument "
                      f"{name!r}{_validate.suggest(name, list(allowed))}")


def split(options: dict, names) -> tuple[dict, dict]:
  """``options`` in two: those named in ``names`` and the others."""
  mine = {k: v for k, v in options.items() if k in names}
  return mine, {k: v for k, v in options.items() if k not in names}

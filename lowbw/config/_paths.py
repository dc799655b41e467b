"""Every setting by its path in the run's parts (``strategy.H``,
``strategy.outer.lr``, ``network.bandwidth``, ``model.layers``), derived
from the fields and the strategies' specs; the short flat names stay the
settings' own. A config file may nest the parts too::

  strategy: {name: diloco, H: 50, outer: {kind: adam, lr: 0.01}}
  network: {bandwidth: 100Mbps}
"""

from lowbw import strategies as strategies_lib
from lowbw.config import _fields

# The parts a nested table may describe; "name" (or "kind") is the choice.
PARTS = ("strategy", "network", "model", "data", "inner", "outer")
# The data's settings: the data and sharding choices' own (``USED_BY``).
_DATA = {"sharding", *(name for owner in ("data", "sharding")
                       for names in _fields.USED_BY[owner].values()
                       for name in names)}


def _optimizers(fields: dict) -> dict[str, str]:
  """inner.* and outer.* (and their further outer optimizers)."""
  out = {"inner.kind": "inner", "inner.lr": "inner_lr",
         "outer.kind": "outer"}
  for name, f in fields.items():
    if f.group != "optimizers" or name in ("inner", "inner_lr", "outer"):
      continue
    if name.startswith("outer_"):
      out["outer." + name[len("outer_"):]] = name
    elif any(name.startswith(o + "_") for o in _extra_outer()):
      owner = next(o for o in _extra_outer() if name.startswith(o + "_"))
      out[owner + "." + name[len(owner) + 1:]] = name
    else:
      out["inner." + name] = name
  return out


def _extra_outer() -> list[str]:
  return sorted({o for s in strategies_lib.SPECS.values()
                 for o in s.optimizers})


def paths(fields: dict) -> dict[str, str]:
  """path -> the setting's flat name, for every setting a part owns."""
  out = {"strategy.name": "strategy", "model.name": "model",
         "data.name": "data"}
  for name, f in fields.items():
    if f.python:
      continue
    if f.group in ("strategy", "compression") and name not in (
        "strategy", "workers"):
      out["strategy." + name] = name
    elif f.group == _fields.NETWORK_GROUP:
      out["network." + name] = name
    elif f.group == "model and data" and name not in ("model", "data"):
      out[("data." if name in _DATA else "model.") + name] = name
  out["model.seq_len"] = "seq_len"  # the context of the model, the window
  for spec in strategies_lib.SPECS.values():  # a factory's own keywords
    for p in spec.params:
      if p.flag is not None and p.flag in fields:
        out["strategy." + p.name] = p.flag
  for path, name in _optimizers(fields).items():
    out[path] = out["strategy." + path] = name
  return out


def flatten(values: dict, prefix: str = "") -> dict:
  """``values`` with nested tables of parts made paths: ``{"strategy":
  {"name": "diloco", "H": 50}}`` -> ``{"strategy.name": "diloco",
  "strategy.H": 50}``; other values as they are."""
  out = {}
  for key, value in values.items():
    path = f"{prefix}{key}"
    head = str(key).replace("-", "_").split(".")[-1]
    if isinstance(value, dict) and (prefix or head in PARTS):
      out.update(flatten(value, path + "."))
    else:
      out[path] = value
  return out

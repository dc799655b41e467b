"""Your own codecs, models and strategies, reachable like the built-in ones.

``LOWBW_PLUGINS`` names modules (``mypkg.lowbw_parts``) or Python files
(``./my_parts.py``), comma-separated, that ``import lowbw`` imports before
it makes its settings' table: a module that registers a codec
(``lowbw.transforms.register_codec``), a model (``lowbw.models.register``)
or a strategy (``lowbw.strategies.register``) there makes it a name that
``lowbw.Config``, config files, ``lowbw train``, ``lowbw sweep`` and a
study's processes all accept (they inherit the variable).
"""

import importlib
import importlib.util
import os
import sys

from lowbw import _validate

VARIABLE = "LOWBW_PLUGINS"


def load(text: str | None = None) -> list[str]:
  """Imports the modules ``text`` (default: ``$LOWBW_PLUGINS``) names; a
  module or file that fails to import is one ConfigError naming the
  variable, the entry and the import's own error."""
  text = os.environ.get(VARIABLE, "") if text is None else text
  loaded = []
  for entry in (e.strip() for e in text.split(",")):
    if entry:
      _import(entry)
      loaded.append(entry)
  return loaded


def _import(entry: str) -> None:
  try:
    if entry.endswith(".py"):
      name = "lowbw_plugin_" + os.path.splitext(os.path.basename(entry))[0]
      spec = importlib.util.spec_from_file_location(name, entry)
      if spec is None or not os.path.isfile(entry):
        raise FileNotFoundError(f"no such file: {entry}")
      module = importlib.util.module_from_spec(spec)
      sys.modules[name] = module
      spec.loader.exec_module(module)
    else:
      importlib.import_module(entry)
  except _validate.ConfigError:
    raise  # a registration refused: it names its own field
  except Exception as e:  # pylint: disable=broad-except
    raise _validate.fail(VARIABLE, entry, "could not be imported (a module "
                         "name or a .py file): " + f"{type(e).__name__}: {e}"
                         ) from None

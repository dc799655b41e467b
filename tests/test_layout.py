"""The package layout: a package reads another only through its public names.

A module may import its own package's private modules (``_clock`` inside
``lowbw/network/``) and the shared ``lowbw._validate``; from any other
package it takes what that package's ``__init__`` exports, so a package's
insides can change without breaking its neighbours.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "lowbw"
SHARED = {"_validate", "_random", "_types", "__version__"}


def _package(path: pathlib.Path) -> str | None:
  parts = path.relative_to(ROOT).parts
  return parts[0] if len(parts) > 1 else None


def _imports(tree):
  """(line, module parts, imported names) of every ``lowbw`` import."""
  for node in ast.walk(tree):
    if (isinstance(node, ast.ImportFrom) and node.module and
        node.module.split(".")[0] == "lowbw"):
      yield node.lineno, node.module.split("."), [a.name for a in node.names]
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split(".")[0] == "lowbw":
          yield node.lineno, alias.name.split("."), []


def _private_reach(path: pathlib.Path, tree) -> list[str]:
  own = _package(path)
  found = []
  for line, parts, names in _imports(tree):
    target = parts[1] if len(parts) > 1 else None
    if target == own or target in SHARED:
      continue
    private = [p for p in parts[2:] if p.startswith("_")]
    private += [n for n in names if n.startswith("_") and n not in SHARED]
    if private:
      found.append(f"{path.relative_to(ROOT.parent)}:{line} imports "
                   f"{'.'.join(parts)} {private}")
  for node in ast.walk(tree):  # network_lib._units.count and the like
    if (isinstance(node, ast.Attribute) and node.attr.startswith("_") and
        not node.attr.startswith("__") and isinstance(node.value, ast.Name)
        and node.value.id.endswith("_lib")):
      found.append(f"{path.relative_to(ROOT.parent)}:{node.lineno} reads "
                   f"{node.value.id}.{node.attr}")
  return found


def test_no_module_reaches_into_another_packages_private_modules():
  found = []
  for path in sorted(ROOT.rglob("*.py")):
    found += _private_reach(path, ast.parse(path.read_text()))
  assert not found, "\n".join(found)


def test_the_check_sees_a_private_import():
  tree = ast.parse("from lowbw.network import _clock\n"
                   "from lowbw.simulation._simulator import build\n"
                   "x = network_lib._units.count\n")
  found = _private_reach(ROOT / "cli" / "_train.py", tree)
  assert len(found) == 3
  own = ast.parse("from lowbw.cli import _plot\n")
  assert not _private_reach(ROOT / "cli" / "_train.py", own)

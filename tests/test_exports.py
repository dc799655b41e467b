"""What lowbw and its subpackages export is documented: every name in an
``__all__`` has a docstring (functions and classes) and is named in
README.md or docs/ (a name lowbw re-exports, ``lowbw.simulate``, is named
as lowbw's).

A package exports what users use (README.md, docs/, examples/,
experiments/, benchmarks/); what only lowbw's own packages read stays in
the private module that defines it (see ``INTERNAL`` in test_layout.py).
``ENGINE`` lists the names other packages keep exporting only because a
module of lowbw/config, lowbw/simulation or lowbw's own ``__init__`` still
reads them through the package; the last test drops a name from it as soon
as nothing there does.
"""

import ast
import importlib
import inspect
import pathlib
import re

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGES = ("strategies", "transforms", "network", "models", "data",
            "telemetry", "studies", "config", "simulation")

# Read through the package by the engine (see above).
ENGINE: dict[str, set[str]] = {}


def _docs() -> str:
  files = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
  return "\n".join(f.read_text() for f in files)


def _code(text: str) -> str:
  """The fenced blocks and inline code spans of markdown ``text``."""
  blocks = re.findall(r"```.*?```", text, flags=re.S)
  rest = re.sub(r"```.*?```", "", text, flags=re.S)
  return "\n".join(blocks + re.findall(r"`[^`\n]+`", rest))


def named(package: str, name: str, text: str) -> bool:
  """The docs name ``package.name`` in code, import it from the package,
  or open a code span with it (a table row's `` `top_k(fraction)` ``): a
  word in prose ("count", "axis") does not count."""
  code = _code(text)
  word = re.escape(name)
  return bool(
      re.search(rf"\b{package}\.{word}\b", code) or
      re.search(rf"`{word}\b", text) or
      re.search(rf"from lowbw\.{package} import[^\n]*\b{word}\b", code))


def _documented(obj, name: str) -> bool:
  """A docstring of its own: NamedTuples and dataclasses without one get a
  generated ``Name(field, ...)``, which says nothing."""
  doc = (obj.__doc__ or "").strip()
  return bool(doc) and not doc.startswith(name + "(")


def _exports():
  """(package, name, object) of every exported name; lowbw's own under the
  package ``lowbw``."""
  for package in ("lowbw", *PACKAGES):
    module = importlib.import_module(
        "lowbw" if package == "lowbw" else f"lowbw.{package}")
    for name in module.__all__:
      yield package, name, getattr(module, name)


def _named_or_reexported(package: str, name: str, obj, text: str) -> bool:
  """Named as the package's, or as lowbw's when lowbw re-exports the same
  object (the docs say ``lowbw.load``, not ``lowbw.simulation.load``)."""
  lowbw = importlib.import_module("lowbw")
  return named(package, name, text) or (
      package != "lowbw" and getattr(lowbw, name, None) is obj and
      named("lowbw", name, text))


@pytest.fixture(scope="module")
def docs() -> str:
  return _docs()


def test_every_exported_name_is_named_in_the_docs(docs):
  missing = [f"lowbw.{p}.{n}" for p, n, obj in _exports()
             if not _named_or_reexported(p, n, obj, docs) and
             n not in ENGINE.get(p, ())]
  assert not missing, ("exported but named nowhere in README.md or docs/ "
                       "(document it, or stop exporting it): " +
                       ", ".join(missing))


def test_every_exported_function_and_class_has_a_docstring():
  missing = [f"lowbw.{p}.{n}" for p, n, obj in _exports()
             if (inspect.isfunction(obj) or inspect.isclass(obj)) and
             not _documented(obj, n)]
  assert not missing, "no docstring: " + ", ".join(missing)


def test_the_checks_see_what_is_missing():
  text = ("Use `top_k(0.01)` or `strategies.get`.\n"
          "```python\nfrom lowbw.network import plan, link\n```\n"
          "The count of workers.\n")
  assert named("transforms", "top_k", text)
  assert named("strategies", "get", text)
  assert named("network", "link", text)
  assert not named("network", "count", text)  # prose only
  assert not named("transforms", "get", text)  # another package's get
  assert not named("network", "li", text)

  class Bare:
    pass

  def bare():
    pass

  assert not _documented(Bare, "Bare") and not _documented(bare, "bare")
  assert _documented(_documented, "_documented")
  # lowbw's name for the same object counts; another object of that name
  # (lowbw.load is the simulation's, not the studies') does not.
  lowbw = importlib.import_module("lowbw")
  text = "Read a run back with `lowbw.load(DIR)`.\n"
  assert _named_or_reexported("simulation", "load", lowbw.load, text)
  studies = importlib.import_module("lowbw.studies")
  assert not _named_or_reexported("studies", "load", studies.load, text)
  assert not _named_or_reexported("simulation", "load", lowbw.load, "")


def _engine_reads() -> set[tuple[str, str]]:
  """(package, name) pairs lowbw/config, lowbw/simulation and lowbw's
  ``__init__`` read through a package's public namespace (``from lowbw.data
  import x``, ``data_lib.x``)."""
  paths = [ROOT / "lowbw" / "__init__.py"]
  for folder in ("config", "simulation"):
    paths += sorted((ROOT / "lowbw" / folder).glob("*.py"))
  found = set()
  for path in paths:
    found |= _public_reads(ast.parse(path.read_text()))
  return found


def _public_reads(tree) -> set[tuple[str, str]]:
  aliases, found = {}, set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module:
      parts = node.module.split(".")
      for a in node.names:
        if node.module == "lowbw" and a.name in PACKAGES:
          aliases[a.asname or a.name] = a.name
        elif len(parts) == 2 and parts[0] == "lowbw" and parts[1] in PACKAGES:
          found.add((parts[1], a.name))
  for node in ast.walk(tree):
    if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
        and node.value.id in aliases):
      found.add((aliases[node.value.id], node.attr))
  return found


def test_public_reads_sees_imports_and_aliases():
  tree = ast.parse("from lowbw.network import tiers_of\n"
                   "from lowbw import data as data_lib\n"
                   "from lowbw.data._tokenizer import BPE\n"
                   "x = data_lib.get('digits')\n")
  assert _public_reads(tree) == {("network", "tiers_of"), ("data", "get")}


def test_engine_names_are_still_read_by_the_engine():
  reads = _engine_reads()
  stale = [f"lowbw.{p}.{n}" for p, names in ENGINE.items() for n in names
           if (p, n) not in reads]
  assert not stale, ("lowbw/config and lowbw/simulation no longer read "
                     "these through the package: drop them from ENGINE and "
                     "from the package's __all__: " + ", ".join(stale))

"""No import circle between lowbw's modules.

A circle makes a module's names depend on which of the two was imported
first, and it is usually hidden by an import inside a function; so imports
inside functions count here as much as those at the top of a module.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "lowbw"

def _sources() -> dict[str, str]:
  """Module name -> source of every module under ``lowbw/``."""
  found = {}
  for path in ROOT.rglob("*.py"):
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    if parts[-1] == "__init__":
      parts = parts[:-1]
    found[".".join(parts)] = path.read_text()
  return found


def _targets(node, modules) -> list[str]:
  """The lowbw modules an import statement names: ``from p import m``
  names module ``p.m`` when it is one, else package ``p``."""
  if isinstance(node, ast.Import):
    return [a.name for a in node.names if a.name in modules]
  if not isinstance(node, ast.ImportFrom) or not node.module or node.level:
    return []
  subs = [f"{node.module}.{a.name}" for a in node.names]
  named = [m for m in subs if m in modules]
  if len(named) < len(subs) and node.module in modules:
    named.append(node.module)  # names taken from the package itself
  return named


def import_graph(sources: dict[str, str]) -> dict[str, set[str]]:
  """Module -> the lowbw modules it imports, anywhere in its source. A
  module's own packages are left out: their ``__init__`` is the package's
  face, which imports its modules to re-export them."""
  return {name: {t for node in ast.walk(ast.parse(src))
                 for t in _targets(node, sources)
                 if t != name and not name.startswith(t + ".")}
          for name, src in sources.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
  """The strongly connected components of more than one module (Tarjan)."""
  index, low, stack, on, found = {}, {}, [], set(), []

  def visit(v):
    index[v] = low[v] = len(index)
    stack.append(v)
    on.add(v)
    for w in sorted(graph[v]):
      if w not in index:
        visit(w)
        low[v] = min(low[v], low[w])
      elif w in on:
        low[v] = min(low[v], index[w])
    if low[v] == index[v]:
      component = []
      while True:
        w = stack.pop()
        on.discard(w)
        component.append(w)
        if w == v:
          break
      if len(component) > 1:
        found.append(sorted(component))

  for v in sorted(graph):
    if v not in index:
      visit(v)
  return found


def test_no_import_circle_between_lowbws_modules():
  found = circles(import_graph(_sources()))
  assert not found, "import circles:\n" + "\n".join(" <-> ".join(c)
                                                    for c in found)


def test_the_check_sees_a_circle_hidden_inside_a_function():
  sources = {
      "lowbw.p": "",
      "lowbw.p._a": "from lowbw.p._b import B\nA = 1\n",
      "lowbw.p._b": "def f():\n  from lowbw.p import _a\n  return _a.A\n",
      "lowbw.p._c": "from lowbw.p import _a\n",
      "lowbw.q": "from lowbw.p import thing\n",
      "lowbw.p._d": "from lowbw.p import thing\n",  # its package's face
  }
  graph = import_graph(sources)
  assert graph["lowbw.p._b"] == {"lowbw.p._a"}
  assert graph["lowbw.q"] == {"lowbw.p"}
  assert graph["lowbw.p._d"] == set()
  assert circles(graph) == [["lowbw.p._a", "lowbw.p._b"]]

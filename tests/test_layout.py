"""The package layout: a package reads another only through its public names.

A module may import its own package's private modules (``_clock`` inside
``lowbw/network/``) and the shared ``lowbw._validate``; from any other
package it takes what that package's ``__init__`` exports, so a package's
insides can change without breaking its neighbours. The exports are what
users use (tests/test_exports.py); where the engine needs a piece no user
does, the crossing is named below in ``INTERNAL``, one pair per line.
"""

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent / "lowbw"
SHARED = {"_validate", "_random", "_types", "__version__"}

# (the package or module that reads, the private module it may read): the
# engine's own parts meet here instead of in the packages' public names.
INTERNAL = {
    ("lowbw/cli", "lowbw.network._planner"),  # lowbw plan's flags and units
    ("lowbw/cli", "lowbw.network._units"),  # and its per-link lists
    ("lowbw/cli", "lowbw.network._calibrate"),  # lowbw calibrate's fit
    ("lowbw/cli", "lowbw.network._profile"),  # and the profile it writes
    ("lowbw/cli", "lowbw.telemetry._axes"),  # lowbw plot's axes and scales
    # What the process is busy with (a compile): the engine says, the
    # command line's heartbeat prints it.
    ("lowbw/cli", "lowbw.telemetry._activity"),
    ("lowbw/simulation", "lowbw.telemetry._activity"),
    ("lowbw/cli", "lowbw.studies._fit"),  # lowbw fit's forms and defaults
    ("lowbw/cli", "lowbw.studies._advise"),  # lowbw advise's probe defaults
    # A strategy's message path: residuals, byte counts and aggregation
    # (_compression), its worker count (_reductions), robust means
    # (_robust), SPARTA's index sets (_sparse), DeMo's DCT (_dct) and a
    # codec's check (_codec): pieces no user composes.
    ("lowbw/strategies", "lowbw.transforms._codec"),
    ("lowbw/strategies", "lowbw.transforms._compression"),
    ("lowbw/strategies", "lowbw.transforms._dct"),
    ("lowbw/strategies", "lowbw.transforms._reductions"),
    ("lowbw/strategies", "lowbw.transforms._robust"),
    ("lowbw/strategies", "lowbw.transforms._sparse"),
    # The workers' gradient axis carries per_worker's name, so that a mixed
    # fleet's boundary codecs know their worker (transforms.pipeline_worker).
    ("lowbw/simulation", "lowbw.transforms._codec"),
    ("lowbw/studies", "lowbw.telemetry._axes"),  # a study's plots: the same
    ("lowbw/studies", "lowbw.telemetry._writers"),  # tables written atomically
    # The engine builds what a Config checked: its build settings (RunConfig,
    # _settings), the settings' table (_config) and the data and model the
    # config names (_resolve).
    ("lowbw/simulation", "lowbw.config._config"),
    ("lowbw/simulation", "lowbw.config._resolve"),
    ("lowbw/simulation", "lowbw.config._settings"),
    ("lowbw/simulation", "lowbw.config._resources"),  # the memory budget
    # The command line is the settings' table: its fields, groups and names
    # (_config), a field's flag (_fields), config and grid files (_files),
    # the lanes' field (_lanes),
    # lowbw bench's builds (_resolve, _settings, _strategy_fields); it runs a
    # Config and prepares its folder as lowbw.study does (_api, _logdir).
    ("lowbw/cli", "lowbw.config._config"),
    ("lowbw/cli", "lowbw.config._fields"),
    ("lowbw/cli", "lowbw.config._files"),
    ("lowbw/cli", "lowbw.config._lanes"),
    ("lowbw/cli", "lowbw.config._resolve"),
    ("lowbw/cli", "lowbw.config._settings"),
    ("lowbw/cli", "lowbw.config._strategy_fields"),
    ("lowbw/cli", "lowbw.simulation._api"),
    ("lowbw/cli", "lowbw.simulation._logdir"),
    ("lowbw/cli", "lowbw.simulation._startup"),  # --compile-effort's values
    # A study expands a grid over the table's fields (_config, _fields, the
    # strategies' traced ones in _strategy_fields), checks each point's build
    # (_settings) and runs a group's points on one build (_api, _sweep) in
    # folders it prepares (_logdir).
    ("lowbw/studies", "lowbw.config._config"),
    ("lowbw/studies", "lowbw.config._fields"),
    ("lowbw/studies", "lowbw.config._strategy_fields"),
    ("lowbw/studies", "lowbw.simulation._api"),
    ("lowbw/studies", "lowbw.simulation._logdir"),
    ("lowbw/studies", "lowbw.simulation._sweep"),
    # A point that differs from another only in its clock is re-timed from
    # that one's ledger (_ledger: the file) and priced (_cost).
    ("lowbw/studies", "lowbw.simulation._ledger"),
    ("lowbw/studies", "lowbw.telemetry._cost"),
    # advise reads a time to a target loss where the token efficiency reads
    # its lane's crossing: one interpolation (_track.crossing).
    ("lowbw/studies", "lowbw.simulation._track"),
    # A run's cost: the price settings' rule and the summary's figures, one
    # module that the settings, the run's summary, the planner and their
    # commands read.
    ("lowbw/cli", "lowbw.telemetry._cost"),
    ("lowbw/config", "lowbw.telemetry._cost"),
    ("lowbw/network", "lowbw.telemetry._cost"),
    ("lowbw/simulation", "lowbw.telemetry._cost"),
    # lowbw bench times the compiled round against a plain replica: the
    # engine's backward pass, worker map, mesh specs and worker casts.
    ("lowbw/bench.py", "lowbw.simulation._backward"),
    ("lowbw/bench.py", "lowbw.simulation._engine"),
    ("lowbw/bench.py", "lowbw.simulation._mesh"),
    ("lowbw/bench.py", "lowbw.simulation._precision"),
    # The settings' table is made from the strategies' optimizer kinds and
    # schedules (_optim, _schedule) and a strategy's codec settings (_spec).
    ("lowbw/config", "lowbw.strategies._optim"),
    ("lowbw/config", "lowbw.strategies._schedule"),
    ("lowbw/config", "lowbw.strategies._spec"),
    # The engine traces outer schedules (_schedule) and writes a strategy's
    # description and empty report (_base).
    ("lowbw/simulation", "lowbw.strategies._base"),
    ("lowbw/simulation", "lowbw.strategies._schedule"),
    # The simulated clock's pure functions (_clock), the topology a traced
    # link rebuilds (_topology), the tiers of the wire bytes (_collectives);
    # the build's check of a network and of its fault windows.
    ("lowbw/config", "lowbw.network._clock"),
    ("lowbw/config", "lowbw.network._faults"),
    ("lowbw/config", "lowbw.network._units"),  # per-link lists of a field
    ("lowbw/simulation", "lowbw.network._clock"),
    ("lowbw/simulation", "lowbw.network._collectives"),
    ("lowbw/simulation", "lowbw.network._topology"),
    # Which reader a data folder takes (_images, _prepared); a saved run's
    # tokenizer (_tokenizer).
    ("lowbw/config", "lowbw.data._images"),
    ("lowbw/config", "lowbw.data._prepared"),
    ("lowbw/simulation", "lowbw.data._tokenizer"),
    # A run's files: its tables and writers (_writers), parameters
    # (_params), checkpoints (_checkpoint), the metrics' names (_metrics),
    # the progress bar (_progress) and the start-up seconds (_startup).
    ("lowbw/simulation", "lowbw.telemetry._checkpoint"),
    ("lowbw/simulation", "lowbw.telemetry._metrics"),
    ("lowbw/simulation", "lowbw.telemetry._params"),
    ("lowbw/simulation", "lowbw.telemetry._progress"),
    ("lowbw/simulation", "lowbw.telemetry._startup"),
    ("lowbw/simulation", "lowbw.telemetry._writers"),
    # The round's device-wide reductions (_reductions: any worker flagged,
    # this device's first worker, the mean over devices) and its Byzantine
    # and weighted means (_robust).
    ("lowbw/simulation", "lowbw.transforms._reductions"),
    ("lowbw/simulation", "lowbw.transforms._robust"),
    ("lowbw/cli", "lowbw.telemetry._metrics"),  # lowbw train's columns
    ("lowbw/cli", "lowbw.telemetry._progress"),  # a bar on a terminal only
    ("lowbw/studies", "lowbw.telemetry._progress"),  # the same
    # import lowbw marks the process's age once its modules are imported.
    ("lowbw/__init__.py", "lowbw.telemetry._startup"),
    # A config's pipeline: the model cut into stages, and the stage links'
    # traces read as the run's own link traces are.
    ("lowbw/config", "lowbw.models._stages"),
    ("lowbw/config", "lowbw.network._trace"),
    # Re-timing on other stage links parses them as the config does.
    ("lowbw/simulation", "lowbw.network._units"),
    # A study groups points a traced H can share: the settings the host
    # keeps per H, and whether a point has fault masks.
    ("lowbw/studies", "lowbw.config._checks"),
    ("lowbw/studies", "lowbw.simulation._periods"),
    ("lowbw/studies", "lowbw.simulation._density"),
    ("lowbw/studies", "lowbw.simulation._bits"),
    ("lowbw/simulation", "lowbw.transforms._topk"),  # a traced density
    ("lowbw/simulation", "lowbw.transforms._quantize"),  # a traced width
}


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


def _reader(path: pathlib.Path) -> str:
  """``lowbw/strategies`` for a module of that package; the path of a
  module directly under ``lowbw/`` (``lowbw/bench.py``)."""
  parts = path.relative_to(ROOT.parent).parts
  return "/".join(parts[:2] if len(parts) > 2 else parts)


def _private_modules(parts: list[str], names: list[str]) -> list[str]:
  """``from lowbw.x import _y, _z`` reads ``lowbw.x._y`` and ``lowbw.x._z``
  (each a pair of its own); ``from lowbw.x._y import z`` reads
  ``lowbw.x._y``."""
  private = [n for n in names if n.startswith("_") and n not in SHARED]
  return [".".join(parts + [n]) for n in private] or [".".join(parts)]


def _private_reach(path: pathlib.Path, tree, internal=None) -> list[str]:
  own = _package(path)
  allowed = INTERNAL if internal is None else internal
  found = []
  for line, parts, names in _imports(tree):
    target = parts[1] if len(parts) > 1 else None
    if target == own or target in SHARED:
      continue
    for module in _private_modules(parts, names):
      private = [p for p in module.split(".")[2:] if p.startswith("_")]
      if private and (_reader(path), module) not in allowed:
        found.append(f"{path.relative_to(ROOT.parent)}:{line} imports "
                     f"{module}")
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


def test_internal_allows_only_the_named_pair():
  internal = {("lowbw/cli", "lowbw.network._units")}
  tree = ast.parse("from lowbw.network._units import count\n"
                   "from lowbw.network import _units\n")
  assert not _private_reach(ROOT / "cli" / "_train.py", tree, internal)
  assert len(_private_reach(ROOT / "studies" / "_run.py", tree, internal)) == 2
  other = ast.parse("from lowbw.network._clock import price\n")
  assert len(_private_reach(ROOT / "cli" / "_train.py", other, internal)) == 1
  # Two private modules in one import are two pairs: the first named does
  # not let the second through.
  both = ast.parse("from lowbw.network import _units, _clock\n")
  assert _private_reach(ROOT / "cli" / "_train.py", both, internal) == [
      "lowbw/cli/_train.py:1 imports lowbw.network._clock"]


def test_every_internal_pair_is_used():
  """A pair no module reads any more is dropped, so the table stays the
  list of crossings there are."""
  used = set()
  for path in sorted(ROOT.rglob("*.py")):
    for _, parts, names in _imports(ast.parse(path.read_text())):
      used.update((_reader(path), m) for m in _private_modules(parts, names))
  assert not set(INTERNAL) - used, sorted(set(INTERNAL) - used)


# ------------------------------------------- packages in layers
# (circles between modules: test_import_circles.py)
def _module(path: pathlib.Path) -> str:
  parts = path.relative_to(ROOT.parent).with_suffix("").parts
  return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _targets(parts: list[str], names: list[str]) -> list[str]:
  """The modules an import reads: ``from lowbw.x import _y`` reads the
  module (or package) ``lowbw.x._y`` when there is one, else ``lowbw.x``."""
  base = ".".join(parts)
  out = []
  for name in names or [None]:
    here = ROOT.parent.joinpath(*parts, name or "")
    found = name and (here.with_suffix(".py").exists() or here.is_dir())
    out.append(f"{base}.{name}" if found else base)
  return out


def _graph() -> dict[str, set[str]]:
  """module -> the lowbw modules it imports, anywhere in its text (an import
  inside a function closes a circle as surely as one at the top)."""
  graph = {}
  for path in sorted(ROOT.rglob("*.py")):
    edges = set()
    for _, parts, names in _imports(ast.parse(path.read_text())):
      edges.update(_targets(parts, names))
    graph[_module(path)] = edges - {_module(path)}
  return graph


def _circle(graph: dict[str, set[str]]) -> list[str] | None:
  """One circle of ``graph`` (a list of nodes, first = last), or None."""
  state = {}

  def visit(node, path):
    state[node] = 1
    for nxt in sorted(graph.get(node, ())):
      if state.get(nxt) == 1:
        return path[path.index(nxt):] + [nxt] if nxt in path else [node, nxt]
      if nxt not in state:
        found = visit(nxt, path + [nxt])
        if found:
          return found
    state[node] = 2
    return None

  for node in sorted(graph):
    if node not in state:
      found = visit(node, [node])
      if found:
        return found
  return None


def test_packages_import_each_other_in_layers():
  """Package A imports package B only if B never imports A, through any
  chain: the packages form layers."""
  graph = {}
  for module, edges in _graph().items():
    graph.setdefault(_layer(module), set()).update(
        _layer(t) for t in edges if _layer(t) != _layer(module))
  circle = _circle(graph)
  assert circle is None, "packages in a circle: " + " -> ".join(circle)


def test_the_circle_check_finds_a_circle():
  assert _circle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
  assert _circle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None


def _layer(module: str) -> str:
  """``lowbw.config._api`` -> ``config``; the shared low-level modules
  (``lowbw._validate``, ...) and ``lowbw`` itself are their own."""
  parts = module.split(".")
  return parts[1] if len(parts) > 1 else "lowbw"

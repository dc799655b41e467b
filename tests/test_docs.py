"""The user docs (README.md and docs/) run as written and stand alone.

Code blocks. Every fenced block of README.md and docs/**/*.md (not the
experiments' reports, which their scripts write) is one of:

- ```python: pasted alone into a fresh interpreter, it runs. A block that is a
  fragment (a signature, ``...`` for arguments, names from elsewhere on the
  page) carries the marker ``<!-- sketch -->`` on the line before its fence;
  a sketch only has to parse.
- ```bash / ```sh / ```console (``$ `` before each command): every ``lowbw``
  command parses with ``lowbw.cli.build_parser()`` (its subcommand, flags and
  choices exist), the cheap ones (``lowbw plan``, ``--help``) run, and a
  command that needs more than ``pip install -e '.[dev]'`` says so on its line
  (``REQUIREMENTS``). ``python <script>.py`` lines name a script that exists
  and flags it defines.
- anything else (output, formulas, trees): it holds no command or import, so
  nothing runnable hides from these checks.

The python blocks run in one subprocess, each in a fresh namespace (so a
missing import fails), from a temporary folder (what they write is thrown
away). What changes in what a block asks for is sizes, never names or
arguments: ``lowbw.simulate`` and ``lowbw.build`` run at most ``SYNCS`` syncs
(``steps`` capped at ``SYNCS`` times the strategy's period H) of at most
``BATCH`` examples per worker and evaluate 8 examples, so a 1,000-step example
costs one round of small batches; GPTs have one layer of width 32 on windows
of 32 bytes (compiling the model is what a block costs); the standard
library's text is read once.

Standing alone. Docs (all of docs/, README.md) and every ``--help`` text name no
file outside the repository and no word of the project's own bookkeeping (the
paper folder, its numbered papers, issue and table-row numbers): they cite
papers by title and arXiv number. ``FORBIDDEN`` lists the patterns.
"""

import argparse
import ast
import json
import os
import pathlib
import re
import shlex
import subprocess
import sys
import textwrap

import jax
import pytest

from lowbw import cli

ROOT = pathlib.Path(__file__).resolve().parent.parent
SYNCS = 1
BATCH = 2
SKETCH = "<!-- sketch -->"
PYTHON = ("python", "py")
SHELL = ("bash", "sh", "shell", "console")

# A flag (or a Python argument) that needs more than the README's install,
# and what its line (or block) must say: the extra to install, or the
# XLA_FLAGS that give a CPU several devices. A value of 1 needs nothing.
_WANDB = r"\[([\w,]*,)?wandb\]"   # .[wandb], .[dev,wandb]
_DEVICES = r"xla_force_host_platform_device_count=\d+"
REQUIREMENTS = {"--wandb-project": _WANDB, "--devices": _DEVICES}
PY_REQUIREMENTS = {"wandb_project": _WANDB, "devices": _DEVICES}

# Words that only make sense inside the project's workshop.
FORBIDDEN = re.compile(
    r"\.\./shared|seeds/|\bseed 0\d\d\b|\bissues? #?\d+|"
    r"\b(this|the|previous|engine|benchmark) issue\b|"
    r"\brows? \d+(\.\d+)?\b|lent to issue", re.IGNORECASE)
# The findings table numbers its own rows ("row 1" is a row of that table),
# so there only the other words are out of place.
FINDINGS_FORBIDDEN = re.compile(
    FORBIDDEN.pattern.replace(r"\brows? \d+(\.\d+)?\b|", ""), re.IGNORECASE)


def doc_files(include_reports=False):
  files = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))
  if include_reports:
    return files
  return [f for f in files if "experiments" not in f.relative_to(ROOT).parts]


def fenced_blocks(path):
  """(language, first line number, text, marked as a sketch) of each block."""
  lines = path.read_text().splitlines()
  blocks, i = [], 0
  while i < len(lines):
    match = re.match(r"\s*```(\S*)\s*$", lines[i])
    if not match:
      i += 1
      continue
    end = i + 1
    while not lines[end].strip().startswith("```"):
      end += 1
    sketch = i > 0 and lines[i - 1].strip() == SKETCH
    body = textwrap.dedent("\n".join(lines[i + 1:end]))
    blocks.append((match.group(1).lower(), i + 2, body, sketch))
    i = end + 1
  return blocks


def all_blocks(languages):
  out = []
  for path in doc_files():
    for lang, line, body, sketch in fenced_blocks(path):
      if lang in languages:
        out.append((f"{path.relative_to(ROOT)}:{line}", body, sketch))
  return out


PY_BLOCKS = all_blocks(PYTHON)
SH_BLOCKS = all_blocks(SHELL)


# -- python blocks -------------------------------------------------------------

_RUNNER = r'''
import gc, json, sys, time, traceback
import lowbw

# As in the test processes (conftest's GC_THRESHOLD): what is alive once
# lowbw is imported is frozen out of the cyclic collector's walks, which
# run a tenth as often.
gc.collect()
gc.freeze()
gc.set_threshold(10_000, 50, 50)

SYNCS, BATCH, OUT = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
blocks = json.load(sys.stdin)


def _period(strategy):
  if isinstance(strategy, str):
    strategy = lowbw.strategies.get(strategy)
  return strategy.period


def _shorten(fn):
  defaults = {k: f.default for k, f in lowbw.config._config.FIELDS.items()}

  def short(model=None, data=None, strategy=None,
            batch_size=defaults["batch_size"], steps=defaults["steps"],
            **kwargs):
    if isinstance(model, _CONFIG):  # capped when it was made
      return fn(model, **kwargs)
    steps = min(steps, SYNCS * _period(strategy or defaults["strategy"]))
    batch_size = min(batch_size, BATCH)
    kwargs.setdefault("eval_examples", 8)
    # Registry names, built by the (capped) factories below.
    if model in ("gpt", "moe_gpt"):
      model = getattr(lowbw.models, model)()
    if data == "text":
      data = lowbw.data.text_bytes()
    parts = {k: v for k, v in dict(model=model, data=data,
                                   strategy=strategy).items()
             if v is not None}
    if BUILD_ONLY[0] and fn is _SIMULATE:
      # Nothing reads the result: validating and building (every name,
      # argument and the model contract) is what the block can show.
      kwargs = {k: v for k, v in kwargs.items() if k in _BUILD_ARGS}
      return _BUILD(**parts, batch_size=batch_size, steps=steps,
                    compile=False, **kwargs)
    return fn(**parts, batch_size=batch_size, steps=steps, **kwargs)
  return short


def _small(fn, caps):
  """The model or data factory with its sizes capped (compiling a GPT is
  what a block costs; one layer of width 32 compiles in a fraction)."""
  def small(*args, **kwargs):
    for name, cap in caps.items():
      kwargs[name] = min(kwargs.get(name, cap), cap)
    return fn(*args, **kwargs)
  return small


def _once(fn):
  """The standard library's text is read once for every block."""
  seen = {}
  def cached(*args, **kwargs):
    key = repr((args, sorted(kwargs.items())))
    if key not in seen:
      seen[key] = fn(*args, **kwargs)
    return seen[key]
  return cached


def _capped_config(*args, **kwargs):
  """A lowbw.Config with the sizes capped as for simulate: at most SYNCS
  syncs of BATCH examples, 8 evaluation examples, a one-layer GPT."""
  config = _CONFIG(*args, **kwargs)
  settings = {n: getattr(config, n) for n in lowbw.config._config.FIELDS}
  period = _period(lowbw.config._strategy_fields.build(settings))
  used = config.to_dict()
  caps = {"steps": SYNCS * period, "batch_size": BATCH,
          "eval_examples": 8, **{k: v for k, v in _GPT.items() if k in used}}
  return config.replace(**{k: min(getattr(config, k) or cap, cap)
                           for k, cap in caps.items()})


def _capped_study(base, grid, seeds=(0,), *args, **kwargs):
  """Every point of the study is checked (its config made); its first seed
  and the first value of each list run (sizes, like steps). A small study
  given as a dict (at most 8 points of at most 8 steps, such as one a fit
  needs whole) runs as written."""
  seeds = [seeds] if isinstance(seeds, int) else list(seeds)
  subgrids = grid if isinstance(grid, list) else [grid]
  if isinstance(base, dict):  # a small study's base, whole (docs/fits.md)
    points = lowbw.studies.expand(base, grid, seeds)
    if len(points) <= 8 and all(p.config.steps <= 8 for p in points):
      return _STUDY(base, grid, seeds, *args, **kwargs)
    base = lowbw.Config(**base)
  periods = [h for sub in subgrids for h in sub.get("H", [])]
  base = base.replace(steps=max([base.steps, *periods]))  # one sync each
  lowbw.studies.expand(base, grid, seeds)
  first = [{k: list(v)[:1] for k, v in sub.items()} for sub in subgrids]
  return _STUDY(base, first, seeds[:1], *args, **kwargs)


import inspect
_CONFIG, _STUDY = lowbw.Config, lowbw.study
lowbw.Config = _capped_config
lowbw.Config.load = _CONFIG.load
lowbw.study = _capped_study
_SIMULATE, _BUILD = lowbw.simulate, lowbw.build
_BUILD_ARGS = set(lowbw.config._config.FIELDS)
BUILD_ONLY = [False]
lowbw.simulate = _shorten(lowbw.simulate)
lowbw.build = _shorten(lowbw.build)
_GPT = {"layers": 1, "d_model": 32, "seq_len": 32}
lowbw.models.gpt = _small(lowbw.models.gpt, _GPT)
lowbw.models.moe_gpt = _small(lowbw.models.moe_gpt,
                              {**_GPT, "expert_hidden": 32})
lowbw.data.text_bytes = _once(_small(lowbw.data.text_bytes,
                                     {"seq_len": _GPT["seq_len"]}))
results = {}
for name, code, build_only in blocks:
  BUILD_ONLY[0] = build_only
  start = time.perf_counter()
  try:
    exec(compile(code, name, "exec"), {"__name__": "__main__"})
    error = None
  except BaseException:
    error = traceback.format_exc(limit=-4)
  results[name] = {"error": error, "seconds": time.perf_counter() - start}
  print(f"{name}: {results[name]['seconds']:.1f} s", file=sys.stderr)
with open(OUT, "w") as f:  # stdout is the blocks' own
  json.dump(results, f)
'''


def result_unread(body: str) -> bool:
  """The block calls ``simulate`` and never reads what it returns: it is
  checked to build (validation, names, the model contract) without
  training, which only costs compiling."""
  tree = ast.parse(body)
  calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and
           getattr(n.func, "attr", getattr(n.func, "id", None)) == "simulate"]
  if not calls:
    return False
  assigned = {t.id for n in ast.walk(tree) if isinstance(n, ast.Assign)
              and isinstance(n.value, ast.Call) and n.value in calls
              for t in n.targets if isinstance(t, ast.Name)}
  bare = any(isinstance(n, ast.Expr) and n.value in calls
             for n in ast.walk(tree))
  loaded = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)}
  other_runs = any(isinstance(n, ast.Attribute) and n.attr in ("run", "sweep")
                   for n in ast.walk(tree))
  return (bool(assigned) or bare) and not (assigned & loaded) and not other_runs


def _has_ellipsis(tree):
  return any(isinstance(node, ast.Constant) and node.value is Ellipsis
             for node in ast.walk(tree))


@pytest.fixture(scope="module")
def block_results(tmp_path_factory):
  """Runs every unmarked python block, each in a fresh namespace, in one
  subprocess (one JAX import; programs shared through the test session's
  compilation cache)."""
  runnable = [(name, body, result_unread(body))
               for name, body, sketch in PY_BLOCKS if not sketch]
  env = dict(os.environ)
  # Compiling is what the blocks cost: the session's fast-compiling flags
  # (conftest), without the several devices a test may have asked for.
  env["XLA_FLAGS"] = os.environ["LOWBW_TEST_FAST_COMPILE"]
  env["LOWBW_COMPILE_CACHE"] = jax.config.jax_compilation_cache_dir or "0"
  folder = tmp_path_factory.mktemp("docs")
  out = folder / "results.json"
  proc = subprocess.run(
      [sys.executable, "-c", _RUNNER, str(SYNCS), str(BATCH), str(out)],
      input=json.dumps(runnable), capture_output=True, text=True, cwd=folder,
      env=env, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return json.loads(out.read_text())


@pytest.mark.parametrize("name,body,sketch", PY_BLOCKS,
                         ids=[b[0] for b in PY_BLOCKS])
def test_python_block(name, body, sketch, block_results):
  tree = ast.parse(body, name)  # a sketch, too, is valid Python
  if sketch:
    return
  assert not _has_ellipsis(tree), (
      f"{name} elides code with '...': mark it with {SKETCH} on the line "
      "before its fence, or write it out")
  result = block_results[name]
  assert result["error"] is None, f"{name} fails alone:\n{result['error']}"


# -- command lines -------------------------------------------------------------


def command_lines(body):
  """Each command of a shell block: continuation lines joined, ``$ `` prompts
  and output lines of console blocks dropped."""
  console = any(line.startswith("$ ") for line in body.splitlines())
  commands, current = [], ""
  for line in body.splitlines():
    if console and not current:
      if not line.startswith("$ "):
        continue
      line = line[2:]
    if line.rstrip().endswith("\\"):
      current += line.rstrip()[:-1] + " "
      continue
    current += line
    if current.strip() and not current.lstrip().startswith("#"):
      commands.append(current.strip())
    current = ""
  return commands


def _words(command):
  """The command's words without its comment and leading VAR=value."""
  words = shlex.split(command, comments=True)
  while words and re.match(r"[A-Z_][A-Z0-9_]*=", words[0]):
    words.pop(0)
  return words


COMMANDS = [(f"{name} {cmd[:60]}", cmd) for name, body, _ in SH_BLOCKS
            for cmd in command_lines(body)]
LOWBW = [(n, c) for n, c in COMMANDS if _words(c)[:1] == ["lowbw"]]


@pytest.mark.parametrize("name,command", LOWBW, ids=[n for n, _ in LOWBW])
def test_lowbw_command_parses(name, command):
  argv = _words(command)[1:]
  try:
    args = cli.build_parser().parse_args(argv)
  except SystemExit as e:  # --help, or a usage error (printed)
    if "--help" in argv and e.code == 0:
      return
    pytest.fail(f"{name}: `{command}` does not parse (exit {e.code})")
  except argparse.ArgumentError as e:
    pytest.fail(f"{name}: `{command}` does not parse: {e}")
  assert hasattr(args, "run"), f"{name}: no subcommand in `{command}`"


@pytest.mark.parametrize("name,command", LOWBW, ids=[n for n, _ in LOWBW])
def test_command_says_what_it_needs(name, command):
  words = _words(command)
  for flag, note in REQUIREMENTS.items():
    if flag in words and words[words.index(flag) + 1:][:1] != ["1"]:
      assert re.search(note, command), (
          f"{name}: `{command}` needs more than the README's install; say "
          f"so on its line ({note})")


CHEAP = [(n, c) for n, c in LOWBW
         if _words(c)[1:2] == ["plan"] or _words(c)[-1:] == ["--help"]]


@pytest.mark.parametrize("name,command", CHEAP, ids=[n for n, _ in CHEAP])
def test_cheap_command_runs(name, command, capsys):
  assert cli.main(_words(command)[1:]) == 0, capsys.readouterr().err


SCRIPTS = [(n, c) for n, c in COMMANDS
           if re.match(r"python3? [\w/]+\.py\b", " ".join(_words(c)))]


@pytest.mark.parametrize("name,command", SCRIPTS, ids=[n for n, _ in SCRIPTS])
def test_script_and_flags_exist(name, command):
  words = _words(command)
  script = ROOT / words[1]
  assert script.is_file(), f"{name}: {words[1]} does not exist"
  source = script.read_text()
  for flag in (w.split("=")[0] for w in words[2:] if w.startswith("--")):
    assert f'"{flag}"' in source, f"{name}: {words[1]} has no {flag}"


@pytest.mark.parametrize("name,body,sketch", PY_BLOCKS,
                         ids=[b[0] for b in PY_BLOCKS])
def test_python_block_says_what_it_needs(name, body, sketch):
  for setting, note in PY_REQUIREMENTS.items():
    for match in re.finditer(rf"\b{setting}=([^,)\s]+)", body):
      if match.group(1) not in ("1", "None"):
        assert re.search(note, body), (
            f"{name} sets {setting}={match.group(1)}: say what it needs in "
            f"the block ({note})")


def test_other_blocks_hold_no_code():
  for path in doc_files():
    for lang, line, body, _ in fenced_blocks(path):
      if lang in PYTHON + SHELL:
        continue
      for text in body.splitlines():
        assert not re.match(r"\s*(\$ )?(lowbw|python|pip|pytest) |\s*(import|from) \w",
                            text), (
            f"{path.relative_to(ROOT)}:{line} holds code in a block marked "
            f"{lang or 'with no language'}: mark it python, bash or console")


# -- standing alone ------------------------------------------------------------

# Tables generated from lowbw's code (a test elsewhere keeps them equal to it):
# their text is fixed where it is generated, like the --help texts.
_GENERATED = "<!-- generated by"

def _text_files():
  """README.md, the findings table (experiments/README.md) and every text
  file under docs/, the findings' data included."""
  files = [ROOT / "README.md", ROOT / "experiments" / "README.md"]
  for path in sorted((ROOT / "docs").rglob("*")):
    if path.suffix in (".md", ".json", ".txt", ".csv"):
      files.append(path)
  return files


def _hits(generated):
  """Forbidden words in the docs, outside (or inside) generated tables."""
  hits = []
  for path in _text_files():
    in_generated = False
    for number, line in enumerate(path.read_text().splitlines(), 1):
      if line.startswith(_GENERATED):
        in_generated = True
      elif in_generated and not line.startswith("|"):
        in_generated = False
      if in_generated != generated:
        continue
      pattern = (FINDINGS_FORBIDDEN if "experiments" in
                 path.relative_to(ROOT).parts else FORBIDDEN)
      for match in pattern.finditer(line):
        hits.append(f"{path.relative_to(ROOT)}:{number}: {match.group(0)!r}")
  return hits


def test_docs_stand_alone():
  hits = _hits(generated=False)
  assert not hits, "\n".join(hits)


def _help_texts(parser, name="lowbw"):
  yield name, parser.format_help()
  for sub, subparser in getattr(parser, "commands", {}).items():
    yield from _help_texts(subparser, f"{name} {sub}")


def test_help_and_generated_texts_stand_alone():
  hits = [f"{name}: {match.group(0)!r}"
          for name, text in _help_texts(cli.build_parser())
          for match in FORBIDDEN.finditer(" ".join(text.split()))]
  hits += _hits(generated=True)
  assert not hits, "\n".join(hits)

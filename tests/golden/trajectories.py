"""Golden trajectories: what every strategy does, bit for bit, in three small
runs, recorded in ``tests/golden/<strategy>.npz`` and compared by
``tests/test_golden*.py``.

Each fixture holds, for each of its strategy's three configurations, the
global parameters after each of ``ROUNDS`` records (every ``every`` steps),
every deterministic column of ``result.history``, the resolved config as YAML
(shown when a comparison fails, never compared) and the platform it was
recorded on (``fingerprint``). ``LOWBW_REGENERATE_GOLDEN=1`` (every strategy)
or ``=diloco,ddp`` rewrites fixtures instead of comparing them.
"""

import difflib
import json
import os
import pathlib
import platform
import warnings

import jax
import jaxlib
import numpy as np

import lowbw
from lowbw import _validate

DIR = pathlib.Path(__file__).resolve().parent
REGENERATE = "LOWBW_REGENERATE_GOLDEN"
SEED = 0
ROUNDS = 3  # records per configuration: enough to see momentum and EF act

# Every configuration: digits, an MLP with one hidden layer of 8, batch 8,
# 32 evaluation examples. Workers stay on one device in one group, so that
# the program does not depend on the machine's cores or free memory.
BASE = dict(data="digits", hidden="8", workers=2, batch_size=8,
            eval_examples=32, progress=False, worker_batch="all", devices=1)
# SPES needs a mixture-of-experts model, hence tokens: a fixed text of the
# repository (not the standard library, which differs between Pythons).
SPES_BASE = dict(BASE, data="text", hidden=None, model="moe_gpt",
                 data_root=str(DIR / "corpus.txt"), layers=1, d_model=4,
                 heads=1, experts=2, top_k=1, expert_hidden=4, seq_len=16,
                 batch_size=4, eval_examples=8)
_MERGE = dict(merge_warmup_steps=4, merge_every=4, merge_top_k=1)

# strategy -> (base, steps between records, {configuration: settings}).
# (a) plain: no compression (where the strategy allows it); (b) a codec with
# error feedback, or the strategy's own compression; (c) faults or an uneven
# fleet, or (where the strategy models neither) a third setting.
CASES = {
    "ddp": (BASE, 2, {
        "plain": {},
        "compressed": dict(codec="topk:0.1", ef=0.9),
        "fleet": dict(workers=3, hardware="0.1s", speeds="1,0.5,1",
                      drop_prob=0.3)}),
    "fedavg": (BASE, 4, {
        "plain": dict(H=4),
        "compressed": dict(H=4, codec="quant:4", ef=0.9),
        "fleet": dict(H=4, workers=4, island_size=2, failures="3@4")}),
    "fedadam": (BASE, 4, {
        "plain": dict(H=4),
        "compressed": dict(H=4, codec="quant:4", ef=0.9),
        "fleet": dict(H=4, workers=3, hardware="0.1s", speeds="1,0.5,1",
                      drop_prob=0.3)}),
    "diloco": (BASE, 4, {
        "plain": dict(H=4),
        "compressed": dict(H=4, codec="topk:0.1,quant:4", ef=0.7),
        "fleet": dict(H=4, workers=3, hardware="0.1s", jitter=0.5,
                      mitigation="threshold", keep_fraction=0.67,
                      message_loss=0.2)}),
    "sparta": (BASE, 2, {
        "plain": dict(p=0.05),
        # SPARTA takes a codec for its k-vectors but no error feedback: what
        # it does not send stays in the workers' own parameters.
        "compressed": dict(p=0.05, codec="quant:8"),
        "fleet": dict(p=0.05, workers=3, windows="1:2-4")}),
    "sparta_diloco": (BASE, 4, {
        "plain": dict(H=4, p=0.05),
        "compressed": dict(H=4, p=0.05, codec="quant:4", ef=0.9),
        "fleet": dict(H=4, p=0.05, workers=3, drop_prob=0.3)}),
    "muloco": (BASE, 4, {
        "plain": dict(H=4, codec="float32"),
        # MuLoCo's own compression: the paper's 2-bit grid, error feedback 0.9.
        "compressed": dict(H=4),
        "fleet": dict(H=4, workers=3, joins="2@4")}),
    "demo": (BASE, 2, {
        # DeMo always compresses (a DCT top-k of its momentum); its momentum
        # is its error feedback, so (b) chains another codec onto the DCT.
        "plain": {},
        "compressed": dict(codec="dct:16:4,quant:8"),
        "fleet": dict(workers=3, hardware="0.1s", jitter=0.3,
                      mitigation="backup", backups=1)}),
    "streaming_diloco": (BASE, 4, {
        "plain": dict(H=4, codec="float32"),
        "compressed": dict(H=4, codec="e3m0", ef=0.9),
        "fleet": dict(H=4, codec="float32", workers=3, drop_prob=0.3)}),
    "hierarchical_diloco": (BASE, 4, {
        "plain": dict(H=4, workers=4, group_size=2, global_every=2),
        "compressed": dict(H=4, workers=4, group_size=2, global_every=2,
                           codec="quant:4", ef=0.9),
        "fleet": dict(H=4, workers=4, group_size=2, global_every=2,
                      drop_prob=0.3)}),
    "spes": (SPES_BASE, 4, {
        "plain": dict(H=4, **_MERGE),
        "compressed": dict(H=4, **_MERGE, codec="quant:4", ef=0.9),
        "fleet": dict(H=4, **_MERGE, drop_prob=0.3)}),
    "async_diloco": (BASE, 4, {
        # Asynchronous DiLoCo orders arrivals by compute time (a hardware is
        # needed) and models no faults: (c) is an uneven fleet.
        "plain": dict(H=4, hardware="0.1s"),
        "compressed": dict(H=4, hardware="0.1s", codec="sign", ef=0.9),
        "fleet": dict(H=4, workers=3, hardware="0.1s", speeds="1,0.5,0.25",
                      delayed_nesterov=2)}),
    "decoupled_diloco": (BASE, 4, {
        # Decoupled DiLoCo's syncer on an uneven fleet: (a) its defaults
        # (quorum 1, half a round's tokens, an adaptive grace window),
        # (b) a codec and a fixed window, (c) a quorum of two with a
        # learner down for a window and back.
        "plain": dict(H=4, workers=3, hardware="0.1s", speeds="1,0.5,0.25"),
        "compressed": dict(H=4, hardware="0.1s", speeds="1,0.5",
                           codec="sign", ef=0.9, grace=0.2,
                           adaptive_grace=False),
        "fleet": dict(H=4, workers=3, hardware="0.1s", speeds="1,1,0.5",
                      quorum=2, windows="0:3-9")}),
    "sparseloco": (BASE, 4, {
        "plain": dict(H=4, codec="float32"),
        # SparseLoCo's own compression: top-k of 64x64 blocks at 2 bits, EF.
        "compressed": dict(H=4),
        "fleet": dict(H=4, workers=3, byzantine="2")}),
    "desloc": (BASE, 4, {
        # DES-LOC sends parameters and optimizer moments uncompressed, each
        # on its own period: (b) syncs the moments more often than its default.
        "plain": dict(Kx=4),
        "periods": dict(Kx=4, Ku=8, Kv=8),
        "fleet": dict(Kx=4, workers=3, drop_prob=0.3)}),
    "mtdao": (BASE, 4, {
        # MT-DAO sends uncompressed states as DES-LOC does: (b) desyncs the
        # moments' periods and weights the slow moment less (more gradient).
        "plain": dict(Kx=4),
        "periods": dict(Kx=4, Ku=8, Kv=8, omega=0.7),
        "fleet": dict(Kx=4, workers=3, drop_prob=0.3)}),
    "noloco": (BASE, 4, {
        # NoLoCo has no codec: (b) pairs four workers with a partial pull.
        "plain": dict(H=4),
        "pull": dict(H=4, workers=4, pull=0.5),
        "fleet": dict(H=4, workers=4, drop_prob=0.3)}),
    "snoo": (BASE, 4, {
        # SNOO has no codec: (b) is one worker (nothing sent) with its outer
        # step tuned, (c) the all-reduce with dropped workers.
        "plain": dict(H=4),
        "one_worker": dict(H=4, workers=1, outer_lr=0.5, outer_momentum=0.8),
        "fleet": dict(H=4, workers=3, drop_prob=0.3)}),
    "partial_updates": (BASE, 4, {
        # Partial parameter updates: (a) one owner per tensor, (b) a codec
        # with error feedback and two owners of three workers, (c) dropped
        # workers, whose tensors keep the other owners' mean.
        "plain": dict(H=4),
        "compressed": dict(H=4, workers=3, owners=2, codec="quant:4", ef=0.9),
        "fleet": dict(H=4, workers=3, owners=2, drop_prob=0.3)}),
    "gasloc": (BASE, 4, {
        # GASLoC has no codec: (a) a random matching, (b) a fixed ring with
        # momentum on the proposals, (c) random cycles with dropped workers.
        "plain": dict(H=4),
        "ring": dict(H=4, workers=4, graph="ring", accel=0.3),
        "fleet": dict(H=4, workers=4, graph="two_peer", drop_prob=0.3)}),
}

# Real seconds: the one column that differs between runs.
NOT_RECORDED = ("wall_time_s",)
# Columns that count (steps, examples, bytes): equal on every platform.
COUNTS = ("step", "examples", "tokens")


def path(strategy: str) -> pathlib.Path:
  return DIR / f"{strategy}.npz"


def regenerating(strategy: str) -> bool:
  """Whether ``LOWBW_REGENERATE_GOLDEN`` asks to rewrite ``strategy``'s
  fixture: "1" for every strategy, or a comma-separated list of names."""
  value = os.environ.get(REGENERATE, "").strip()
  if value in ("", "0"):
    return False
  if value == "1":
    return True
  names = [n.strip() for n in value.split(",")]
  for name in names:
    if name not in CASES:
      raise _validate.fail(
          REGENERATE, value, "expected 1 (every strategy) or comma-separated "
          f"strategy names; {name!r} is not one"
          + _validate.suggest(name, CASES))
  return strategy in names


# ---------------------------------------------------------------- platform
_ISA = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512dq",
        "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
        "amx_tile", "amx_bf16", "asimd", "sve")


def _cpu() -> tuple[str, list[str]]:
  """The CPU's model name and the instruction sets XLA may compile for."""
  model, flags = "", set()
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
          model = value.strip()
        elif key in ("flags", "Features"):
          flags.update(value.split())
  except OSError:  # no /proc: the machine's name must do
    pass
  return (model or platform.processor() or platform.machine(),
          sorted(f for f in _ISA if f in flags))


def xla_flags(text: str) -> str:
  """XLA's flags as a set: a flag given twice (pytest-xdist's workers inherit
  the suite's XLA_FLAGS and conftest adds its own again) or in another order
  compiles the same programs."""
  return " ".join(sorted(set(text.split())))


def fingerprint() -> dict:
  """What may change a float's last bits: the compiler (jax, jaxlib and
  their flags), the instruction set and CPU it compiles for, numpy (the
  host's sums), and how many devices there are."""
  model, isa = _cpu()
  return {"jax": jax.__version__, "jaxlib": jaxlib.__version__,
          "numpy": np.__version__, "machine": platform.machine(),
          "cpu": model, "isa": isa,
          "xla_flags": xla_flags(os.environ.get("XLA_FLAGS", "")),
          "backend": jax.default_backend(), "devices": jax.device_count(),
          "x64": bool(jax.config.jax_enable_x64)}


# ----------------------------------------------------------------- recording
def settings(strategy: str, case: str) -> tuple[dict, int]:
  """The ``lowbw.Config`` keywords of one configuration and its steps
  between records."""
  base, every, cases = CASES[strategy]
  given = {k: v for k, v in {**base, **cases[case]}.items() if v is not None}
  return dict(given, strategy=strategy, steps=ROUNDS * every,
              eval_every=every, log_every=every), every


def record(strategy: str, case: str) -> dict[str, np.ndarray]:
  """One configuration's trajectory, keyed ``case/...``: built and run
  through the public API (``lowbw.Config``, ``lowbw.build``, ``run``)."""
  kwargs, every = settings(strategy, case)
  config = lowbw.Config(**kwargs)
  sim = lowbw.build(config)
  result = sim.run(seed=SEED)
  _same_bits_again(sim, result, f"{strategy}/{case}")
  params_R = _param_history(sim, every)
  final = jax.tree.map(lambda x: x[-1], params_R)
  problems = compare(_flat(jax.device_get(result.params)), _flat(final),
                     exact=True)
  if problems:  # the run's host loop and the records took different paths
    raise AssertionError(f"{strategy}/{case}: the run's final parameters are "
                         "not the last record's: " + "; ".join(problems))
  # The repository's path is the machine's: not part of the recorded text.
  text = config.to_yaml().replace(str(DIR), "tests/golden")
  out = {f"{case}/config": np.array(text),
         f"{case}/record_steps": every * np.arange(1, ROUNDS + 1,
                                                   dtype=np.int32)}
  for name, leaf in _flat(params_R).items():
    out[f"{case}/params/{name}"] = leaf
  for name, column in result.history.items():
    if name not in NOT_RECORDED:
      out[f"{case}/history/{name}"] = np.asarray(column)
  return out


def _same_bits_again(sim, result, name: str) -> None:
  """Same seed, same bits: a second run of the build repeats the first's
  parameters and history bit for bit (on any platform; the fixture checks
  bits across processes where it was recorded)."""
  again = sim.run(seed=SEED)
  first = {**_flat(jax.device_get(result.params)),
           **{k: np.asarray(v) for k, v in result.history.items()
              if k not in NOT_RECORDED}}
  second = {**_flat(jax.device_get(again.params)),
            **{k: np.asarray(v) for k, v in again.history.items()
               if k not in NOT_RECORDED}}
  problems = compare(first, second, exact=True)
  if problems:
    raise AssertionError(f"{name}: a second run with the same seed differs: "
                         + "; ".join(problems))


def _param_history(sim, every: int):
  """The global parameters after each record, stacked on axis 0: the run's
  own initial state and compiled round (the same program as ``run``'s, its
  round count a traced argument), ``every // period`` rounds at a time."""
  state, sampler, net, _ = sim.initial(SEED)
  exe, state = sim.executables(state, sampler, net)
  records = []
  for _ in range(ROUNDS):
    state, _ = exe.chunk(state, sampler, every // sim.config.period, net)
    records.append(jax.device_get(exe.global_params(state)))
  return jax.tree.map(lambda *xs: np.stack(xs), *records)


def _flat(tree) -> dict[str, np.ndarray]:
  leaves, _ = jax.tree_util.tree_flatten_with_path(tree)
  return {jax.tree_util.keystr(p, simple=True, separator="/"): np.asarray(x)
          for p, x in leaves}


# ------------------------------------------------------------------- files
def save(strategy: str, arrays: dict[str, np.ndarray]) -> None:
  np.savez_compressed(path(strategy), fingerprint=np.array(
      json.dumps(fingerprint(), sort_keys=True)), **arrays)


def load(strategy: str) -> tuple[dict, dict[str, np.ndarray]]:
  """(the fingerprint it was recorded with, its arrays)."""
  with np.load(path(strategy), allow_pickle=False) as f:
    arrays = {k: f[k] for k in f.files}
  recorded = json.loads(str(arrays.pop("fingerprint")))
  recorded["xla_flags"] = xla_flags(recorded.get("xla_flags", ""))
  return recorded, arrays


# -------------------------------------------------------------- comparison
# Off the recording platform, floats agree to RTOL of the array's largest
# magnitude. Why: a platform changes the order of float32 sums (vector
# width), fused multiply-adds and the polynomials of exp/log, each a relative
# error of a few u = 2**-24 = 6e-8 per rounding. The longest chain of
# roundings in a record is its steps (at most 12 here) times one step's
# (a 64-term dot product, a 10-way softmax, the mean over W*b examples and
# about 20 elementwise optimizer operations: about 100), so the classic sum
# bound gamma_n = n*u / (1 - n*u) with n = 1200 gives 7.2e-5. Scaling by the
# array's largest magnitude rather than each entry's keeps entries that cancel
# to near zero (a bias, a pseudo-gradient) within the same absolute error.
RTOL = 1e-4
# A history column computed from the parameters (worker_divergence, a
# pseudo-gradient's norm: differences of nearly equal parameters) carries
# their absolute error, not one relative to its own small value: its
# tolerance is RTOL of the larger of its own and the parameters' magnitude.
#
# Strategies whose update is a sign (DeMo): sign() of a momentum entry that
# is 0 on one platform and 1e-9 on another moves that parameter by a whole
# step. Compiled for SSE4.2 instead of AVX-512 (no FMA), 472 of DeMo's 1536
# first-layer weights moved so, by up to 0.0024; no tolerance below the step
# itself holds, and one that large would pass a changed default too. Off the
# recording platform their floats are therefore not compared (counts and
# bytes still are), and the warning says so.
SIGN_UPDATES = ("demo",)


def exact_column(key: str) -> bool:
  """Counts (steps, examples, tokens, bytes) are integers however computed:
  equal on every platform."""
  name = key.rsplit("/", 1)[-1]
  return name in COUNTS or name.endswith("_bytes") or key.endswith(
      "record_steps")


def compare(expected: dict, actual: dict, exact: bool,
            floats: bool = True) -> list[str]:
  """One line per array that differs: missing, extra, another shape or
  dtype, or values (bit patterns when ``exact``, else RTOL; counts always
  exactly; other floats not at all when ``floats`` is False). Config texts
  are not compared."""
  problems = []
  for key in sorted(set(expected) | set(actual)):
    if key.endswith("/config"):
      continue
    if key not in actual:
      problems.append(f"{key}: recorded but no longer produced")
    elif key not in expected:
      problems.append(f"{key}: produced but not recorded")
    else:
      counts = exact_column(key) or expected[key].dtype.kind not in "fc"
      if not (exact or counts or floats):
        continue
      line = _differ(expected[key], actual[key], exact or counts,
                     _row_steps(expected, key), _floor(expected, key))
      if line:
        problems.append(f"{key}: {line}")
  return problems


def _row_steps(arrays: dict, key: str):
  """The step of each row (axis 0) of a record's array, where known: the
  record steps for parameters, the history's steps for its columns."""
  case, _, rest = key.partition("/")
  kind = rest.split("/", 1)[0]
  return arrays.get({"params": f"{case}/record_steps",
                     "history": f"{case}/history/step"}.get(kind, ""))


def _floor(arrays: dict, key: str) -> float:
  """The parameters' largest magnitude for a history column, else 0."""
  case, _, rest = key.partition("/")
  if not rest.startswith("history/"):
    return 0.0
  return max([float(np.nanmax(np.abs(v))) for k, v in arrays.items()
              if k.startswith(f"{case}/params/") and v.size] or [0.0])


def _differ(want: np.ndarray, got: np.ndarray, exact: bool,
            steps=None, floor: float = 0.0) -> str | None:
  if want.shape != got.shape or want.dtype != got.dtype:
    return (f"shape/dtype {want.shape} {want.dtype} recorded, "
            f"{got.shape} {got.dtype} now")
  if want.dtype.kind not in "fc":
    bad = want != got
  elif exact:  # bit patterns: NaN payloads and -0.0 count
    unsigned = np.dtype(f"u{want.dtype.itemsize}")
    bad = want.view(unsigned) != got.view(unsigned)
  else:
    scale = max(np.nanmax(np.abs(want)) if np.isfinite(want).any() else 0.0,
                floor)
    close = np.abs(want - got) <= RTOL * scale
    bad = ~(close | (np.isnan(want) & np.isnan(got)) | (want == got))
  if not bad.any():
    return None
  return _describe(want, got, bad, exact, steps)


def _describe(want, got, bad, exact: bool, steps) -> str:
  """Where and by how much: the count, the first differing entry (and its
  step), the largest absolute and ulp differences."""
  first = tuple(int(i) for i in np.argwhere(bad)[0])
  at = (f" (step {int(steps[first[0]])})" if steps is not None and first
        and steps.shape[:1] == want.shape[:1] else "")
  text = (f"{int(bad.sum())} of {bad.size} entries differ "
          f"({'bit for bit' if exact else f'beyond rtol {RTOL:g}'}); first at "
          f"index {list(first)}{at}: recorded {want[first]!r}, now "
          f"{got[first]!r}")
  if want.dtype.kind == "f":
    with np.errstate(invalid="ignore", over="ignore"):
      diff = np.abs(want.astype(np.float64) - got.astype(np.float64))[bad]
    largest = np.nanmax(diff) if np.isfinite(diff).any() else diff.max()
    text += (f"; max abs difference {largest:.3g}, "
             f"max ulp difference {_ulps(want, got)[bad].max():.0f}")
  return text


def _ulps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """How many representable floats lie between ``a`` and ``b``."""
  signed = np.dtype(f"i{a.dtype.itemsize}")

  def ordered(x):  # bit patterns as integers in the order of the floats
    i = x.view(signed).astype(np.float64)
    return np.where(i < 0, -(i + 2.0 ** (8 * a.itemsize - 1)), i)

  return np.abs(ordered(a) - ordered(b))


# ------------------------------------------------------------------- check
class GoldenPlatformWarning(UserWarning):
  """The fixtures were recorded on another platform: floats compared to a
  tolerance, not bit for bit."""


def check(strategy: str) -> None:
  """Records ``strategy``'s three configurations and compares them with its
  fixture (or rewrites the fixture when ``LOWBW_REGENERATE_GOLDEN`` names
  it); one failure lists every difference."""
  import pytest  # test code: the failure is pytest's

  cases = CASES[strategy][2]
  if regenerating(strategy):
    arrays = {}
    for case in cases:
      arrays.update(record(strategy, case))
    save(strategy, arrays)
    warnings.warn(f"rewrote {path(strategy)}: commit it with a message "
                  "saying why the trajectory changed", stacklevel=2)
    return
  if not path(strategy).exists():
    pytest.fail(f"strategy {strategy!r} has no golden fixture "
                f"{path(strategy).name}; record it with {REGENERATE}="
                f"{strategy} python -m pytest -n 0 tests/test_golden*.py")
  recorded_on, expected = load(strategy)
  here = fingerprint()
  exact = recorded_on == here
  if not exact:
    warnings.warn(GoldenPlatformWarning(
        f"{path(strategy).name} was recorded on another platform ("
        + ", ".join(f"{k}: {recorded_on.get(k)!r} there, {here.get(k)!r} "
                    f"here" for k in sorted(set(here) | set(recorded_on))
                    if recorded_on.get(k) != here.get(k))
        + "): counts and bytes compared exactly, floats " + (
            "not at all (its updates are signs, which rounding can flip)"
            if strategy in SIGN_UPDATES else f"to rtol {RTOL:g}")),
        stacklevel=2)
  extra = {k.split("/")[0] for k in expected} - set(cases)
  problems = ([f"{strategy}: configurations recorded but no longer defined: "
               f"{sorted(extra)}"] if extra else [])
  for case in cases:
    actual = record(strategy, case)
    mine = {k: v for k, v in expected.items() if k.startswith(case + "/")}
    found = compare(mine, actual, exact,
                    floats=strategy not in SIGN_UPDATES)
    problems += [f"{strategy}/{p}" for p in found]
    if found:
      problems += _config_change(mine.get(f"{case}/config"),
                                 actual[f"{case}/config"])
  if problems:
    shown = problems[:25] + ([f"... and {len(problems) - 25} more"]
                             if len(problems) > 25 else [])
    pytest.fail(
        f"the golden trajectory of {strategy!r} changed ("
        + ("bit for bit, recorded on this platform" if exact else
           f"beyond rtol {RTOL:g}, recorded on another platform")
        + "):\n  " + "\n  ".join(shown) + "\nIf the change is intended, "
        f"rewrite it with {REGENERATE}={strategy} python -m pytest -n 0 "
        "tests/test_golden*.py and say why in the commit message.",
        pytrace=False)


def _config_change(recorded, now) -> list[str]:
  """The resolved config's changed lines, to tell a changed default from a
  changed computation (a config that reads the same points at the latter)."""
  if recorded is None:
    return []
  old, new = str(recorded).splitlines(), str(now).splitlines()
  diff = [line for line in difflib.unified_diff(old, new, lineterm="", n=0)
          if line[:1] in "+-" and not line.startswith(("+++", "---"))]
  return ([f"  resolved config: {' | '.join(diff)}"] if diff else
          ["  resolved config: as recorded (the computation or the fixture "
           "changed)"])

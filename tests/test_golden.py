"""Golden trajectories of every registered strategy, compared bit for bit.

For each strategy in ``lowbw.strategies.SPECS``, three small deterministic
runs (``tests/golden/trajectories.py``: plain; a codec with error feedback or
the strategy's own compression; faults or an uneven fleet) are built through
``lowbw.Config`` and ``lowbw.build`` and compared with
``tests/golden/<strategy>.npz``: the global parameters after each record and
every column of ``result.history`` but ``wall_time_s``. On the platform that
recorded them (same jax, jaxlib, numpy, XLA_FLAGS, CPU model and instruction
sets) every float is compared by its bit pattern; elsewhere counts and bytes
still exactly, floats to ``trajectories.RTOL`` (derived there), with a
``GoldenPlatformWarning``.

Regenerate only on purpose, and say why in the commit message (the fixtures
show up as changed binaries):
``LOWBW_REGENERATE_GOLDEN=1 python -m pytest -q -n 0 tests/test_golden*.py``
(``=diloco,ddp`` for some strategies). This module checks the registry and
half of the strategies; ``test_golden_2.py`` the other half (two modules, so
that ``--dist loadfile`` spreads them over both test processes).
"""

import os

import numpy as np
import pytest

import lowbw
from golden import trajectories as golden

# This module's half of the registry; test_golden_2.py takes the rest.
STRATEGIES = list(lowbw.strategies.SPECS)[0::2]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_golden_trajectory(strategy):
  golden.check(strategy)


def test_every_registered_strategy_has_three_recorded_configurations():
  registered = set(lowbw.strategies.SPECS)
  assert set(golden.CASES) == registered, (
      f"strategies without golden cases: "
      f"{sorted(registered - set(golden.CASES))}, cases of no strategy: "
      f"{sorted(set(golden.CASES) - registered)}; add three configurations "
      "to tests/golden/trajectories.py and record them")
  stray = {p.stem for p in golden.DIR.glob("*.npz")} - registered
  assert not stray, f"fixtures of no registered strategy: {sorted(stray)}"
  for name in registered:
    cases = golden.CASES[name][2]
    assert len(cases) == 3, f"{name}: {sorted(cases)}, expected three"
    assert golden.path(name).exists(), (
        f"{name} has no fixture {golden.path(name).name}: run "
        f"LOWBW_REGENERATE_GOLDEN={name} python -m pytest -n 0 "
        "tests/test_golden*.py")
    _, arrays = golden.load(name)
    assert {k.split("/")[0] for k in arrays} == set(cases), name


def test_fixtures_stay_small():
  # About 40 kB a strategy (SPES's mixture-of-experts model 114 kB).
  total = sum(p.stat().st_size for p in golden.DIR.iterdir())
  limit = 60_000 * len(lowbw.strategies.SPECS)
  assert total < limit, f"tests/golden holds {total} bytes (limit {limit})"


# --------------------------------------------- the comparison itself
def test_exact_comparison_sees_every_bit():
  x = np.array([0.0, 1.5, np.nan, -2.0], np.float32)
  assert golden.compare({"a": x}, {"a": x.copy()}, exact=True) == []
  for changed in ([-0.0, 1.5, np.nan, -2.0],  # the sign of zero
                  [0.0, np.nextafter(np.float32(1.5), np.float32(2)),
                   np.nan, -2.0]):  # one ulp
    problems = golden.compare({"a": x}, {"a": np.array(changed, np.float32)},
                              exact=True)
    assert len(problems) == 1 and "1 of 4 entries differ" in problems[0], (
        problems)
  other_nan = x.copy()
  other_nan.view(np.uint32)[2] ^= 1  # another NaN payload
  assert golden.compare({"a": x}, {"a": other_nan}, exact=True)
  one_ulp = np.array([0.0, np.nextafter(np.float32(1.5), np.float32(2)),
                      np.nan, -2.0], np.float32)
  assert "max ulp difference 1" in golden.compare(
      {"a": x}, {"a": one_ulp}, exact=True)[0]


def test_tolerant_comparison_keeps_counts_exact():
  x = np.array([0.5, 1.0, -2.0], np.float32)
  near = x * np.float32(1 + golden.RTOL / 4)
  far = x * np.float32(1 + golden.RTOL * 4)
  assert golden.compare({"c/history/eval_loss": x},
                        {"c/history/eval_loss": near}, exact=False) == []
  assert golden.compare({"c/history/eval_loss": x},
                        {"c/history/eval_loss": far}, exact=False)
  bytes_ = np.array([100.0, 200.0])
  assert golden.compare({"c/history/wire_bytes": bytes_},
                        {"c/history/wire_bytes": bytes_ + 1e-9},
                        exact=False)
  assert golden.compare({"k": x}, {}, exact=False) == [
      "k: recorded but no longer produced"]
  assert golden.compare({}, {"k": x}, exact=False) == [
      "k: produced but not recorded"]
  assert "shape/dtype" in golden.compare(
      {"k": x}, {"k": x.astype(np.float64)}, exact=False)[0]


def test_a_bad_regenerate_switch_is_one_line_naming_it(monkeypatch):
  monkeypatch.setenv(golden.REGENERATE, "diloko")
  with pytest.raises(lowbw.ConfigError,
                     match=r"LOWBW_REGENERATE_GOLDEN='diloko' is invalid: "
                     r"expected 1 .*did you mean 'diloco'"):
    golden.regenerating("diloco")
  monkeypatch.setenv(golden.REGENERATE, "diloco, ddp")
  assert golden.regenerating("ddp") and not golden.regenerating("demo")


def test_history_columns_of_differences_take_the_parameters_scale():
  # worker_divergence of identical workers is rounding noise (4e-8): off the
  # recording platform it is compared at the parameters' scale.
  params = np.array([[0.5, -0.25]], np.float32)
  div = np.array([4.3e-8])
  expected = {"c/params/w": params, "c/history/worker_divergence": div}
  moved = dict(expected, **{"c/history/worker_divergence": div * 1.2})
  assert golden.compare(expected, moved, exact=False) == []
  assert golden.compare(expected, moved, exact=True)
  far = dict(expected, **{"c/history/worker_divergence": div + 1e-4})
  assert golden.compare(expected, far, exact=False)


def test_sign_update_strategies_compare_only_counts_off_platform():
  x = {"c/params/w": np.array([0.1], np.float32),
       "c/history/payload_bytes": np.array([10.0])}
  flipped = {"c/params/w": np.array([0.2], np.float32),
             "c/history/payload_bytes": np.array([10.0])}
  assert golden.compare(x, flipped, exact=False, floats=False) == []
  assert golden.compare(x, flipped, exact=True, floats=False)
  flipped["c/history/payload_bytes"] = np.array([11.0])
  assert golden.compare(x, flipped, exact=False, floats=False)


def test_the_fingerprint_reads_xla_flags_as_a_set():
  # pytest-xdist's workers once saw the suite's flags twice in XLA_FLAGS:
  # the same compiler, but a fingerprint that differed, so every fixture
  # was compared to a tolerance instead of bit for bit, with a warning.
  once = golden.xla_flags("--b=1 --a=2")
  assert golden.xla_flags("--a=2 --b=1 --a=2  --b=1") == once == "--a=2 --b=1"
  assert golden.fingerprint()["xla_flags"] == golden.xla_flags(
      os.environ.get("XLA_FLAGS", ""))


def test_this_platform_records_what_the_fixtures_were_recorded_with():
  # Not a promise about other machines: a guard that the suite's own
  # settings (flags, devices, x64) do not drift from the recording's, which
  # would silently turn every bit-for-bit comparison into a tolerant one.
  recorded, _ = golden.load("diloco")
  here = golden.fingerprint()
  machine = ("cpu", "isa", "machine", "jax", "jaxlib", "numpy")
  other = [k for k in machine if recorded.get(k) != here.get(k)]
  if other:
    pytest.skip(f"fixtures recorded with another {', '.join(other)}")
  suite = ("xla_flags", "devices", "x64", "backend")
  assert ({k: here[k] for k in suite} ==
          {k: recorded.get(k) for k in suite})

"""How hard XLA optimises a build's programs (``compile_effort``): "auto"
picks XLA's quickest settings on a CPU for a run of little work, "fast"
and "full" say so outright, and ``lowbw bench`` always measures optimised
programs."""

import jax
import pytest

import lowbw
from lowbw import cli
from lowbw.simulation import _startup

SMALL = dict(data="digits", strategy="diloco", H=5, workers=4, batch_size=8,
             steps=10, hidden=16)


def test_auto_compiles_a_small_cpu_run_quickly_and_a_large_one_fully():
  assert jax.default_backend() == "cpu"
  small = lowbw.build(**SMALL, compile=False)
  # The run's own work against the threshold, from its own prices.
  work = small.flops_per_step * 4 * 10
  assert work < _startup.FAST_WORK_FLOPS
  assert small.compiled.options == _startup.FAST_OPTIONS
  # A GPT of the default size for 2,000 steps: far above the threshold.
  large = lowbw.build(model="gpt", data="text", strategy="diloco", workers=8,
                      steps=2000, compile=False)
  assert (large.flops_per_step * 8 * 2000 >= _startup.FAST_WORK_FLOPS)
  assert large.compiled.options is None


@pytest.mark.parametrize("effort,options", [
    ("fast", _startup.FAST_OPTIONS), ("full", None)])
def test_an_explicit_effort_is_kept(effort, options):
  sim = lowbw.build(**SMALL, compile=False, compile_effort=effort)
  assert sim.compiled.options == options


def test_the_environment_sets_auto_for_a_process(monkeypatch):
  monkeypatch.setenv("LOWBW_COMPILE_EFFORT", "full")
  assert lowbw.build(**SMALL, compile=False).compiled.options is None
  # An explicit effort is not overridden.
  sim = lowbw.build(**SMALL, compile=False, compile_effort="fast")
  assert sim.compiled.options == _startup.FAST_OPTIONS


@pytest.mark.parametrize("where,value,message", [
    ("option", "quick", r"^compile_effort='quick' is invalid: expected one "
     r"of auto, fast, full"),
    ("env", "quick", r"^LOWBW_COMPILE_EFFORT='quick' is invalid: expected "
     r"one of auto, fast, full")])
def test_a_bad_effort_is_one_line_at_build_time(where, value, message,
                                                monkeypatch):
  kwargs = {}
  if where == "env":
    monkeypatch.setenv("LOWBW_COMPILE_EFFORT", value)
  else:
    kwargs["compile_effort"] = value
  with pytest.raises(lowbw.ConfigError, match=message):
    lowbw.build(**SMALL, compile=False, **kwargs)


def test_a_fast_run_trains_as_a_full_one_to_float_rounding():
  # Under the suite's XLA_FLAGS (the quick settings, conftest) both forms
  # compile alike; outside it they differ only in rounding. Either way the
  # run's numbers must agree.
  fast = lowbw.simulate(**SMALL, compile_effort="fast", progress=False)
  full = lowbw.simulate(**SMALL, compile_effort="full", progress=False)
  for name in ("train_loss", "payload_bytes", "wire_bytes"):
    assert fast.history[name] == pytest.approx(full.history[name], rel=1e-5)


def test_bench_measures_optimised_programs(monkeypatch):
  import optax
  from lowbw import bench, data, models, strategies

  class Built(Exception):
    pass

  def spy(*args, **kwargs):  # records what bench asks for, builds nothing
    raise Built(kwargs.get("compile_effort"))

  monkeypatch.setattr(bench, "build", spy)
  with pytest.raises(Built, match="^full$"):
    bench.measure(models.mlp(hidden=(8,), num_classes=10), data.digits(),
                  strategies.diloco(H=2), optax.sgd(0.1), workers=2,
                  batch_size=4)


def test_the_flag_sets_the_effort_for_train_and_sweep():
  parser = cli.build_parser()
  for command in ("train", "sweep"):
    args = parser.parse_args([command, "--compile-effort", "fast"])
    assert args.compile_effort == "fast"


def test_the_suites_compile_flags_are_the_fast_options():
  # conftest sets XLA_FLAGS before JAX starts, so it cannot import them;
  # this keeps its string and FAST_OPTIONS one set of settings.
  import os
  flags = dict(f.lstrip("-").split("=")
               for f in os.environ["LOWBW_TEST_FAST_COMPILE"].split())
  assert flags == {k: str(v).lower()
                   for k, v in _startup.FAST_OPTIONS.items()}

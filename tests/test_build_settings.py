"""A build setting is written once, as a field of the run's table with its
rule (``Field.check``): ``lowbw.build``'s and ``lowbw.simulate``'s keywords
(a ``Config``'s fields), their docstring, the settings a ``Config`` checks
and the ``RunConfig`` a simulator is specialised to are all read from those
fields."""

import dataclasses

import pytest

import lowbw
from lowbw.config import _settings
from lowbw.config._config import FIELDS

BUILD = [f.name for f in _settings.BUILD_FIELDS]
SMALL = dict(data="digits", model="mlp", hidden=8, workers=2, batch_size=4,
             steps=8, H=4, eval_examples=16, progress=False, devices=1)


def test_the_build_fields_are_the_fields_with_a_rule():
  assert set(BUILD) == {f.name for f in FIELDS.values()
                        if f.check is not None}
  assert {"batch_size", "steps", "worker_batch", "shadow"} <= set(BUILD)


def test_each_build_field_is_documented_and_a_field_of_the_run_config():
  run_config = {f.name for f in dataclasses.fields(_settings.RunConfig)}
  for name in BUILD:
    for function in (lowbw.build, lowbw.simulate):
      assert f"    {name}: " in function.__doc__, (function, name)
    assert name in run_config, name


def test_the_keywords_of_simulate_are_the_configs_fields():
  # simulate(**fields) runs Config(**fields): an unknown name is the
  # config's error, with the nearest field.
  with pytest.raises(lowbw.ConfigError, match=r"^config='stpes' is invalid: "
                     r"not a setting \(did you mean 'steps'"):
    lowbw.build(**SMALL, stpes=8)
  sim = lowbw.build(**SMALL, compile=False)
  assert sim.config.workers == 2 and sim.config.batch_size == 4


def test_a_configs_build_settings_reach_the_run_config():
  config = lowbw.Config(**SMALL, eval_local=True, correlation_every=4,
                        minibatch_size=2, worker_batch="all")
  sim = lowbw.build(config, compile=False)
  checked = config.built().checked
  for name in BUILD:
    assert getattr(sim.config, name) == checked[name] or name in (
        "worker_batch", "memory_budget"), name  # the Simulator's choices
  assert (sim.config.eval_local, sim.config.correlation_every,
          sim.config.minibatch_size, sim.config.micro) == (True, 4, 2, 2)


@pytest.mark.parametrize("name, bad, words", [
    ("batch_size", 0, "expected an integer >= 1"),
    ("steps", 2, "syncs every 4 steps"),
    ("eval_every", 6, "multiple of the strategy's period"),
    ("log_every", -1, "log_every"),
    ("eval_examples", 0, "eval_examples"),
    ("eval_local", "yes", "True or False"),
    ("workers", 0, "expected an integer >= 1"),
    ("network", "1Gbps", "expected a lowbw.network.Network"),
    ("rounds_per_chunk", 0, "expected an integer >= 1"),
    ("shadow", "dp", "expected None, 'ddp'"),
    ("correlation_every", 3, "multiple of the strategy's period"),
    ("minibatch_size", 3, "must divide batch_size=4"),
    ("autocast", "int8", "autocast"),
    ("devices", 64, "device"),
    ("worker_dtype", "float64", "worker_dtype"),
    ("worker_batch", 3, "must divide"),
    ("memory_budget", "150%", "percentage"),
    ("clients", 1, "must be at least workers=2"),
    ("availability", "trace.csv", "needs clients=M"),
])
def test_each_build_fields_rule_refuses_a_bad_value_naming_it(name, bad,
                                                              words):
  strategy = lowbw.strategies.diloco(H=4)
  given = dict(workers=2, steps=8, batch_size=4, devices=1)
  given[name] = bad
  with pytest.raises(lowbw.ConfigError) as e:
    _settings.check_settings(strategy, **given)
  assert e.value.field == name and words in str(e.value), str(e.value)


def test_every_build_field_has_a_rule_case_here():
  cases = {c[0] for c in test_each_build_fields_rule_refuses_a_bad_value_naming_it
           .pytestmark[0].args[1]}
  assert cases == set(BUILD), set(BUILD) ^ cases


@pytest.mark.parametrize("given, words", [
    (dict(network=None), "^network=None is invalid: leave it out .*clock=False"),
    (dict(network="1Gbps"), "^network='1Gbps' is invalid: expected a Python "
     "object"),
    (dict(bandwidth="10Mbps"), "^bandwidth='10Mbps' is invalid: not used: "
     "the network is given as an object"),
    (dict(clock=False), "^clock=False is invalid: not used"),
])
def test_a_network_object_refuses_what_it_replaces(given, words):
  net = lowbw.network.network("100Mbps")
  kw = {"network": net, **given}
  with pytest.raises(lowbw.ConfigError, match=words):
    lowbw.Config(**SMALL, **kw)
  # Alone, the object is the run's network.
  assert lowbw.Config(**SMALL, network=net).built().checked[
      "network"].topology == net.topology


@pytest.mark.parametrize("name, value", [
    ("bandwidth", "10Mbps"), ("hardware", "a100"), ("drop_prob", 0.1),
    ("network_profile", "ideal")])
def test_clock_false_refuses_a_network_setting(name, value):
  with pytest.raises(lowbw.ConfigError, match=rf"^{name}=.* is invalid: not "
                     "used: with clock=False the run has no network"):
    lowbw.Config(**SMALL, clock=False, **{name: value})
  assert lowbw.Config(**SMALL, clock=False).clock is False

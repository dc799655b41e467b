"""A run is resolved once: validating its ``lowbw.Config`` builds the
strategy and the network and checks the build settings, and the run uses
what was built, from the Python API and from ``lowbw train`` alike."""

import collections
import pickle

import pytest

import lowbw
from lowbw import cli, strategies

SETTINGS = dict(data="digits", model="mlp", hidden=8, workers=2,
                batch_size=4, steps=8, H=4, eval_examples=16, devices=1,
                worker_batch="all", progress=False)


@pytest.fixture
def counts(monkeypatch):
  """Calls of the DiLoCo factory, of the network's constructor and of the
  build settings' check, wherever they come from."""
  seen = collections.Counter()

  def counting(name, fn):
    def call(*args, **kwargs):
      seen[name] += 1
      return fn(*args, **kwargs)
    return call

  spec = strategies.SPECS["diloco"]
  monkeypatch.setitem(strategies.SPECS, "diloco", spec._replace(
      factory=counting("strategy", spec.factory)))
  monkeypatch.setattr(lowbw.network, "network",
                      counting("network", lowbw.network.network))
  settings = lowbw.config._settings  # the build settings' one check
  monkeypatch.setattr(settings, "check_settings", counting(
      "check_settings", settings.check_settings))
  return seen


ONCE = {"strategy": 1, "network": 1, "check_settings": 1}


def test_the_api_builds_the_strategy_and_network_once(counts, tmp_path):
  config = lowbw.Config(**SETTINGS)
  assert counts == ONCE
  config = config.replace(out=str(tmp_path / "run"), seed=3)  # run settings
  lowbw.simulate(config)
  assert counts == ONCE


def test_simulate_of_fields_builds_the_strategy_and_network_once(counts):
  # simulate(**fields) is simulate(Config(**fields)): one check of workers
  # and the other build settings, one strategy, one network.
  lowbw.simulate(**SETTINGS)
  assert counts == ONCE


def test_lowbw_train_builds_the_strategy_and_network_once(counts, tmp_path):
  argv = ["train"]
  for name, value in SETTINGS.items():
    if name != "progress":
      argv += ["--" + name.replace("_", "-"), str(value)]
  assert cli.main(argv + ["--no-progress", "--out", str(tmp_path)]) == 0
  assert counts == ONCE


def test_changing_a_build_setting_builds_again(counts):
  config = lowbw.Config(**SETTINGS)
  config.replace(H=2)
  assert counts == {"strategy": 2, "network": 2, "check_settings": 2}


def test_run_settings_are_still_checked_when_replaced():
  config = lowbw.Config(**SETTINGS)
  with pytest.raises(lowbw.ConfigError, match="checkpoint_every"):
    config.replace(checkpoint_every=3)  # not a multiple of H = 4
  with pytest.raises(lowbw.ConfigError, match="seed"):
    config.replace(seed=-1)
  with pytest.raises(lowbw.ConfigError, match="progress"):
    config.replace(progress="yes")
  assert config.replace(seed=5).seed == 5 and config.seed == 0


def test_a_config_pickles_as_its_settings():
  config = lowbw.Config(**dict(SETTINGS, H=2))
  again = pickle.loads(pickle.dumps(config))
  assert again == config and again.given == config.given

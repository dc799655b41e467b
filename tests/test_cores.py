"""One JAX CPU device per core (``lowbw._cores``): a run that names no
devices spreads its workers over them when that helps, gives the one-device
trajectory, and falls back to one device where spreading cannot apply.

The suite runs with ``LOWBW_CPU_DEVICES=1`` (conftest); these cases run in a
subprocess that asks for two CPU devices, as a 2-core machine gets them."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

_SCRIPT = r"""
import json, sys
import jax, numpy as np, optax
import lowbw
from lowbw import data, models, network, strategies

out = {"devices": jax.device_count()}
kw = dict(model=models.mlp(hidden=(8,)), data="digits", workers=4,
          batch_size=4, steps=6, progress=False, eval_examples=32)
diloco = strategies.diloco(optax.adamw(1e-3), H=3)

def run(strategy, **more):
  r = lowbw.simulate(strategy=strategy, **{**kw, **more})
  return {"devices": r.config["devices"],
          "loss": np.asarray(r.history["train_loss"]).tolist(),
          "params": [np.asarray(x).ravel().tolist()
                     for x in jax.tree.leaves(r.params)]}

# The devices a build chooses (what a run reports as its config's devices),
# without compiling: a one-device run is every other test's path.
def devices(strategy, **more):
  settings = {k: v for k, v in {**kw, **more}.items() if k != "progress"}
  return lowbw.build(strategy=strategy, compile=False,
                     **settings).config.devices

out["diloco"] = run(diloco)
out["diloco_one"] = run(diloco, devices=1)
out["ddp"] = devices(strategies.ddp(optax.adamw(1e-3)))
faults = network.network("100Mbps", "10ms",
                         faults=network.Faults(drop_prob=0.2))
out["ddp_faults"] = run(strategies.ddp(optax.adamw(1e-3)),
                        network=faults)["devices"]
out["worker_batch"] = devices(diloco, worker_batch=1)
out["odd_workers"] = devices(diloco, workers=3)

class Own(data.DataSource):
  def build(self, num_workers, batch_size, seed):
    return super().build(num_workers, batch_size, seed)

digits = data.digits()
own = Own(name="own", task="classification", train=digits.train,
          eval=digits.eval)
out["own_data"] = devices(diloco, data=own)

inner = optax.inject_hyperparams(optax.adamw)(learning_rate=1e-3)
sim = lowbw.build(strategy=strategies.diloco(inner, H=3), compile=False,
                  **{k: v for k, v in kw.items() if k != "progress"})
out["sim"] = sim.config.devices
swept = lowbw.sweep(sim, grid={"inner_lr": [1e-3, 3e-3]}, progress=False)
out["sweep"] = [p.summary["final_eval_loss"] for p in swept.points]
json.dump(out, open(sys.argv[1], "w"))
"""


def _env(devices):
  env = dict(os.environ)
  env["XLA_FLAGS"] = os.environ.get("LOWBW_TEST_FAST_COMPILE", "")
  env["LOWBW_CPU_DEVICES"] = devices
  return env


@pytest.fixture(scope="module")
def two_cores(tmp_path_factory):
  path = tmp_path_factory.mktemp("cores") / "out.json"
  subprocess.run([sys.executable, "-c", _SCRIPT, str(path)], check=True,
                 env=_env("2"), timeout=600)
  return json.loads(path.read_text())


def test_importing_lowbw_gives_one_cpu_device_per_core(two_cores):
  assert two_cores["devices"] == 2


def test_diloco_spreads_over_the_cores_with_the_one_device_trajectory(
    two_cores):
  spread, one = two_cores["diloco"], two_cores["diloco_one"]
  assert (spread["devices"], one["devices"]) == (2, 1)
  np.testing.assert_allclose(spread["loss"], one["loss"], rtol=1e-5)
  for a, b in zip(spread["params"], one["params"]):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
  assert spread["loss"][0] != spread["loss"][-1]


def test_where_spreading_does_not_apply_one_device(two_cores):
  assert two_cores["ddp"] == 1           # one replica: one large matmul
  assert two_cores["ddp_faults"] == 2    # masks keep DDP's workers apart
  assert two_cores["worker_batch"] == 1  # counts one device's workers
  assert two_cores["odd_workers"] == 1   # 2 does not divide W = 3
  assert two_cores["own_data"] == 1      # its build may not shard


def test_a_sweep_of_a_spread_build_runs_on_one_device(two_cores):
  assert two_cores["sim"] == 2
  assert all(np.isfinite(two_cores["sweep"]))


@pytest.mark.parametrize("value", ["0", "two"])
def test_a_bad_device_count_names_the_variable(value):
  done = subprocess.run([sys.executable, "-c", "import lowbw"],
                        env=_env(value), capture_output=True, text=True,
                        timeout=120)
  assert done.returncode != 0
  assert f"LOWBW_CPU_DEVICES={value!r} is invalid" in done.stderr


def test_one_keeps_jax_single_device():
  done = subprocess.run(
      [sys.executable, "-c", "import lowbw, jax; print(jax.device_count())"],
      env=_env("1"), capture_output=True, text=True, timeout=120, check=True)
  assert done.stdout.strip() == "1"

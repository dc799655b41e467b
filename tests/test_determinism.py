"""What lowbw promises about determinism, each promise tested:

1. Same seed, same machine, same settings: the same bits. For every
   registered strategy, tests/test_golden*.py run each build twice and
   compare the bits, and compare them with fixtures recorded in another
   process; here, a second build of DiLoCo, in this process and in a fresh
   one, gives identical parameters and history.
2. Another device count (workers spread over 2 CPU devices instead of 1):
   the same run to ``DEVICES_RTOL``/``DEVICES_ATOL`` (see their comment).
3. A checkpoint written on 1 device and resumed on 2: the uninterrupted
   1-device run, to the same tolerance.

The multi-device cases run in a subprocess with two forced host devices
(``XLA_FLAGS=--xla_force_host_platform_device_count=2`` and
``LOWBW_CPU_DEVICES=2``), as tests/test_cores.py does.
"""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest

import lowbw
from lowbw import models, strategies

# Spreading the workers over devices changes how a sum over workers is
# formed: each device sums its own workers, then the devices' partial sums
# are added (a psum), where one device adds all W rows in one contraction.
# Float addition is not associative, so a mean over workers may differ in
# its last bit or two (W - 1 additions, each rounding by at most eps/2
# relative), and the inner steps after each sync carry such a difference
# on. Measured over 12 steps of DiLoCo (H = 3, W = 4, AdamW, an MLP of
# hidden 8 on digits; 1 device against 2, and against a 1-device checkpoint
# at step 6 resumed on 2): parameters (magnitudes up to ~1) differ by at
# most 3.0e-7 absolute (2.5 eps), losses by 1.1e-7 relative, the
# pseudo-gradient norm by 1.2e-8 absolute; counts, bytes and the simulated
# clock not at all. The tolerance, 10 eps relative plus 10 eps absolute
# (1.2e-6; the parameters are of order 1), leaves 4x room for other x86
# CPUs' kernels.
EPS = float(np.finfo(np.float32).eps)
DEVICES_RTOL = 10 * EPS
DEVICES_ATOL = 10 * EPS

MLP = models.mlp(hidden=(8,))
RUN = dict(model=MLP, data="digits", workers=2, batch_size=8, steps=4,
           eval_every=2, eval_examples=32, devices=1)
def _values(result) -> dict:
  """Everything a run produces that must repeat: the global parameters and
  every logged column but the wall clock."""
  out = {f"param_{i}": np.asarray(x)
         for i, x in enumerate(jax.tree.leaves(result.params))}
  for k, v in result.history.items():
    if k != "wall_time_s" and k != "startup":
      out[f"history_{k}"] = np.asarray(v)
  return out


def _assert_bits(a: dict, b: dict):
  assert sorted(a) == sorted(b)
  for k in a:
    x, y = np.asarray(a[k]), np.asarray(b[k])
    assert x.dtype == y.dtype and x.shape == y.shape, k
    # Bit patterns: -0.0 and 0.0, or two NaN payloads, count as different.
    assert x.tobytes() == y.tobytes(), f"{k} differs"


def _assert_close(got: dict, want: dict):
  assert sorted(got) == sorted(want)
  for k in want:
    x, y = np.asarray(got[k]), np.asarray(want[k])
    if np.issubdtype(y.dtype, np.floating):
      np.testing.assert_allclose(x, y, rtol=DEVICES_RTOL, atol=DEVICES_ATOL,
                                 err_msg=k)
    else:
      np.testing.assert_array_equal(x, y, err_msg=k)


# ----------------------------------------------------- other processes
DILOCO = dict(strategy="diloco", H=3, workers=4, steps=12)
_SCRIPT = r"""
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import test_determinism as t
out = {}
args = json.loads(sys.argv[3])
for name, kw in args.items():
  r = t._diloco(**kw)
  out[name] = {k: v.tolist() for k, v in t._values(r).items()}
  out[name + "_devices"] = r.config["devices"]
json.dump(out, open(sys.argv[2], "w"))
"""


def _diloco(steps=12, resume_from=None, **more):
  """DiLoCo H = 3, W = 4, AdamW: the run the cross-process cases compare."""
  sim = lowbw.build(strategy=strategies.diloco(H=3),
                    **{**RUN, "workers": 4, "steps": steps,
                       "eval_every": 3, **more})
  return sim.run(seed=5, progress=False, resume_from=resume_from)


def _in_subprocess(tmp_path, devices: int, runs: dict) -> dict:
  env = dict(os.environ)
  fast = os.environ.get("LOWBW_TEST_FAST_COMPILE", "")
  env["XLA_FLAGS"] = (fast if devices == 1 else
                      f"--xla_force_host_platform_device_count={devices} "
                      f"{fast}")
  env["LOWBW_CPU_DEVICES"] = str(devices)
  path = tmp_path / f"out_{devices}.json"
  subprocess.run([sys.executable, "-c", _SCRIPT,
                  os.path.dirname(__file__), str(path), json.dumps(runs)],
                 check=True, env=env, timeout=600)
  out = json.loads(path.read_text())
  return {k: ({n: np.asarray(v, np.float32 if n.startswith("param_")
                             else None) for n, v in d.items()}
              if isinstance(d, dict) else d) for k, d in out.items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """The 1-device run in this process, and its checkpoint at step 6."""
  ckpt = tmp_path_factory.mktemp("checkpoint")
  whole = _values(_diloco())
  sim = lowbw.build(strategy=strategies.diloco(H=3),
                    **{**RUN, "workers": 4, "steps": 6, "eval_every": 3})
  sim.run(seed=5, progress=False, out=str(ckpt), checkpoint_every=6)
  return whole, ckpt


def test_a_second_build_and_a_fresh_process_give_the_same_bits(reference,
                                                              tmp_path):
  whole, _ = reference
  _assert_bits(_values(_diloco()), whole)
  fresh = _in_subprocess(tmp_path, 1, {"fresh": {}})
  got = fresh["fresh"]
  for k in whole:  # JSON carries float32 values exactly through float64
    got[k] = np.asarray(got[k], whole[k].dtype)
  _assert_bits(got, whole)


def test_two_devices_and_a_resume_on_two_devices_match_one(reference,
                                                          tmp_path):
  """The run spread over 2 devices, and the 1-device checkpoint at step 6
  resumed on 2 devices, both equal the 1-device run to DEVICES_RTOL."""
  whole, ckpt = reference
  out = _in_subprocess(tmp_path, 2, {
      "spread": {"devices": 2},
      "resumed": {"devices": 2, "resume_from": str(ckpt)}})
  assert out["spread_devices"] == out["resumed_devices"] == 2
  for name in ("spread", "resumed"):
    got = {k: np.asarray(v, whole[k].dtype) for k, v in out[name].items()}
    if os.environ.get("LOWBW_MEASURE"):  # the figures in the comment above
      for k in whole:
        d = np.abs(got[k].astype(np.float64) - whole[k])
        print(name, k, "max abs", np.nanmax(d), "max rel",
              np.nanmax(d / np.maximum(np.abs(whole[k]), 1e-30)))
    _assert_close(got, whole)

"""The start-up accounting of a run's summary: the process's age, to 10 ms,
and what counts as compiling."""

import json
import subprocess
import sys

import pytest

from lowbw.telemetry import _startup

_CHILD = """
import json, time
time.sleep(0.6)  # before lowbw: part of what import_s counts
import lowbw
from lowbw.telemetry import _startup
start, age = time.perf_counter(), _startup.process_age_s()
time.sleep(0.3)
print(json.dumps({"import_s": _startup.import_s(), "age": age,
                  "later": _startup.process_age_s(),
                  "slept": time.perf_counter() - start}))
"""


@pytest.mark.skipif(_startup.process_age_s() is None, reason="needs /proc")
def test_the_process_age_counts_from_the_process_start():
  out = subprocess.run([sys.executable, "-c", _CHILD], capture_output=True,
                       text=True, check=True, timeout=120).stdout
  got = json.loads(out.splitlines()[-1])
  assert 0.6 <= got["import_s"] <= got["age"]
  assert got["later"] - got["age"] == pytest.approx(got["slept"], abs=0.03)


def test_a_compiled_initial_state_counts_as_compiling_once():
  # A model of more than 16 parameter arrays makes its initial state as one
  # compiled program: the first run's compile_s and trace include it, a
  # second run compiles nothing, and its state equals the program's.
  import jax
  import numpy as np

  import lowbw
  from lowbw import data, models, strategies
  sim = lowbw.build(model=models.gpt(layers=1, d_model=8, heads=2,
                                     seq_len=8),  # 18 arrays
                    data=data.text_bytes(seq_len=8),
                    strategy=strategies.diloco(H=2), workers=2,
                    batch_size=2, steps=2, devices=1, eval_examples=8,
                    compile=False, compile_cache=False)
  sim.initial(seed=0)  # compiles the initial state's program, and says so
  assert sim.take_compile_s() > 0
  sim.initial(seed=1)
  assert sim.take_compile_s() == 0.0
  first = sim.run(seed=0, progress=False).summary
  assert first["compile_s"] > first["startup"]["trace_s"] > 0
  second = sim.run(seed=1, progress=False).summary
  assert second["compile_s"] == 0.0
  assert second["startup"]["trace_s"] == 0.0
  state = sim.initial(seed=5)[0]
  want = jax.jit(sim.inputs.make)(jax.random.PRNGKey(5))
  for got, expected in zip(jax.tree.leaves(state), jax.tree.leaves(want)):
    np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))

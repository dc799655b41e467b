"""Counterfactual lanes hold the run's data, not copies: every lane of a
config takes the run's training shards and evaluation batches (the same
device arrays), which are exactly what the lane would have built for
itself; a lane whose data were not the run's would be counted by the
memory plan. (That a lane still equals its separate run bit for bit is
tests/test_lanes.py's.)"""

import dataclasses

import jax
import numpy as np

import lowbw
from lowbw.simulation import _lanes, _memory

BASE = dict(data="digits", strategy="diloco", H=2, workers=2, batch_size=4,
            hidden="8", steps=4, devices=1, progress=False,
            hardware="0.1s", drop_prob=0.25, codec="quant:8")
LANES = ["no_faults", "codec=none", "ddp"]


def test_every_lane_holds_the_runs_data():
  sim = lowbw.build(lowbw.Config(**BASE, lanes=LANES), compile=False)
  _, samplers, _, _ = sim.initial(seed=5)
  run = samplers[0]
  assert len(samplers) == 1 + len(LANES)
  for (name, lane, _), sampler in zip(sim.lanes, samplers[1:]):
    assert _lanes.shares_data(sim.config, lane.config), name
    assert sampler is run, name
    assert lane.eval_batches is sim.eval_batches, name
    # What the lane would have built for itself: the same arrays, so
    # sharing changes no bit of its run.
    own = lane.inputs.sampler(5)
    assert own is not run
    assert jax.tree.structure(own) == jax.tree.structure(run)
    for a, b in zip(jax.tree.leaves(own), jax.tree.leaves(run)):
      np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


def test_a_lane_with_other_data_is_not_shared_and_is_counted():
  sim = lowbw.build(lowbw.Config(**BASE, lanes=["no_faults"]),
                    compile=False)
  (_, lane, _), = sim.lanes
  other = dataclasses.replace(lane.config, batch_size=2)
  assert not _lanes.shares_data(sim.config, other)
  assert not _lanes.shares_data(
      sim.config, dataclasses.replace(lane.config, eval_examples=16))
  plan, mine = sim.memory, lane.memory
  run = plan._replace(lane_bytes=0.0)
  shared = _memory.with_lanes(run, [mine])
  copied = _memory.with_lanes(run, [mine], shared=[False])
  assert shared.lane_bytes == mine.state_bytes + mine.buffer_bytes
  assert copied.lane_bytes == shared.lane_bytes + mine.data_bytes
  assert copied.estimate_bytes - shared.estimate_bytes == mine.data_bytes

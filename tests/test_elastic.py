"""Workers joining and leaving: what a join costs in bytes and time, the
membership logged, and a departed worker's data given to those that stay."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowbw
from lowbw import network as net_lib

import ideal
from lowbw.network import _clock
from lowbw import strategies
from lowbw.simulation._leavers import redistributed

W, H, BW, LAT = 4, 10, 100e6, 0.01


def _run(faults, steps=60):
  net = ideal.network("100Mbps", "10ms", hardware="1s", faults=faults)
  return lowbw.simulate(
      model=lowbw.models.mlp(hidden=(16,), num_classes=10),
      data=lowbw.data.digits(), strategy=strategies.diloco(H=H),
      workers=W, batch_size=8, steps=steps, network=net, log_every=H,
      eval_every=steps)


def test_a_join_downloads_the_global_state_counted_and_timed():
  """Worker 3 joins at step 20 and worker 1 is down for the round at step
  30: each downloads the model (4 bytes x P) and the outer Nesterov state
  (4 x P and the injected hyperparameters) when it comes back, over its own
  link, before its first step."""
  r = _run(net_lib.Faults(joins=((3, 20),), windows=((1, 30, 40),)))
  h, s = r.history, r.summary
  np.testing.assert_array_equal(h["workers_up"], [3, 3, 4, 3, 4, 4])
  P = s["num_params"]
  wire = h["wire_bytes"][-1] / 6            # one ring all-reduce's share
  rounds_in = np.array([6, 5, 6, 4])        # rounds each worker was up for
  state = (np.asarray(s["received_bytes_per_worker"]) - wire * rounds_in)
  np.testing.assert_allclose(state[[0, 2]], 0)
  assert state[1] == state[3] and 8 * P <= state[3] < 8 * P + 64
  np.testing.assert_allclose(s["sent_bytes_per_worker"], wire * rounds_in)
  plain = _run(None)
  extra = np.diff(np.concatenate([[0], h["sim_time_s"]])) - np.diff(
      np.concatenate([[0], plain.history["sim_time_s"]]))
  download = 2 * LAT + 8 * state[3] / BW
  # The three-worker rounds' all-reduce is shorter than the four-worker
  # one; the joins' rounds wait for the download.
  assert extra[2] == pytest.approx(download, rel=1e-4)
  assert extra[4] == pytest.approx(download, rel=1e-4)


def test_a_departed_workers_data_is_redistributed_at_its_share():
  """After worker 3 left, each of the others draws a quarter of its
  examples from worker 3's shard (contiguous shards: its own labels)."""
  source = lowbw.data.digits(sharding="contiguous")
  sampler = source.build(W, 16, 0)
  key = jax.random.PRNGKey(0)

  class Net:
    fail_step_W = jnp.asarray([2**31 - 1] * 3 + [5], jnp.int32)

  own3 = set(np.asarray(sampler.shard_idx_W[3][:int(sampler.shard_len_W[3])]
                        ).tolist())
  x = np.asarray(sampler.arrays["x"])
  rows3 = {x[i].tobytes() for i in own3}
  mixed = jax.jit(lambda step: redistributed(
      sampler, key, step, sampler.sample(key, step), Net))
  np.testing.assert_array_equal(mixed(4)["x"], sampler.sample(key, 4)["x"])
  hits = []
  for step in range(5, 45):
    xs = np.asarray(mixed(step)["x"])
    hits.append([np.mean([xs[w, i].tobytes() in rows3 for i in range(16)])
                 for w in range(3)])
  assert 0.18 < np.mean(hits) < 0.32


def test_elastic_settings_are_checked():
  for faults, match in [(dict(joins=((1, 0),)), "joins"),
                        (dict(joins=((9, 10),)), "joins"),
                        (dict(leave_shards="share"), "leave_shards")]:
    with pytest.raises(ValueError, match=match):
      _clock.check_network(ideal.network(
          faults=net_lib.Faults(**faults)), W)

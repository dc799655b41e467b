"""The bytes actually sent and received (``sent_bytes``, ``received_bytes``):
fleet totals over the workers that took part in each communication, against
plain references built step by step from who was up, and equal to W times
the per-worker ``wire_bytes`` when everyone takes part."""

import numpy as np
import pytest

import lowbw
from lowbw import data, models, network, strategies
from lowbw.telemetry import _metrics as names

W, H, STEPS = 3, 2, 8
WINDOWS = ((2, 0, 2),)     # worker 2 down for the first round
FAILURES = ((1, 4),)       # worker 1 down from the round starting at step 4


def _run(strategy, net=None, steps=STEPS):
  return lowbw.simulate(models.mlp(hidden=(8,)), data.digits(), strategy,
                        workers=W, batch_size=4, steps=steps,
                        eval_every=steps, eval_examples=32, log_every=1,
                        progress=False,
                        **({"clock": False} if net is None else {"network": net}))


def _up(step: int, period: int) -> list[int]:
  """The workers up for the round holding 1-based ``step`` (masks are drawn
  at round starts)."""
  start = (step - 1) // period * period
  return [w for w in range(W)
          if not any(v == w and s <= start < e for v, s, e in WINDOWS)
          and not any(v == w and start >= f for v, f in FAILURES)]


def _ring_wire(payload: int) -> float:
  return 2 * (W - 1) / W * payload


def _returns(step: int, period: int) -> int:
  """Workers back in the fleet at the round starting at 1-based ``step``:
  up now, down for the round before (each downloads the global state)."""
  if (step - 1) % period or step <= period:
    return 0
  return len(set(_up(step, period)) - set(_up(step - period, period)))


def _catch_up(r) -> int:
  """Bytes one return downloads: the global model and outer state."""
  return r.config["channels"]["catch_up"]["down_bytes"]


def _reference(events_at, up_at, per_worker: dict, steps=STEPS):
  """Cumulative fleet bytes after each step: a loop over steps, channels and
  the workers that took part, each adding ``per_worker[channel]``."""
  total, out = 0.0, []
  for step in range(1, steps + 1):
    for channel in events_at(step):
      for _ in up_at(step):
        total += per_worker[channel]
    out.append(total)
  return np.array(out)


@pytest.fixture(scope="module")
def diloco_runs():
  faults = network.Faults(windows=WINDOWS, failures=FAILURES)
  strategy = strategies.diloco(H=H)
  return (_run(strategy, network.network(faults=faults)),
          _run(strategy, network.network()), _run(strategy))


def test_diloco_under_windows_and_failures_by_hand(diloco_runs):
  faulty = diloco_runs[0]
  h, payload = faulty.history, 4 * faulty.summary["num_params"]
  wire = {"pseudo_gradients": _ring_wire(payload)}
  want = _reference(
      lambda s: ["pseudo_gradients"] if s % H == 0 else [],
      lambda s: _up(s, H), wire)
  back = np.cumsum([_returns(s, H) for s in range(1, STEPS + 1)])
  state = _catch_up(faulty)
  # DiLoCo's global state: the model and its Nesterov momentum (and the
  # outer optimizer's injected hyperparameters: a few scalars).
  assert 2 * payload <= state < 2 * payload + 64
  np.testing.assert_allclose(h[names.SENT_BYTES], want, rtol=1e-12)
  np.testing.assert_allclose(h[names.RECEIVED_BYTES], want + state * back,
                             rtol=1e-12)
  assert back[-1] == 1  # worker 2, after its window
  assert faulty.summary["sent_bytes"] == pytest.approx(want[-1], rel=1e-12)
  assert faulty.summary["received_bytes"] == pytest.approx(
      want[-1] + state, rel=1e-12)
  # The per-worker columns still count every worker: fewer bytes were sent.
  assert h[names.SENT_BYTES][-1] < W * h[names.WIRE_BYTES][-1]


def test_no_faults_sends_w_times_the_per_worker_bytes(diloco_runs):
  for r in diloco_runs[1:]:  # with a clock and without a network
    h = r.history
    np.testing.assert_allclose(h[names.SENT_BYTES], W * h[names.WIRE_BYTES],
                               rtol=1e-12)
    np.testing.assert_allclose(h[names.RECEIVED_BYTES],
                               W * h[names.WIRE_BYTES], rtol=1e-12)
    assert r.summary["sent_bytes"] == pytest.approx(
        W * r.summary["wire_bytes"], rel=1e-12)
  # The faults only change who took part, not what one event costs.
  np.testing.assert_array_equal(diloco_runs[0].history[names.WIRE_BYTES],
                                diloco_runs[1].history[names.WIRE_BYTES])


def test_steps_and_syncs_on_a_parameter_server_by_hand():
  """SPARTA-DiLoCo communicates every step and syncs at round ends (both
  at the last step of a round); a parameter server receives each worker's
  payload and sends back the mean (one payload), or the others' payloads
  when they cannot be summed (top-k: W - 1 payloads)."""
  faults = network.Faults(windows=WINDOWS, failures=FAILURES)
  r = _run(strategies.sparta_diloco(H=H, p=0.1, codec="topk:0.1"),
           network.network(topology="parameter_server", faults=faults))
  ch = r.config["channels"]
  sparse = ch["sparse_parameters"]["payload_bytes"]
  pseudo = ch["pseudo_gradients"]["payload_bytes"]

  def events_at(step):
    return ["sparse_parameters"] + (["pseudo_gradients"] if step % H == 0
                                    else [])

  def up_at(step):
    return _up(step, H)

  sent = _reference(events_at, up_at, {"sparse_parameters": sparse,
                                       "pseudo_gradients": pseudo})
  received = _reference(events_at, up_at, {
      "sparse_parameters": sparse, "pseudo_gradients": (W - 1) * pseudo})
  back = np.cumsum([_returns(s, H) for s in range(1, STEPS + 1)])
  np.testing.assert_allclose(r.history[names.SENT_BYTES], sent, rtol=1e-12)
  np.testing.assert_allclose(r.history[names.RECEIVED_BYTES],
                             received + _catch_up(r) * back, rtol=1e-12)


def test_random_drops_follow_the_logged_participants():
  """DDP with dropped workers: each step's communication is counted for
  the workers it averaged (``sync_workers``, logged at every step)."""
  net = network.network(faults=network.Faults(drop_prob=0.4))
  r = _run(strategies.ddp(), net, steps=12)
  h = r.history
  k = h[names.SYNC_WORKERS]
  assert set(k) - {float(W)}, "the draw dropped nobody; pick another"
  payload = 4 * r.summary["num_params"]
  want = np.cumsum([kk * _ring_wire(payload) for kk in k])
  np.testing.assert_allclose(h[names.SENT_BYTES], want, rtol=1e-12)
  # A worker back after a dropped step downloads the model (DDP has no
  # outer state): the rest of what the fleet received.
  extra = h[names.RECEIVED_BYTES] - want
  assert _catch_up(r) == payload
  np.testing.assert_allclose(extra / payload, np.round(extra / payload),
                             atol=1e-9)
  assert np.all(np.diff(extra) > -1e-6) and extra[-1] > 0


def test_the_csv_has_the_new_columns(tmp_path):
  r = lowbw.simulate(models.mlp(hidden=(8,)), data.digits(),
                     strategies.diloco(H=H), workers=W, batch_size=4,
                     steps=4, eval_every=4, eval_examples=32,
                     progress=False, out=str(tmp_path))
  header = (tmp_path / "metrics.csv").read_text().splitlines()[0].split(",")
  assert names.SENT_BYTES in header and names.RECEIVED_BYTES in header
  assert r.summary["received_bytes"] == pytest.approx(
      W * r.summary["wire_bytes"])

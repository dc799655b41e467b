"""The network model on its own, without ``lowbw.simulate``: units, topology
costs, hardware, ``network``/``check_network``, the traced ``NetParams``
functions and the host ``Clock``.

Expected costs are written out here from the alpha-beta model (latency per hop
plus 8 x bytes / bandwidth), never copied from the code's output.
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowbw

from lowbw.network import (Channel, Clock, Faults, Link,
                           Network,
                           Stragglers, all_gather, bandwidth, duration, flat,
                           flops, hardware, hierarchical, link,
                           ring_allreduce)
from ideal import network
from lowbw.network import _clock
from lowbw.network._topology import Flat, Hierarchical, relinked
from lowbw.network._clock import (check_network, net_params, participants,
                                  step_seconds, up_mask)


W = 6                # workers of the NetParams tests
READY = jnp.asarray([3.0, 1.0, 5.0, 2.0, 6.0, 4.0], jnp.float32)
ALL_UP = jnp.ones(W, bool)
STEPS = 3000


@jax.jit
def _at_steps(p, up):
  steps = jnp.arange(STEPS)
  times = jax.vmap(step_seconds, (None, 0))(p, steps)
  up_W = jax.vmap(up_mask, (None, 0))(p, steps)
  active, start = jax.vmap(lambda s: participants(p, READY, up, s, 0))(steps)
  return times, up_W, active, start


def at_steps(p, up=ALL_UP):
  """Step times, up masks, and who of READY (with ``up``) takes part and
  when, at steps 0 to STEPS-1: one compilation per NetParams structure."""
  return _at_steps(p, jnp.asarray(up, bool))


def hop(bps, latency, nbytes):
  """One message of ``nbytes`` on a link: alpha + beta."""
  return latency + 8.0 * nbytes / bps


def params(num_workers, *, hw=None, stragglers=None, faults=None, seed=0,
           channels=None, flops_per_step=0.0, **kw):
  net = check_network(network(hardware=hw, stragglers=stragglers,
                              faults=faults, **kw), num_workers)
  if channels is None:
    channels = {"sync": ring_allreduce(1_000_000, num_workers)}
  return net_params(net, num_workers, _clock.price(
      net, channels, num_workers, 1, flops_per_step), seed)


# ------------------------------------------------------------------- units


def test_bandwidth_units_and_plain_numbers():
  assert bandwidth("100Mbps") == 1e8
  assert bandwidth("1Gbps") == 1e9
  assert bandwidth("10Gbit/s") == 1e10
  assert bandwidth("2.5gbps") == 2.5e9
  assert bandwidth(" 64 kbps ") == 64e3
  assert bandwidth(1e9) == 1e9  # a Python number is in bit/s
  assert bandwidth(100) == 100.0
  with pytest.raises(ValueError, match=r"bandwidth='1e9' is invalid: a "
                     r"number needs its unit, such as '100Mbps'"):
    bandwidth("1e9")  # a string needs its unit: 1e9 what?


def test_duration_units_and_plain_numbers():
  assert duration("50ms") == pytest.approx(0.05)
  assert duration("2s") == 2.0
  assert duration("100us") == pytest.approx(1e-4)
  assert duration("100µs") == pytest.approx(1e-4)
  assert duration("1min") == 60.0
  assert duration(0) == 0.0
  assert duration("0ms") == 0.0
  assert duration(0.25) == 0.25


def test_flops_units():
  assert flops("312TFLOPS") == pytest.approx(312e12)
  assert flops("1.2PFLOPS") == pytest.approx(1.2e15)
  assert flops(5e9) == 5e9


@pytest.mark.parametrize("parse,field,value", [
    (bandwidth, "bandwidth", -5),
    (bandwidth, "bandwidth", "-5Mbps"),
    (bandwidth, "bandwidth", 0),
    (bandwidth, "bandwidth", "0Gbps"),
    (bandwidth, "bandwidth", "fast"),
    (bandwidth, "bandwidth", "10 parsecs"),
    (bandwidth, "bandwidth", "10ms"),
    (bandwidth, "bandwidth", True),
    (bandwidth, "bandwidth", None),
    (bandwidth, "bandwidth", "nan"),
    (bandwidth, "bandwidth", float("nan")),
    (bandwidth, "bandwidth", float("inf")),
    (duration, "latency", -0.1),
    (duration, "latency", "fast"),
    (duration, "latency", "10 parsecs"),
    (duration, "latency", "1Gbps"),
    (duration, "latency", False),
    (duration, "latency", None),
    (duration, "latency", "nan"),
    (flops, "flops", 0),
    (flops, "flops", "312TB"),
    (flops, "flops", True),
    (flops, "flops", None),
])
def test_bad_quantities_name_the_field(parse, field, value):
  with pytest.raises(ValueError, match=f"^{field}="):
    parse(value)


def test_the_field_name_is_passed_through():
  with pytest.raises(ValueError, match="^wan_bandwidth="):
    bandwidth("fast", "wan_bandwidth")
  with pytest.raises(ValueError, match="^regional_latency="):
    link("1Gbps", "soon", field="regional")
  with pytest.raises(ValueError, match="^regional_bandwidth="):
    hierarchical(2, regional_bandwidth=0)
  with pytest.raises(ValueError, match="^latency="):
    flat("1Gbps", -1)


# ---------------------------------------------------------------- topology


def test_flat_ring_small_numbers():
  """4 workers, 1000 bytes, 1000 bytes/s, 1 s per hop."""
  topo = flat(8000, 1.0)
  reduce = topo.cost(ring_allreduce(1000, 4), 4)
  assert reduce.seconds == pytest.approx(6 * (1.0 + 0.25))   # 6 hops of 250 B
  assert reduce.wire_bytes == pytest.approx(1500)
  gather = topo.cost(all_gather(1000, 4), 4)
  assert gather.seconds == pytest.approx(3 * (1.0 + 1.0))    # 3 hops of 1000 B
  assert gather.wire_bytes == pytest.approx(3000)


@pytest.mark.parametrize("n", [2, 3, 8, 13])
def test_flat_ring_by_hand(n):
  bps, lat, p = 1e9, 0.05, 1_234_567
  topo = flat("1Gbps", "50ms")
  reduce = topo.cost(ring_allreduce(p, n), n)
  assert reduce.seconds == pytest.approx(2 * (n - 1) * hop(bps, lat, p / n))
  assert reduce.wire_bytes == pytest.approx(2 * (n - 1) / n * p)
  gather = topo.cost(all_gather(p, n), n)
  assert gather.seconds == pytest.approx((n - 1) * hop(bps, lat, p))
  assert gather.wire_bytes == pytest.approx((n - 1) * p)


@pytest.mark.parametrize("n", [2, 5, 16])
def test_ring_wire_bytes_are_the_engines(n):
  """The clock's bytes are the ones the engine counts for the channel."""
  p = 98_765
  topo = flat("100Mbps", "20ms")
  for channel in (ring_allreduce(p, n), all_gather(p, n)):
    assert topo.cost(channel, n).wire_bytes == pytest.approx(channel.wire_bytes)


def test_parameter_server_small_numbers():
  topo = flat(8000, 1.0, "parameter_server")
  reduce = topo.cost(ring_allreduce(1000, 4), 4)
  assert reduce.seconds == pytest.approx(2.0 + 2.0)   # up 1000 B, down 1000 B
  assert reduce.wire_bytes == pytest.approx(1000)
  gather = topo.cost(all_gather(1000, 4), 4)
  assert gather.seconds == pytest.approx(2.0 + 4.0)   # up 1000 B, down 3000 B
  assert gather.wire_bytes == pytest.approx(1000)


@pytest.mark.parametrize("n", [2, 7])
def test_parameter_server_by_hand(n):
  bps, lat, p = 1e8, 0.1, 500_000
  topo = flat("100Mbps", "100ms", "parameter_server")
  reduce = topo.cost(ring_allreduce(p, n), n)
  assert reduce.seconds == pytest.approx(2 * hop(bps, lat, p))
  assert reduce.wire_bytes == pytest.approx(p)
  gather = topo.cost(all_gather(p, n), n)
  assert gather.seconds == pytest.approx(hop(bps, lat, p) +
                                         hop(bps, lat, (n - 1) * p))
  assert gather.wire_bytes == pytest.approx(p)


@pytest.mark.parametrize("topo", [
    flat(), flat(algorithm="parameter_server"), hierarchical(1)])
def test_one_worker_costs_nothing(topo):
  for channel in (ring_allreduce(10_000, 1), all_gather(10_000, 1)):
    cost = topo.cost(channel, 1)
    assert (cost.seconds, cost.wire_bytes) == (0.0, 0.0)


def test_hierarchical_small_numbers():
  """2 regions of 2; regional 10000 B/s + 0.1 s, WAN 1000 B/s + 1 s."""
  topo = hierarchical(2, 80_000, 0.1, 8000, 1.0)
  reduce = topo.cost(ring_allreduce(1000, 4), 4)
  # Regional ring: 2 hops of 500 B (0.15 s); WAN ring of the 500 B shard over
  # 2 regions: 2 hops of 250 B (1.25 s).
  assert reduce.seconds == pytest.approx(2 * 0.15 + 2 * 1.25)
  assert reduce.wire_bytes == pytest.approx(500 + 1000)
  gather = topo.cost(all_gather(1000, 4), 4)
  # 1 regional hop of 1000 B, 1 WAN hop of 1000 B, 1 regional hop of 1000 B.
  assert gather.seconds == pytest.approx(0.2 + 2.0 + 0.2)
  assert gather.wire_bytes == pytest.approx(3000)


@pytest.mark.parametrize("n,s", [(8, 4), (12, 3), (12, 2), (6, 1)])
def test_hierarchical_by_hand(n, s):
  rbps, rlat, wbps, wlat, p = 1e10, 0.005, 1e8, 0.1, 3_000_000
  regions = n // s
  topo = hierarchical(s, "10Gbps", "5ms", "100Mbps", "100ms")
  reduce = topo.cost(ring_allreduce(p, n), n)
  inside = 2 * (s - 1) * hop(rbps, rlat, p / s)
  across = 2 * (regions - 1) * hop(wbps, wlat, p / s / regions)
  assert reduce.seconds == pytest.approx(inside + across)
  assert reduce.wire_bytes == pytest.approx(
      2 * (s - 1) / s * p + 2 * (regions - 1) / regions * p / s)
  gather = topo.cost(all_gather(p, n), n)
  assert gather.seconds == pytest.approx(
      (s - 1) * hop(rbps, rlat, p) + (regions - 1) * hop(wbps, wlat, p) +
      (s - 1) * hop(rbps, rlat, (regions - 1) * p))
  assert gather.wire_bytes == pytest.approx((n - 1) * p)


@pytest.mark.parametrize("n,s", [(8, 4), (12, 3), (16, 2), (6, 6)])
def test_hierarchical_wire_bytes_are_the_engines(n, s):
  """Two tiers send what one flat ring sends: 2(s-1)/s + 2(r-1)/(rs) =
  2(n-1)/n, and (s-1) + (r-1) + (s-1)(r-1) = n-1 payloads."""
  p = 40_000
  topo = hierarchical(s)
  for channel in (ring_allreduce(p, n), all_gather(p, n)):
    assert topo.cost(channel, n).wire_bytes == pytest.approx(channel.wire_bytes)


def test_hierarchical_islands_are_a_wan_ring():
  """A collective over fewer than all workers runs as a ring on the WAN."""
  wbps, wlat, p = 1e8, 0.1, 200_000
  topo = hierarchical(4, "10Gbps", "5ms", "100Mbps", "100ms")
  for m in (2, 4, 3):
    reduce = topo.cost(ring_allreduce(p, m), 8)
    assert reduce.seconds == pytest.approx(2 * (m - 1) * hop(wbps, wlat, p / m))
    assert reduce.wire_bytes == pytest.approx(2 * (m - 1) / m * p)
    gather = topo.cost(all_gather(p, m), 8)
    assert gather.seconds == pytest.approx((m - 1) * hop(wbps, wlat, p))


@pytest.mark.parametrize("n", [2, 4, 8])
def test_hierarchical_one_region_is_a_regional_ring(n):
  p = 1_000_000
  one_region = hierarchical(n, "10Gbps", "5ms", "100Mbps", "100ms")
  regional_ring = flat("10Gbps", "5ms")
  channel = ring_allreduce(p, n)
  got, want = one_region.cost(channel, n), regional_ring.cost(channel, n)
  assert got.seconds == pytest.approx(want.seconds)
  assert got.wire_bytes == pytest.approx(want.wire_bytes)


@pytest.mark.parametrize("n", [2, 4, 8])
def test_hierarchical_regions_of_one_are_a_wan_ring(n):
  p = 1_000_000
  regions_of_one = hierarchical(1, "10Gbps", "5ms", "100Mbps", "100ms")
  wan_ring = flat("100Mbps", "100ms")
  for channel in (ring_allreduce(p, n), all_gather(p, n)):
    got, want = regions_of_one.cost(channel, n), wan_ring.cost(channel, n)
    assert got.seconds == pytest.approx(want.seconds)
    assert got.wire_bytes == pytest.approx(want.wire_bytes)


@pytest.mark.parametrize("n,s", [(4, 2), (8, 2), (8, 4), (12, 3), (16, 4)])
def test_hierarchical_on_equal_links_saves_latency_only(n, s):
  """On equal links both all-reduces move 2(n-1)/n payloads in sequence; the
  two tiers take 2(s-1) + 2(r-1) hops instead of 2(n-1), fewer by
  2(s-1)(r-1). Their all-gather saves (s-1)(r-2) hops (r >= 2)."""
  lat, p, r = 0.05, 2_000_000, n // s
  two_tier = hierarchical(s, "1Gbps", "50ms", "1Gbps", "50ms")
  ring = flat("1Gbps", "50ms")
  reduce = (ring.cost(ring_allreduce(p, n), n).seconds -
            two_tier.cost(ring_allreduce(p, n), n).seconds)
  assert reduce == pytest.approx(2 * (s - 1) * (r - 1) * lat)
  assert reduce >= 0
  gather = (ring.cost(all_gather(p, n), n).seconds -
            two_tier.cost(all_gather(p, n), n).seconds)
  assert gather == pytest.approx((s - 1) * (r - 2) * lat)


def test_hierarchical_on_equal_links_without_latency_is_a_ring():
  two_tier = hierarchical(4, "1Gbps", 0, "1Gbps", 0)
  ring = flat("1Gbps", 0)
  for channel in (ring_allreduce(3_000_000, 16), all_gather(3_000_000, 16)):
    assert two_tier.cost(channel, 16).seconds == pytest.approx(
        ring.cost(channel, 16).seconds)


# ---------------------------------------------------------------- hardware


def test_hardware_presets():
  assert hardware("h100").flops == 989e12
  assert hardware("a100").flops == 312e12
  assert hardware("A100").name == "a100"
  assert hardware().flops == 989e12 and hardware().mfu == 0.4


def test_hardware_peak_and_fixed_step_time():
  hw = hardware("312TFLOPS")
  assert hw.flops == pytest.approx(312e12) and hw.step_time_s is None
  fixed = hardware("0.5s")
  for f in (0.0, 1.0, 1e30):
    assert fixed.step_seconds(f) == 0.5
  assert hardware("20ms").step_seconds(1e18) == pytest.approx(0.02)
  assert hardware(1e15).flops == 1e15


def test_hardware_flop_model_by_hand():
  p, tokens = 1_300_000_000, 4096
  fps = _clock.flops_per_step(p, tokens)
  assert fps == 6.0 * p * tokens
  assert hardware("a100").step_seconds(fps) == pytest.approx(
      6 * p * tokens / (312e12 * 0.4))
  assert hardware("h100", mfu=0.5).step_seconds(fps) == pytest.approx(
      6 * p * tokens / (989e12 * 0.5))
  assert hardware("100TFLOPS", mfu=1.0).step_seconds(fps) == pytest.approx(
      6 * p * tokens / 100e12)


def test_hardware_speeds():
  assert hardware(speeds="1,2,0.5").speeds == (1.0, 2.0, 0.5)
  assert hardware(speeds=" 1 , 3").speeds == (1.0, 3.0)
  assert hardware(speeds=[1, 2.5]).speeds == (1.0, 2.5)
  assert hardware(speeds=np.array([0.5, 4.0])).speeds == (0.5, 4.0)
  assert hardware().speeds is None


@pytest.mark.parametrize("kw,field", [
    ({"speeds": "1,x"}, "speeds"),
    ({"speeds": ""}, "speeds"),
    ({"speeds": []}, "speeds"),
    ({"speeds": [1, 0]}, "speeds"),
    ({"speeds": [1, -2]}, "speeds"),
    ({"speeds": [1, float("inf")]}, "speeds"),
    ({"speeds": [1, float("nan")]}, "speeds"),
    ({"speeds": 3}, "speeds"),
    ({"mfu": 0}, "mfu"),
    ({"mfu": 1.5}, "mfu"),
    ({"mfu": "0.4"}, "mfu"),
    ({"mfu": True}, "mfu"),
    ({"spec": "fast"}, "hardware"),
    ({"spec": "lots"}, "hardware"),
    ({"spec": "0s"}, "hardware"),
    ({"spec": "-1s"}, "hardware"),
    ({"spec": "12 parsecs"}, "hardware"),
    ({"spec": 0}, "hardware"),
    ({"spec": None}, "hardware"),
])
def test_bad_hardware_names_the_field(kw, field):
  with pytest.raises(ValueError, match=f"^{field}="):
    hardware(**kw)


# ----------------------------------------------------------------- network()


def test_network_topologies():
  ring = network("100Mbps", "100ms")
  assert ring.topology == Flat(link("100Mbps", "100ms"), "ring")
  ps = network(topology="parameter_server")
  assert isinstance(ps.topology, Flat)
  assert ps.topology.algorithm == "parameter_server"
  h = network("100Mbps", "80ms", topology="hierarchical", group_size=4,
              regional_bandwidth="40Gbps", regional_latency="1ms")
  assert h.topology == Hierarchical(4, link("40Gbps", "1ms"),
                                    link("100Mbps", "80ms"))
  assert network(hardware=None).hardware is None
  assert network(hardware="a100", mfu=0.3).hardware.mfu == 0.3


def test_network_build_errors():
  with pytest.raises(ValueError, match="^topology="):
    network(topology="mesh")
  with pytest.raises(ValueError, match="^group_size="):
    network(topology="hierarchical")
  with pytest.raises(ValueError, match="^group_size="):
    network(topology="hierarchical", group_size=0)
  with pytest.raises(ValueError, match="^group_size="):
    network(topology="ring", group_size=4)
  with pytest.raises(ValueError, match="^group_size="):
    network(topology="parameter_server", group_size=4)
  with pytest.raises(ValueError, match="^bandwidth="):
    network("fast")
  with pytest.raises(ValueError, match="^speeds="):
    network(speeds="1,0")


@pytest.mark.parametrize("kw,field", [
    ({"speeds": [1, 2, 3]}, "speeds"),
    ({"topology": "hierarchical", "group_size": 3}, "group_size"),
    ({"topology": "hierarchical", "group_size": 8}, "group_size"),
    ({"stragglers": Stragglers(mitigation="backup", backups=4)}, "backups"),
    ({"stragglers": Stragglers(mitigation="backup", backups=-1)}, "backups"),
    ({"stragglers": Stragglers(jitter=-0.1)}, "jitter"),
    ({"stragglers": Stragglers(mitigation="fastest")}, "mitigation"),
    ({"stragglers": Stragglers(mitigation="threshold", fraction=0)},
     "stragglers.fraction"),
    ({"stragglers": Stragglers(fraction=1.5)}, "stragglers.fraction"),
    ({"stragglers": {"jitter": 0.1}}, "stragglers"),
    ({"faults": Faults(windows=((4, 0, 1),))}, "windows"),
    ({"faults": Faults(windows=((-1, 0, 1),))}, "windows"),
    ({"faults": Faults(windows=((0, 5, 5),))}, "windows"),
    ({"faults": Faults(windows=((0, 5, 2),))}, "windows"),
    ({"faults": Faults(windows=((0, -1, 2),))}, "windows"),
    ({"faults": Faults(windows=((0, 1),))}, "windows"),
    ({"faults": Faults(windows=((0, 1, 2, 3),))}, "windows"),
    ({"faults": Faults(windows=(0, 1, 2))}, "windows"),
    ({"faults": Faults(failures=((4, 0),))}, "failures"),
    ({"faults": Faults(failures=((-1, 0),))}, "failures"),
    ({"faults": Faults(failures=((0, -3),))}, "failures"),
    ({"faults": Faults(failures=((0, 1, 2),))}, "failures"),
    ({"faults": Faults(failures=(0,))}, "failures"),
    ({"faults": Faults(drop_prob=1.5)}, "drop_prob"),
    ({"faults": Faults(drop_prob=-0.1)}, "drop_prob"),
    ({"faults": Faults(message_loss=2.0)}, "message_loss"),
    ({"faults": Faults(message_loss=-1)}, "message_loss"),
    ({"faults": {"drop_prob": 0.1}}, "faults"),
    ({"overlap": "yes"}, "overlap"),
])
def test_check_network_errors_name_the_field(kw, field):
  net = network(**kw)
  with pytest.raises(ValueError, match=f"^{field}="):
    check_network(net, 4)


def test_check_network_rejects_other_objects():
  with pytest.raises(ValueError, match="^network="):
    check_network({"bandwidth": "1Gbps"}, 4)
  with pytest.raises(ValueError, match="^topology="):
    check_network(Network("ring"), 4)
  with pytest.raises(ValueError, match="^hardware="):
    check_network(Network(flat(), "h100"), 4)


def test_check_network_accepts_edges_and_normalises():
  net = check_network(network(
      topology="hierarchical", group_size=2, speeds=[1, 1, 2, 2],
      stragglers=Stragglers(0.1, "backup", backups=3),
      faults=Faults(1.0, [[3, 0, 1]], [[0, 0]], 0.0)), 4)
  assert net.faults.windows == ((3, 0, 1),)
  assert net.faults.failures == ((0, 0),)
  assert net.stragglers == Stragglers(0.1, "backup", 0.9, 3)
  # Backups only count under the backup mitigation.
  check_network(network(stragglers=Stragglers(backups=9)), 4)


# ------------------------------------------------------- NetParams functions


def test_step_seconds_without_jitter_is_base_over_speed():
  fps = _clock.flops_per_step(50_000_000, 2048)
  p = params(W, hw="a100", mfu=0.5, speeds="1,2,0.5,4,1,3", flops_per_step=fps)
  base = 6 * 50_000_000 * 2048 / (312e12 * 0.5)
  times = np.asarray(at_steps(p)[0])
  assert times.shape == (STEPS, W) and times.dtype == np.float32
  np.testing.assert_allclose(
      times[[0, 1, 17]],
      np.tile([base / 1, base / 2, base / 0.5, base / 4, base, base / 3],
              (3, 1)), rtol=1e-6)
  fixed = params(W, hw="0.25s", speeds=[1, 2, 5, 0.5, 1, 1])
  np.testing.assert_allclose(np.asarray(at_steps(fixed)[0])[3],
                             [0.25, 0.125, 0.05, 0.5, 0.25, 0.25], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(at_steps(params(W))[0]), 0.0)


def test_step_seconds_jitter_is_a_mean_one_lognormal():
  sigma = 0.3
  p = params(W, hw="1s", stragglers=Stragglers(jitter=sigma), seed=3)
  mult = np.asarray(at_steps(p)[0], np.float64).reshape(-1)  # base 1 s
  assert mult.size == STEPS * W and np.all(mult > 0)
  assert mult.mean() == pytest.approx(1.0, abs=0.02)
  assert np.log(mult).std() == pytest.approx(sigma, rel=0.03)
  assert np.log(mult).mean() == pytest.approx(-sigma**2 / 2, abs=0.01)


def test_step_seconds_is_deterministic_per_key_and_step():
  p = params(W, hw="1s", stragglers=Stragglers(jitter=0.5), seed=11)
  a = np.asarray(at_steps(p)[0])
  np.testing.assert_array_equal(a, np.asarray(at_steps(p)[0]))
  assert not np.array_equal(a[5], a[6])
  other = params(W, hw="1s", stragglers=Stragglers(jitter=0.5), seed=12)
  assert not np.array_equal(a, np.asarray(at_steps(other)[0]))


def test_up_mask_drop_fraction():
  prob = 0.2
  p = params(W, faults=Faults(drop_prob=prob), seed=5)
  up = np.asarray(at_steps(p)[1])
  assert up.shape == (STEPS, W) and up.dtype == bool
  assert (~up).mean() == pytest.approx(prob, abs=0.015)
  np.testing.assert_array_equal(up, np.asarray(at_steps(p)[1]))
  for never, always in ((0.0, True), (1.0, False)):
    q = params(W, faults=Faults(drop_prob=never))
    assert np.all(np.asarray(at_steps(q)[1]) == always)


def test_up_mask_windows_and_failures():
  p = params(W, faults=Faults(windows=((1, 3, 6), (2, 0, 1), (1, 8, 9)),
                              failures=((3, 5), (0, 10), (3, 7))))
  up = np.asarray(jax.jit(jax.vmap(up_mask, (None, 0)))(p, jnp.arange(30)))
  for step in range(20):
    want = [step < 10,
            not (3 <= step < 6 or 8 <= step < 9),
            not 0 <= step < 1,
            step < 5,
            True, True]
    assert up[step].tolist() == want, step
  assert np.all(up[20:] == [False, True, True, False, True, True])


def ready_and_params(*, stragglers=None, faults=None):
  return params(W, stragglers=stragglers, faults=faults, seed=2)


def kept(ready, up, k):
  """The k fastest up workers, by hand."""
  order = sorted((r, i) for i, (r, u) in enumerate(zip(ready, up)) if u)
  chosen = {i for _, i in order[:k]}
  return [i in chosen for i in range(len(ready))]


def run_participants(p, up, step=0):
  _, _, active, start = at_steps(p, jnp.asarray(up))
  return np.asarray(active[step]).tolist(), float(start[step])


def test_participants_without_mitigation_waits_for_every_up_worker():
  p = ready_and_params()
  active, start = run_participants(p, ALL_UP)
  assert active == [True] * 6 and start == 6.0
  up = [True, True, True, True, False, True]    # the slowest is down
  active, start = run_participants(p, up)
  assert active == up and start == 5.0
  up = [False, True, False, True, False, False]
  active, start = run_participants(p, up)
  assert active == up and start == 2.0


@pytest.mark.parametrize("fraction", [0.5, 0.75, 0.9, 1.0, 0.01])
def test_participants_threshold_keeps_the_fastest_fraction(fraction):
  p = ready_and_params(stragglers=Stragglers(mitigation="threshold",
                                             fraction=fraction))
  ready = np.asarray(READY).tolist()
  for up in ([True] * 6, [True, False, True, True, True, True],
             [True, True, False, False, True, False]):
    k = math.ceil(fraction * sum(up))
    active, start = run_participants(p, up)
    assert active == kept(ready, up, k), (fraction, up)
    assert start == max(r for r, a in zip(ready, active) if a)


@pytest.mark.parametrize("backups", [0, 1, 2, 5])
def test_participants_backup_keeps_up_minus_backups(backups):
  p = ready_and_params(stragglers=Stragglers(mitigation="backup",
                                             backups=backups))
  ready = np.asarray(READY).tolist()
  for up in ([True] * 6, [True, False, True, True, True, True],
             [False, False, True, False, True, False]):
    k = max(sum(up) - backups, 1)
    active, start = run_participants(p, up)
    assert active == kept(ready, up, k), (backups, up)
    assert start == max(r for r, a in zip(ready, active) if a)


def test_down_workers_never_participate():
  """Worker 1 is the fastest but down."""
  up = [True, False, True, True, True, True]
  for s in (None, Stragglers(mitigation="threshold", fraction=0.5),
            Stragglers(mitigation="backup", backups=3)):
    active, _ = run_participants(ready_and_params(stragglers=s), up)
    assert not active[1]
  active, start = run_participants(
      ready_and_params(stragglers=Stragglers(mitigation="threshold",
                                             fraction=0.5)), up)
  assert active == [True, False, False, True, False, True]   # ready 3, 2, 4
  assert start == 4.0
  active, start = run_participants(ready_and_params(), [False] * 6)
  assert active == [False] * 6 and start == 0.0


def test_message_loss():
  p = ready_and_params(faults=Faults(message_loss=1.0))
  active, start = run_participants(p, ALL_UP)
  assert active == [False] * 6
  assert start == 6.0      # the barrier still waits for the kept workers
  half = ready_and_params(faults=Faults(message_loss=0.3))
  active = at_steps(half)[2]
  assert (~np.asarray(active)).mean() == pytest.approx(0.3, abs=0.03)
  np.testing.assert_array_equal(active, at_steps(half)[2])


def test_changing_numbers_keeps_the_compiled_round():
  """Bandwidth, jitter, probabilities and the mitigation are traced values."""

  def make(bw, jitter, drop, loss, mitigation, seed):
    return params(W, hw="a100", bandwidth=bw, seed=seed, flops_per_step=1e12,
                  stragglers=Stragglers(jitter, mitigation),
                  faults=Faults(drop, (), ((2, 9),), loss))

  a = make("100Mbps", 0.0, 0.0, 0.0, "none", 0)
  b = make("10Gbps", 0.4, 0.3, 0.1, "threshold", 1)
  c = make(5e6, 1.0, 1.0, 1.0, "backup", 2)
  for other in (b, c):
    assert jax.tree.structure(a) == jax.tree.structure(other)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(other)):
      assert (x.shape, x.dtype) == (y.shape, y.dtype)
  assert float(a.comm_s["sync"]) > float(b.comm_s["sync"])
  jax.block_until_ready(at_steps(a))
  compiled = _at_steps._cache_size()
  for p in (b, c):
    jax.block_until_ready(at_steps(p))
  assert _at_steps._cache_size() == compiled


def test_comm_seconds_are_the_topologys():
  p_bytes = 2_000_000
  channels = {"sync": ring_allreduce(p_bytes, 4),
              "gather": all_gather(p_bytes, 4)}
  p = params(4, bandwidth="100Mbps", latency="100ms", channels=channels)
  assert float(p.comm_s["sync"]) == pytest.approx(
      6 * hop(1e8, 0.1, p_bytes / 4), rel=1e-6)
  assert float(p.comm_s["gather"]) == pytest.approx(
      3 * hop(1e8, 0.1, p_bytes), rel=1e-6)
  counts = {"sync": jnp.int32(2), "gather": jnp.int32(1)}
  assert float(_clock.comm_seconds(p, counts)) == pytest.approx(
      12 * hop(1e8, 0.1, p_bytes / 4) + 3 * hop(1e8, 0.1, p_bytes), rel=1e-6)


# -------------------------------------------------------------------- Clock


def uniform_rounds(n, h, compute, sync):
  """n rounds of h equal steps taking ``compute`` in all, then ``sync``."""
  step_s = np.tile(np.arange(1, h + 1) * compute / h, (n, 1))
  return step_s, np.full(n, compute), np.full(n, sync)


def test_clock_without_overlap():
  c, s, h, n = 2.0, 3.0, 4, 5
  clock = Clock(overlap=False)
  out = clock.rounds(*uniform_rounds(n, h, c, s)).reshape(n, h)
  for r in range(n):
    np.testing.assert_allclose(out[r, :-1],
                               r * (c + s) + np.arange(1, h) * c / h)
    assert out[r, -1] == pytest.approx((r + 1) * (c + s))
  assert clock.now == pytest.approx(n * (c + s))
  assert clock.elapsed == pytest.approx(n * (c + s))


def test_clock_overlap_communication_bound():
  """s > c: the first round ends its compute at c; every later round waits
  for the previous sync, so round r's sync starts at c + r*s."""
  c, s, n = 1.0, 4.0, 5
  clock = Clock(overlap=True)
  out = clock.rounds(*uniform_rounds(n, 2, c, s)).reshape(n, 2)
  np.testing.assert_allclose(out[:, -1], [c + r * s for r in range(n)])
  assert clock.now == pytest.approx(c + (n - 1) * s)
  assert clock.elapsed == pytest.approx(c + n * s)
  more = clock.rounds(*uniform_rounds(1, 2, c, s))
  assert more[-1] - out[-1, -1] == pytest.approx(max(c, s))


def test_clock_overlap_compute_bound():
  """s < c: the sync hides behind the next round's compute."""
  c, s, n = 3.0, 1.0, 5
  clock = Clock(overlap=True)
  out = clock.rounds(*uniform_rounds(n, 3, c, s)).reshape(n, 3)
  np.testing.assert_allclose(out[:, -1], [(r + 1) * c for r in range(n)])
  np.testing.assert_allclose(out[2], [2 * c + 1, 2 * c + 2, 3 * c])
  assert clock.now == pytest.approx(n * c)
  assert clock.elapsed == pytest.approx(n * c + s)   # the last sync arrives


def test_clock_overlap_never_beats_either_part():
  c, s, n = 2.0, 2.5, 8
  for overlap in (False, True):
    clock = Clock(overlap)
    clock.rounds(*uniform_rounds(n, 1, c, s))
    assert clock.elapsed >= n * max(c, s) - 1e-9
  assert clock.elapsed == pytest.approx(min(c, s) + n * max(c, s))


def test_clock_tail_steps():
  clock = Clock(overlap=False)
  clock.rounds(*uniform_rounds(2, 2, 1.0, 0.5))
  out = clock.steps(np.array([0.25, 0.5, 0.75]))
  np.testing.assert_allclose(out, [3.25, 3.5, 3.75])
  assert clock.now == 3.75 and clock.elapsed == 3.75
  assert clock.steps(np.array([])).size == 0 and clock.now == 3.75
  late = Clock(overlap=True)
  late.rounds(*uniform_rounds(1, 1, 1.0, 5.0))
  np.testing.assert_allclose(late.steps([0.5, 1.0]), [1.5, 2.0])
  assert late.elapsed == 6.0           # the sync still outlasts the tail


def test_clock_state_dict_round_trip():
  a = Clock(overlap=True)
  a.rounds(*uniform_rounds(3, 2, 1.0, 2.5))
  state = a.state_dict()
  assert state == {"now": a.now, "comm_end": a.comm_end, "contacted": True}
  b = Clock(overlap=True)
  b.load_state_dict({k: np.float32(v) for k, v in state.items()})
  assert isinstance(b.now, float) and isinstance(b.comm_end, float)
  rounds = uniform_rounds(2, 2, 1.5, 0.5)
  np.testing.assert_allclose(a.rounds(*rounds), b.rounds(*rounds))
  assert (a.now, a.comm_end) == pytest.approx((b.now, b.comm_end))


def test_threshold_count_is_exact_for_exact_products():
  """ceil(0.6 x 25) = 15, not 16 from float32 rounding."""
  net = _clock.check_network(network(stragglers=Stragglers(
      mitigation="threshold", fraction=0.6)), 25)
  p = _clock.net_params(net, 25, _clock.price(net, {}, 25, 1, 0.0), 0)
  active, start = _clock.participants(p, jnp.arange(25.0), jnp.ones(25, bool),
                                      jnp.int32(0), 0)
  assert int(active.sum()) == 15 and float(start) == 14.0


def test_single_region_all_gather_is_a_regional_ring():
  s, payload = 4, 1000
  regional, wan = Link(1e6, 0.01), Link(1e3, 1.0)
  topo = Hierarchical(s, regional, wan)
  cost = topo.cost(Channel(payload, 0.0, "all_gather", s), s)
  assert cost.seconds == pytest.approx((s - 1) * (0.01 + 8 * payload / 1e6))


def test_ties_are_broken_at_random_not_by_index():
  """After a per-step barrier every worker is ready at once; a threshold must
  not always drop the same (highest-index) workers."""
  net = _clock.check_network(network(stragglers=Stragglers(
      mitigation="threshold", fraction=0.5)), 4)
  p = _clock.net_params(net, 4, _clock.price(net, {}, 4, 1, 0.0), 0)
  kept = jax.vmap(lambda s: _clock.participants(
      p, jnp.ones(4), jnp.ones(4, bool), s, 1)[0])(jnp.arange(200))
  assert set(np.asarray(kept.sum(axis=1)).tolist()) == {2}
  assert np.all(np.asarray(kept.mean(axis=0)) > 0.3)


def test_bandwidth_in_bytes_per_second_needs_a_capital_b():
  assert bandwidth("125MB/s") == 1e9 and bandwidth("1GBps") == 8e9
  assert bandwidth("100Mbps") == bandwidth("100mbps") == 1e8


def test_a_bare_small_number_is_not_taken_for_flops():
  with pytest.raises(ValueError, match="^hardware=0.5 .*'0.5s'"):
    hardware(0.5)


def test_clock_overlap_of_k_steps_waits_only_for_what_does_not_fit():
  """A sync's result needed after k = 2 steps of the next round (Streaming
  DiLoCo's tau): round r >= 1 waits s - 2c/h after its 2nd step, by hand."""
  c, s, h = 2.0, 3.0, 4
  clock = Clock(2)
  out = clock.rounds(*uniform_rounds(3, h, c, s)).reshape(3, h)
  np.testing.assert_allclose(out[0], [0.5, 1.0, 1.5, 2.0])
  np.testing.assert_allclose(out[1], [2.5, 5.0, 5.5, 6.0])   # waited 2 s
  np.testing.assert_allclose(out[2], [6.5, 9.0, 9.5, 10.0])
  assert clock.now == 10.0 and clock.elapsed == 13.0  # the last sync arrives
  # The tail needs the last result after its 2nd step too.
  np.testing.assert_allclose(clock.steps([0.5, 1.0, 1.5]), [10.5, 13.0, 13.5])
  # Compute-bound (s < 2c/h): nothing to wait for, a round costs c.
  fast = Clock(2)
  out = fast.rounds(*uniform_rounds(3, h, c, 0.5)).reshape(3, h)
  np.testing.assert_allclose(out[:, -1], [2.0, 4.0, 6.0])


def test_clock_overlap_steps_at_the_extremes():
  """0 steps is no overlap; a round's worth or more is the whole next round."""
  rounds = uniform_rounds(4, 3, 1.5, 2.5)
  for k, same_as in ((0, False), (3, True), (7, True)):
    a, b = Clock(k), Clock(same_as)
    np.testing.assert_allclose(a.rounds(*rounds), b.rounds(*rounds))
    assert a.elapsed == pytest.approx(b.elapsed)


def test_price_is_the_costs_and_the_clocks_scaled_costs_in_one_call():
  """network.price: the logged costs are the model's own; with
  clock_params the clock's bytes and FLOPs scale by clock_params /
  num_params (a ring's seconds priced by hand), without it they are the
  same costs."""
  channels = {"sync": ring_allreduce(1_000_000, 4)}
  plain = check_network(network(bandwidth="1Gbps", latency="10ms",
                                hardware="h100"), 4)
  p = _clock.price(plain, channels, 4, 250_000, 6e9)
  assert p.clock_costs is p.costs and p.flops_per_step == 6e9
  assert p.step_s == pytest.approx(6e9 / (989e12 * 0.4))
  big = plain._replace(clock_params=2_500_000)       # 10x the model
  q = _clock.price(big, channels, 4, 250_000, 6e9)
  assert q.costs == p.costs and q.flops_per_step == pytest.approx(6e10)
  # a ring of 4: 2(W-1) hops of payload/W each
  expected = 6 * hop(1e9, 0.01, 10_000_000 / 4)
  assert q.clock_costs["sync"].seconds == pytest.approx(expected)
  assert p.costs["sync"].seconds == pytest.approx(6 * hop(1e9, 0.01,
                                                          1_000_000 / 4))


# ------------------------------------------------------ per-worker links
def test_a_ring_of_unequal_links_steps_at_its_slowest_hop():
  """Every step of a ring is synchronous: with per-worker links each of
  the 2(n-1) steps of an all-reduce (n-1 of an all-gather) takes the
  slowest worker's hop; the bytes are the same as on equal links."""
  links = lowbw.network.link("1Gbps,100Mbps,1Gbps,400Mbps",
                             "5ms,5ms,20ms,5ms")
  assert len(links) == 4
  reduce = ring_allreduce(1_000_000, 4)
  cost = Flat(links).cost(reduce, 4)
  slowest = max(hop(b, t, 250_000) for b, t in
                [(1e9, 0.005), (1e8, 0.005), (1e9, 0.02), (4e8, 0.005)])
  assert cost.seconds == pytest.approx(6 * slowest)
  assert cost.wire_bytes == ring_allreduce(1_000_000, 4).wire_bytes
  gather = all_gather(1_000, 4)
  assert Flat(links).cost(gather, 4).seconds == pytest.approx(
      3 * max(hop(b, t, 1_000) for b, t in
              [(1e9, 0.005), (1e8, 0.005), (1e9, 0.02), (4e8, 0.005)]))


def test_a_parameter_server_waits_for_the_slowest_workers_own_link():
  links = lowbw.network.link("1Gbps,100Mbps", "10ms")
  cost = Flat(links, "parameter_server").cost(ring_allreduce(1_000_000, 2),
                                              2)
  assert cost.seconds == pytest.approx(2 * hop(1e8, 0.01, 1_000_000))
  assert cost.wire_bytes == 1_000_000


def test_hierarchical_wan_links_per_worker_and_regional_per_region():
  net = check_network(network("1Gbps,1Gbps,1Gbps,50Mbps", "50ms",
                              topology="hierarchical", group_size=2,
                              regional_bandwidth="10Gbps,1Gbps",
                              regional_latency="1ms"), 4)
  cost = net.topology.cost(ring_allreduce(1_000_000, 4), 4)
  # a reduce-scatter/all-gather ring in each region (the slower region's),
  # then a ring of 1/2 shards across the 2 regions (the slowest WAN link)
  inside = 2 * hop(1e9, 0.001, 500_000)
  across = 2 * hop(5e7, 0.05, 250_000)
  assert cost.seconds == pytest.approx(inside + across)


@pytest.mark.parametrize("kwargs, message", [
    (dict(bandwidth="1Gbps,100Mbps,1Gbps"), r"^bandwidth='1Gbps,100Mbps,1Gbps'"
     r" is invalid: expected 4 values, one per worker, or one for every "
     r"worker \(3 given\)"),
    (dict(bandwidth="1Gbps,100Mbps", latency="1ms,2ms,3ms"),
     "^latency='1ms,2ms,3ms' is invalid: expected one value or 2"),
    (dict(bandwidth="1Gbps,0Mbps,1Gbps,1Gbps"), "^bandwidth='0Mbps' is "
     "invalid"),
    (dict(latency="1ms,2ms,3ms"), r"^latency='1ms,2ms,3ms' is invalid: "
     r"expected 4 values, one per worker"),
    (dict(topology="hierarchical", group_size=2,
          regional_bandwidth="1Gbps,1Gbps,1Gbps"), "^regional_bandwidth="
     r"'1Gbps,1Gbps,1Gbps' is invalid: expected 2 values, one per region"),
])
def test_a_link_list_of_the_wrong_length_is_refused(kwargs, message):
  with pytest.raises(ValueError, match=message):
    check_network(network(**kwargs), 4)


def test_a_traced_bandwidth_sets_every_link_or_one_per_worker():
  links = lowbw.network.link("1Gbps,100Mbps", "10ms,20ms")
  every = relinked(links, bandwidth="10Mbps")
  assert [l.bandwidth_bps for l in every] == [1e7, 1e7]
  assert [l.latency_s for l in every] == [0.01, 0.02]
  each = relinked(lowbw.network.link(), latency="1ms,2ms")
  assert [(l.bandwidth_bps, l.latency_s) for l in each] == [(1e9, 0.001),
                                                           (1e9, 0.002)]


# -- asymmetric links: a download rate (bandwidth) and an upload rate

def test_an_asymmetric_link_by_hand():
  """A ring or tree step sends and receives at once: the slower direction;
  a parameter server's upload goes at the upload rate, its download at the
  download rate; each worker's exchange likewise."""
  payload, n = 1_000_000, 4
  down, up, lat = 100e6, 20e6, 0.01
  ring = flat("100Mbps", "10ms", "ring", upload_bandwidth="20Mbps")
  assert ring.cost(ring_allreduce(payload, n), n).seconds == pytest.approx(
      2 * (n - 1) * (lat + 8 * payload / n / min(up, down)))
  ps = flat("100Mbps", "10ms", "parameter_server", upload_bandwidth="20Mbps")
  assert ps.cost(ring_allreduce(payload, n), n).seconds == pytest.approx(
      (lat + 8 * payload / up) + (lat + 8 * payload / down))
  exchange = lowbw.network.exchange(payload, 3 * payload, n)
  assert ps.cost(exchange, n).seconds_W == pytest.approx(
      (lat + 8 * payload / up + lat + 8 * 3 * payload / down,) * n)
  # One upload rate per worker: the parameter server waits for the slowest.
  each = flat("100Mbps", "10ms", "parameter_server",
              upload_bandwidth="20Mbps,5Mbps,20Mbps,20Mbps")
  assert each.cost(ring_allreduce(payload, n), n).seconds == pytest.approx(
      (lat + 8 * payload / 5e6) + (lat + 8 * payload / down))


def test_an_asymmetric_link_is_described_and_kept_by_a_sweeps_relink():
  net = lowbw.network.network("1Gbps", "10ms", upload_bandwidth="50Mbps")
  d = net.describe()
  assert d["bandwidth_bps"] == 1e9 and d["upload_bandwidth_bps"] == 50e6
  assert "upload_bandwidth_bps" not in lowbw.network.network("1Gbps").describe()
  moved = relinked(net.topology.link, bandwidth="500Mbps")
  assert (moved.bandwidth_bps, moved.upload_bps) == (500e6, 50e6)
  with pytest.raises(lowbw.ConfigError, match="^upload_bandwidth='fast'"):
    lowbw.network.network("1Gbps", upload_bandwidth="fast")
  # The setting, from Python and from the command line.
  with pytest.raises(lowbw.ConfigError, match="^upload_bandwidth='fast' is "
                     "invalid"):
    lowbw.Config(data="digits", upload_bandwidth="fast")
  from lowbw import cli
  assert cli.main(["train", "--data", "digits", "--upload-bandwidth",
                   "0Mbps"]) == 2
  with pytest.raises(lowbw.ConfigError, match="^upload_bandwidth=.*one per "
                     "link"):
    lowbw.network.network("1Gbps,1Gbps,1Gbps", upload_bandwidth="1Mbps,2Mbps")


def test_the_upload_bandwidth_setting_times_a_run():
  run = dict(data="digits", hidden="8", workers=2, steps=4, H=2,
             eval_examples=16, progress=False, latency="10ms",
             hardware="0.01s", network_profile="ideal")
  slow_up = lowbw.simulate(**run, bandwidth="100Mbps", upload_bandwidth="10Mbps")
  slow = lowbw.simulate(**run, bandwidth="10Mbps")
  # A ring's steps go at the slower direction: the same as 10 Mbit/s.
  assert slow_up.summary["sim_time_s"] == slow.summary["sim_time_s"]
  from lowbw import cli
  assert cli.main(["train", "--data", "digits", "--hidden", "8",
                   "--steps", "4", "--H", "2", "--no-plot", "--no-progress",
                   "--upload-bandwidth", "1Mbps", "--bandwidth", "1Gbps"]) == 0

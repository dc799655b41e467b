"""The memory estimate made before compiling, the worker_batch it chooses,
and the budget that refuses a run too big for the machine."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowbw
from lowbw import data, models, strategies
from lowbw.simulation import _memory

_MLP = dict(model=models.mlp(hidden=(16,)), data=data.digits(),
            strategy=strategies.diloco(H=2), batch_size=4, steps=4)


def test_residuals_are_what_the_backward_pass_keeps():
  # sin(x @ w): the pullback keeps cos(x @ w), (b, h) floats; x and w are
  # inputs, not new memory.
  def loss(p, b, k):
    return jnp.sum(jnp.sin(b["x"] @ p["w"])), {}

  w = {"w": jnp.zeros((16, 32))}
  for b in (4, 8):
    got = _memory.residual_bytes(loss, w, {"x": jnp.zeros((b, 16))},
                                 jax.random.PRNGKey(0))
    assert got == b * 32 * 4


def test_budget_forms_and_errors():
  from lowbw.config._resources import check_budget, free_bytes
  assert check_budget("8GB").bytes == 8e9
  assert check_budget("512MiB").bytes == 512 * 2 ** 20
  assert check_budget(1e9).bytes == 1e9
  free, _ = free_bytes()
  half = check_budget("50%")
  assert half.bytes == pytest.approx(free / 2, rel=0.2)
  assert "50% of" in half.source
  for bad in ("8", "8 parsecs", "0%", "150%", -1, 0, True):
    with pytest.raises(ValueError, match="memory_budget"):
      check_budget(bad)


def test_auto_computes_all_workers_at_once_when_they_fit():
  sim = lowbw.build(workers=8, compile=False, **_MLP)
  assert sim.config.worker_batch is None
  m = sim.memory
  assert m.estimate_bytes == pytest.approx(
      m.state_bytes + m.buffer_bytes + m.data_bytes + 8 * m.in_flight_all)
  # In groups a worker also holds its new state until it is written back.
  assert m.in_flight_group > m.in_flight_all
  # The state's share is exact: every worker's parameters and Adam moments,
  # plus the global parameters and outer momentum.
  params = sim.num_params * 4
  assert sim.memory.state_bytes == pytest.approx(8 * 3 * params + 2 * params,
                                                 rel=0.01)


# Activations large next to the parameters: a group of half the workers
# (which also holds its new state) needs less than all of them at once.
_WIDE = dict(_MLP, model=models.mlp(hidden=(256,)), batch_size=160)


def _budget_for_half(num_workers, **kwargs):
  """A budget that holds half the workers in flight in groups, not all."""
  m = lowbw.build(workers=num_workers, compile=False, **kwargs).memory
  half, all_ = num_workers // 2 * m.in_flight_group, (
      num_workers * m.in_flight_all)
  assert half < all_  # what the configuration is chosen for
  return m.state_bytes + m.buffer_bytes + m.data_bytes + (half + all_) / 2


def test_a_budget_that_fits_a_group_chooses_the_largest_group_that_fits():
  budget = _budget_for_half(8, **_WIDE)
  sim = lowbw.build(workers=8, memory_budget=budget, compile=False,
                    **_WIDE)
  assert sim.config.worker_batch == 4
  assert sim.memory.estimate_bytes <= budget
  # An explicit worker_batch is kept, and "all" computes all at once.
  assert lowbw.build(workers=8, worker_batch=2, compile=False,
                     **_MLP).config.worker_batch == 2
  assert lowbw.build(workers=8, worker_batch="all", compile=False,
                     **_MLP).config.worker_batch is None


def test_a_run_too_big_for_the_budget_is_refused_before_compiling():
  with pytest.raises(ValueError, match=r"memory_budget=.*needs about .* more "
                     r"than the budget"):
    lowbw.build(workers=8, memory_budget="100kB", **_MLP)
  # A strategy that communicates every step cannot compute in groups.
  with pytest.raises(ValueError, match="memory_budget") as err:
    lowbw.build(**{**_MLP, "strategy": strategies.sparta(p=0.1)},
                workers=8, memory_budget="100kB")
  assert "worker_batch" not in str(err.value)


def test_auto_grouping_gives_the_all_at_once_run_and_is_logged(tmp_path):
  grouped = lowbw.build(workers=4, memory_budget=_budget_for_half(
      4, **_WIDE), **_WIDE)
  assert grouped.config.worker_batch == 2
  a = grouped.run(seed=0, out=str(tmp_path))
  b = lowbw.build(workers=4, worker_batch="all", **_WIDE).run(seed=0)
  for x, y in zip(jax.tree.leaves(a.params), jax.tree.leaves(b.params)):
    np.testing.assert_allclose(x, y, rtol=1e-5, atol=1e-6)
  written = json.loads((tmp_path / "config.json").read_text())
  assert written["worker_batch"] == 2
  assert written["memory"]["estimate_bytes"] == grouped.memory.estimate_bytes


@pytest.mark.parametrize("strategy, net", [
    (strategies.diloco(H=5), "default"), (strategies.ddp(), None),
    (strategies.async_diloco(H=5), lowbw.network.network(
        hardware="1s", speeds=[1, 0.5, 1, 1]))], ids=["diloco", "ddp",
                                                      "async_diloco"])
def test_per_step_outputs_are_counted_as_the_chunk_holds_them(strategy, net):
  """The estimate's bytes per step equal the compiled chunk's buffer of
  per-step outputs (its shapes, from jax.eval_shape), per step."""
  kw = ({} if net == "default" else {"clock": False} if net is None else
        {"network": net})
  sim = lowbw.build(**{**_MLP, "strategy": strategy, "steps": 20},
                    workers=4, compile=False, **kw)
  state, sampler, netp, _ = sim.initial(0)
  out = jax.eval_shape(sim.programs.chunk, state, sampler, 1, netp)[1]
  c = sim.config
  held = _memory.nbytes(out.steps) / (c.rounds_per_chunk * c.period)
  kept, _ = _memory.per_step_bytes(c, sim.metric_names,
                                   sim.facts.reports["local"])
  assert kept == held
  assert sim.memory.buffer_bytes >= 3 * c.rounds_per_chunk * c.period * held


def test_h_and_steps_of_a_billion_are_refused_before_allocating():
  """Every step of a chunk keeps its outputs until the chunk ends: with
  H = 10^9 one round's buffers alone are tens of GB."""
  with pytest.raises(ValueError, match=r"memory_budget=.*GB of per-step "
                     r"outputs.*largest part is per-step outputs: lower H "
                     r"\(1000000000\)"):
    lowbw.build(**{**_MLP, "strategy": strategies.diloco(H=10 ** 9),
                   "steps": 10 ** 9}, workers=2, memory_budget="16GB",
                compile=False)


def test_a_fleet_traces_arrays_are_counted(tmp_path):
  """Every row of a speed trace is a segment on the device (its start, W
  step times, per priced channel its seconds and, for exchanges, W more):
  the estimate holds the arrays the run makes (``Segments``), counting
  every channel as an exchange at most."""
  rows = 1000
  path = tmp_path / "speeds.csv"
  path.write_text("time,a,b\n" + "".join(f"{i},1,{1 + i % 2}\n"
                                         for i in range(rows)))
  kw = dict(_MLP, workers=2, compile=False)
  plain = lowbw.build(**kw, network=lowbw.network.network(hardware="1s"))
  traced = lowbw.build(**kw, network=lowbw.network.network(
      hardware="1s", speeds=str(path)))
  held = _memory.nbytes(traced.net_params(traced.config.network, 0).segments)
  counted = traced.memory.buffer_bytes - plain.memory.buffer_bytes
  assert held >= 4 * rows * 3  # the arrays the estimate is checked on
  assert held <= counted < 3 * held

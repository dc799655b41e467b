"""Asynchronous DiLoCo against an event-driven reference written here from
the paper (Liu et al. 2024, "Asynchronous Local-SGD Training for Language
Modeling", arXiv 2401.09135), and against synchronous DiLoCo on an equal
fleet.

The reference keeps one parameter tree per worker in Python lists and walks
the fleet's events in continuous simulated time: a worker's inner steps end
every ``step_s`` seconds, after its H-th it sends anchor - theta, the server
applies the arrivals of one instant as one outer step on their mean, and the
worker restarts from the new model. Every example of the dataset is the same,
so each worker's gradient depends on its parameters only and the reference
needs no batches.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import strategies
from lowbw import network as net_lib

import ideal

W, H, TICKS, BATCH = 3, 3, 26, 4
SPEEDS = (1.0, 0.5, 0.25)       # steps of 1 s, 2 s and 4 s
OUTER_LR, MOMENTUM = 0.7, 0.9


def _problem():
  model = lowbw.models.mlp(hidden=(6,), num_classes=3)
  x = np.tile(np.linspace(-1, 1, 5, dtype=np.float32), (40, 1))
  data = lowbw.data.arrays(x, np.ones(40, np.int64))
  return model, data


def _fleet():
  """Equal, near-instant links: the events' order is the compute's."""
  return ideal.network("1000Tbps", "0ms", hardware="1s", speeds=SPEEDS)


def _run(strategy):
  model, data = _problem()
  sim = lowbw.build(model=model, data=data, strategy=strategy,
                    workers=W, batch_size=BATCH, steps=TICKS,
                    network=_fleet())
  params0 = sim.programs.global_params(sim.initial(0)[0])
  return sim.run(0), params0, model, data


def _delayed_nesterov_arrival(g, m, pending, count, every):
  """One arrival of Algorithm 2: the model moves by g / N at once, the
  momentum every N-th arrival by the buffered ones (their sum / N)."""
  pending = jax.tree.map(lambda p, x: p + x / every, pending, g)
  count += 1
  step = jax.tree.map(lambda x: x / every, g)
  if count == every:
    m = jax.tree.map(lambda m, p: MOMENTUM * m + p, m, pending)
    step = jax.tree.map(lambda s, m: s + MOMENTUM * m, step, m)
    pending, count = jax.tree.map(jnp.zeros_like, pending), 0
  return step, m, pending, count


def _cgad_gate(tau, alpha, cutoff):
  """CGAD's sigma(tau) (arXiv 2605.09126): a cosine gate reaching 0 at the
  cutoff, times exp(-alpha tau)."""
  gamma = 0.5 * (1 + np.cos(np.pi * tau / cutoff)) if tau < cutoff else 0.0
  return gamma * np.exp(-alpha * tau)


def _adam_arrival(g, adam, tau, cgad):
  """One outer Adam step (optax's form) on sigma(tau) x g."""
  lr, b1, b2, eps = CGAD_ADAM
  sigma = _cgad_gate(tau, *cgad)
  m, v, t = adam
  t += 1
  m = jax.tree.map(lambda m, x: b1 * m + (1 - b1) * sigma * x, m, g)
  v = jax.tree.map(lambda v, x: b2 * v + (1 - b2) * (sigma * x) ** 2, v, g)
  step = jax.tree.map(lambda m, v: m / (1 - b1 ** t) / (
      jnp.sqrt(v / (1 - b2 ** t)) + eps), m, v)
  return jax.tree.map(lambda s: lr * s, step), (m, v, t)


def _reference(params0, model, data, inner, dylu=False, every=0,
               staleness_scale=False, cgad=None):
  """Events in continuous time; returns the server's model after TICKS
  seconds and the staleness of every arrival. ``cgad=(alpha, cutoff)``:
  the outer step is Adam on the gated mean, its age the arrivals' mean
  staleness."""
  batch = {k: jnp.asarray(v[:BATCH]) for k, v in data.train.items()}
  grad = jax.jit(jax.grad(lambda p: model.loss(p, batch,
                                               jax.random.PRNGKey(0))[0]))
  steps_s = [1.0 / v for v in SPEEDS]
  rounds = [max(1, int(np.floor(H * v / max(SPEEDS)))) if dylu else H
            for v in SPEEDS]
  theta = [params0] * W
  anchor = [params0] * W
  opt = [inner.init(params0) for _ in range(W)]
  done = [0] * W
  next_end = list(steps_s)              # when each worker's next step ends
  server, version, pulled = params0, 0, [0] * W
  m = jax.tree.map(jnp.zeros_like, params0)
  pending, count, stale_log = jax.tree.map(jnp.zeros_like, params0), 0, []
  adam = (m, m, 0)
  while True:
    now = min(next_end)
    if now > TICKS + 1e-9:
      return server, stale_log
    arriving = []
    for w in range(W):
      if abs(next_end[w] - now) < 1e-9:
        upd, opt[w] = inner.update(grad(theta[w]), opt[w], theta[w])
        theta[w] = optax.apply_updates(theta[w], upd)
        done[w] += 1
        next_end[w] += steps_s[w]
        if done[w] == rounds[w]:
          arriving.append(w)
    if not arriving:
      continue
    stale = [version - pulled[w] for w in arriving]
    stale_log.append(stale)
    scale = [1.0 / (1 + s) if staleness_scale else 1.0 for s in stale]
    g = jax.tree.map(lambda *d: sum(d) / len(arriving), *[
        jax.tree.map(lambda a, t: c * (a - t), anchor[w], theta[w])
        for w, c in zip(arriving, scale)])
    if cgad:
      step, adam = _adam_arrival(g, adam, np.mean(stale), cgad)
    elif every:  # Delayed Nesterov: the instant's arrivals one at a time
      step = jax.tree.map(jnp.zeros_like, g)
      for _ in arriving:
        (one, m, pending, count) = _delayed_nesterov_arrival(
            g, m, pending, count, every)
        step = jax.tree.map(lambda s, o: s + o, step, one)
    else:  # Nesterov SGD on the arrivals' mean
      m = jax.tree.map(lambda m, x: MOMENTUM * m + x, m, g)
      step = jax.tree.map(lambda x, m: x + MOMENTUM * m, g, m)
    lr = 1.0 if cgad else OUTER_LR   # Adam's step carries its own rate
    server = jax.tree.map(lambda s, d: s - lr * d, server, step)
    version += 1
    for w in arriving:
      theta[w] = anchor[w] = server
      pulled[w], done[w] = version, 0


def test_delayed_nesterov_with_several_arrivals_is_them_one_at_a_time():
  """An update of n arrivals of the mean g equals n updates of one arrival
  (a plain loop of Algorithm 2), also when they cross one or several N-th
  arrivals: only the arrivals that complete N enter the momentum."""
  every = 2
  dn = strategies.delayed_nesterov(OUTER_LR, MOMENTUM, every=every)
  update = jax.jit(lambda g, s, n: dn.update(g, s, arrivals=n))
  rng = np.random.default_rng(0)
  state, m = dn.init(jnp.zeros(3)), np.zeros(3, np.float32)
  pending, count = np.zeros(3, np.float32), 0
  for n in (3, 1, 2, 5, 1, 1, 4, 3):
    g = rng.normal(size=3).astype(np.float32)
    step, state = update(jnp.asarray(g), state, n)
    want = np.zeros(3, np.float32)
    for _ in range(n):
      one, m, pending, count = _delayed_nesterov_arrival(
          g, m, pending, count, every)
      want += one
    np.testing.assert_allclose(step, -OUTER_LR * want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.momentum, m, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state.pending, pending, rtol=1e-5, atol=1e-6)
    assert int(state.arrivals) == count
  # The figures of the report: three arrivals of 1 from zero, N = 2.
  step, state = dn.update(jnp.ones(1), dn.init(jnp.zeros(1)), arrivals=3)
  np.testing.assert_allclose(step, [-0.7 * (1.5 + 0.9)], rtol=1e-6)
  np.testing.assert_allclose(state.momentum, [1.0])
  assert int(state.arrivals) == 1


@pytest.mark.parametrize("options", [
    {}, {"delayed_nesterov": 2}, {"dylu": True}, {"staleness_scale": True}],
    ids=["plain", "delayed_nesterov", "dylu", "staleness_scale"])
def test_async_diloco_matches_an_event_driven_reference(options):
  inner = optax.adam(0.05)
  result, params0, model, data = _run(strategies.async_diloco(
      inner=inner, H=H, **options))
  server, stale_log = _reference(
      params0, model, data, inner, dylu=options.get("dylu", False),
      every=options.get("delayed_nesterov", 0),
      staleness_scale=options.get("staleness_scale", False))
  assert len(stale_log) >= 4  # several outer steps, some of them stale
  assert max(max(s) for s in stale_log) >= 1 or options.get("dylu")
  for got, want in zip(jax.tree.leaves(result.params),
                       jax.tree.leaves(server)):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  h = result.history
  arrivals = h["strategy_arrivals"][~np.isnan(h["strategy_arrivals"])]
  assert arrivals.max() <= W


CGAD_ADAM = (0.02, 0.9, 0.99, 1e-3)   # lr, b1, b2, eps


def test_cgad_matches_the_event_driven_reference():
  """CGAD's gated Adam as the server's outer step: each outer step's
  pseudo-gradient scaled by sigma of its age before Adam (the ages here
  reach 2, past the gate's middle)."""
  inner = optax.adam(0.05)
  lr, b1, b2, eps = CGAD_ADAM
  outer = strategies.cgad(0.2, 3.0, lr, b1=b1, b2=b2, eps=eps)
  result, params0, model, data = _run(strategies.async_diloco(
      inner=inner, outer=outer, H=H))
  server, stale_log = _reference(params0, model, data, inner,
                                 cgad=(0.2, 3.0))
  assert max(max(s) for s in stale_log) >= 2
  for got, want in zip(jax.tree.leaves(result.params),
                       jax.tree.leaves(server)):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_cgad_without_a_gate_is_async_diloco_with_plain_adam():
  """sigma = 1 at every age (alpha 0, no cutoff): the plain Adam outer step
  of async_diloco, bit for bit."""
  lr, b1, b2, eps = CGAD_ADAM
  runs = [_run(strategies.async_diloco(inner=optax.adam(0.05), outer=outer,
                                       H=H))[0]
          for outer in (strategies.cgad(0.0, 0.0, lr, b1=b1, b2=b2, eps=eps),
                        strategies.outer_optimizer(lr, kind="adam", b1=b1,
                                                   b2=b2, eps=eps))]
  for a, b in zip(jax.tree.leaves(runs[0].params),
                  jax.tree.leaves(runs[1].params)):
    np.testing.assert_array_equal(a, b)
  gated = _run(strategies.async_diloco(
      inner=optax.adam(0.05), H=H,
      outer=strategies.cgad(0.5, 2.0, lr, b1=b1, b2=b2, eps=eps)))[0]
  assert any(np.abs(a - b).max() > 1e-4 for a, b in zip(
      jax.tree.leaves(gated.params), jax.tree.leaves(runs[1].params)))


def _digits_run(strategy, speeds, steps=40, faults=None):
  net = ideal.network("100Mbps", "20ms", hardware="0.5s", speeds=speeds,
                      faults=faults)
  return lowbw.simulate(
      model=lowbw.models.mlp(hidden=(16,), num_classes=10),
      data=lowbw.data.digits(), strategy=strategy, workers=4,
      batch_size=8, steps=steps, network=net, eval_every=20, seed=1)


def test_async_diloco_is_diloco_on_an_equal_fleet_and_faster_on_an_unequal():
  equal = [1.0] * 4
  sync = _digits_run(strategies.diloco(H=10), equal)
  async_ = _digits_run(strategies.async_diloco(H=10), equal)
  np.testing.assert_allclose(async_.history["eval_loss"],
                             sync.history["eval_loss"], rtol=1e-5)
  np.testing.assert_allclose(async_.history["train_loss"],
                             sync.history["train_loss"], rtol=1e-5)
  # Every round's four arrivals are one outer step: W uploads and
  # downloads of the whole model, each over the worker's own link.
  model_bytes = 4 * sum(x.size for x in jax.tree.leaves(async_.params))
  assert async_.history["sent_bytes"][-1] == 4 * 4 * model_bytes
  assert async_.history["received_bytes"][-1] == 4 * 4 * model_bytes
  unequal = [1.0, 1.0, 1.0, 0.25]
  slow_sync = _digits_run(strategies.diloco(H=10), unequal)
  slow_async = _digits_run(strategies.async_diloco(H=10), unequal)
  assert (slow_async.history["sim_time_s"][-1] <
          0.5 * slow_sync.history["sim_time_s"][-1])
  # Per worker: the three fast workers arrive about four times as often as
  # the slow one; each arrival one upload and one download of the model.
  sent = np.asarray(slow_async.summary["sent_bytes_per_worker"])
  assert np.all(sent % model_bytes == 0)
  assert sent[0] == sent[1] == sent[2] >= 3 * sent[3] > 0
  np.testing.assert_array_equal(
      slow_async.summary["received_bytes_per_worker"], sent)
  assert sent.sum() == slow_async.history["sent_bytes"][-1]


def test_async_diloco_refuses_what_it_does_not_model():
  model, data = _problem()
  kw = dict(model=model, data=data, workers=W, batch_size=BATCH,
            steps=TICKS)
  strategy = strategies.async_diloco(H=H)
  with pytest.raises(ValueError, match="hardware"):
    lowbw.build(strategy=strategy, network=ideal.network(hardware=None),
                **kw)
  with pytest.raises(ValueError, match="drop_prob=0.1.*windows"):
    lowbw.build(strategy=strategy, network=ideal.network(
        hardware="1s", faults=net_lib.Faults(drop_prob=0.1)), **kw)
  with pytest.raises(ValueError, match="byzantine"):
    lowbw.build(strategy=strategy, network=ideal.network(
        hardware="1s", faults=net_lib.Faults(byzantine=(1,))), **kw)
  with pytest.raises(ValueError, match="mitigation"):
    lowbw.build(strategy=strategy, network=ideal.network(
        hardware="1s", stragglers=net_lib.Stragglers(
            jitter=0.1, mitigation="threshold", fraction=0.5)), **kw)
  with pytest.raises(ValueError, match="worker_batch"):
    lowbw.build(strategy=strategy, worker_batch=1, **kw)
  with pytest.raises(ValueError, match="delayed_nesterov"):
    strategies.async_diloco(delayed_nesterov=-1)
  with pytest.raises(ValueError, match="dylu"):
    strategies.async_diloco(dylu="yes")
  with pytest.raises(ValueError, match="staleness_scale"):
    strategies.async_diloco(staleness_scale=1)
  with pytest.raises(ValueError, match="outer"):
    strategies.async_diloco(outer=optax.sgd(0.7), delayed_nesterov=2)
  with pytest.raises(ValueError, match="dylu_weighted.*needs dylu"):
    strategies.diloco(dylu_weighted=True)
  with pytest.raises(ValueError, match="dylu_weighted.*two aggregations"):
    strategies.diloco(dylu=True, dylu_weighted=True, robust="median")


@pytest.mark.parametrize("weighted", [False, True])
def test_diloco_with_time_budgets_matches_a_per_worker_loop(weighted):
  """DyLU on synchronous DiLoCo (arXiv 2401.09135): in each round of H
  steps worker w takes floor(H x v_w / v_max) inner steps; the outer step
  averages every worker's pseudo-gradient (optionally weighted by the steps
  each took); the round lasts as long as the fastest worker's H steps."""
  inner = optax.adam(0.05)
  strategy = strategies.diloco(inner=inner, H=4, dylu=True,
                               dylu_weighted=weighted)
  result, params0, model, data = _run(strategy)
  batch = {k: jnp.asarray(v[:BATCH]) for k, v in data.train.items()}
  grad = jax.jit(jax.grad(lambda p: model.loss(p, batch,
                                               jax.random.PRNGKey(0))[0]))
  server = params0
  m = jax.tree.map(jnp.zeros_like, params0)
  opt = [inner.init(params0) for _ in range(W)]
  for _ in range(TICKS // 4):
    thetas = []
    steps = [int(4 * v / max(SPEEDS)) for v in SPEEDS]
    for w, h in enumerate(steps):
      theta = server
      for _ in range(h):
        upd, opt[w] = inner.update(grad(theta), opt[w], theta)
        theta = optax.apply_updates(theta, upd)
      thetas.append(theta)
    a = steps if weighted else [1] * W
    g = jax.tree.map(lambda s, *t: sum(
        c * (s - x) for c, x in zip(a, t)) / sum(a), server, *thetas)
    m = jax.tree.map(lambda m, x: MOMENTUM * m + x, m, g)
    server = jax.tree.map(lambda s, x, m: s - OUTER_LR * (x + MOMENTUM * m),
                          server, g, m)
  for got, want in zip(jax.tree.leaves(result.params),
                       jax.tree.leaves(server)):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  # Six rounds of 4 s (the fastest worker's four 1 s steps; the slowest
  # takes one 4 s step) and the two steps left over, plus the syncs.
  sim = result.history["sim_time_s"][-1]
  assert 26.0 <= sim < 26.01


def test_a_worker_down_for_a_window_loses_its_round_and_pulls_the_model():
  """Worker 0 is down for ticks 5 to 14 of rounds of 10: the steps of its
  round are lost and the server applies the others' arrivals without it.
  Back at tick 15 it downloads the model (on its own link, counted in
  received_bytes), which takes that tick and a little of the next, then
  takes a round of 10 steps: ticks 17 to 26."""
  run = _digits_run(strategies.async_diloco(H=10), [1.0] * 4,
                    faults=net_lib.Faults(windows=((0, 5, 15),)))
  model_bytes = 4 * sum(x.size for x in jax.tree.leaves(run.params))
  arrivals = np.diff(run.history["sent_bytes"], prepend=0.0) / model_bytes
  ticks = np.flatnonzero(arrivals)
  assert list(ticks) == [9, 19, 26, 29, 36, 39]
  np.testing.assert_array_equal(arrivals[ticks], [3, 3, 1, 3, 1, 3])
  # Two arrivals' downloads and the one of its return.
  received = run.summary["received_bytes_per_worker"]
  assert received[0] == 3 * model_bytes < received[1]
  assert np.isfinite(run.summary["final_eval_loss"])

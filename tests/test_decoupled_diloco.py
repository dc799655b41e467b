"""Decoupled DiLoCo against an event-driven reference of its syncer written
here from the paper (Douillard et al. 2026, "Decoupled DiLoCo for Resilient
Distributed Pre-training", arXiv 2604.21428), against DiLoCo and
asynchronous DiLoCo in its limits, with learners that fail and come back.

The reference keeps one parameter tree per learner in Python lists and
walks the events in continuous simulated time: a learner's inner steps end
every ``step_s`` seconds; after its last step of the round its
pseudo-gradient is held by the syncer; once the held ones reach the quorum
(a count and a share of a full round's tokens) the syncer opens the grace
window; when it closes (or every learner is held) it merges them, weighted
by the tokens each processed, with an outer Nesterov step, and they restart
from the new model. Every example is the same, so each learner's gradient
depends on its parameters only and the reference needs no batches.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import network as net_lib
from lowbw import strategies

import ideal

W, H, TICKS, BATCH = 3, 3, 30, 4
SPEEDS = (1.0, 0.5, 0.25)       # steps of 1 s, 2 s and 4 s
OUTER_LR, MOMENTUM = 0.7, 0.9


def _problem():
  model = lowbw.models.mlp(hidden=(6,), num_classes=3)
  x = np.tile(np.linspace(-1, 1, 5, dtype=np.float32), (40, 1))
  return model, lowbw.data.arrays(x, np.ones(40, np.int64))


def _run(strategy, faults=None, speeds=SPEEDS, steps=TICKS):
  model, data = _problem()
  net = ideal.network("1000Tbps", "0ms", hardware="1s", speeds=speeds,
                      faults=faults)
  sim = lowbw.build(model=model, data=data, strategy=strategy, workers=W,
                    batch_size=BATCH, steps=steps, network=net)
  params0 = sim.programs.global_params(sim.initial(0)[0])
  return sim.run(0), params0, model, data


class _Syncer:
  """The syncer's rule: quorum (count, token share), grace window (seconds
  or a fraction of the time since the last merge), token weights."""

  def __init__(self, count, tokens, grace, adaptive, weighted):
    self.count, self.tokens, self.grace = count, tokens, grace
    self.adaptive, self.weighted = adaptive, weighted
    self.window_end, self.last_merge = None, 0.0

  def due(self, now, held, tokens):
    """Whether the held learners merge at ``now``."""
    met = len(held) >= min(self.count, W) and (
        sum(tokens[w] for w in held) >= self.tokens * H * W - 1e-9)
    if met and self.window_end is None:
      grace = self.grace * (now - self.last_merge) if self.adaptive else (
          self.grace)
      self.window_end = now + grace
    if self.window_end is None:
      return False
    return now >= self.window_end - 1e-9 or len(held) == W

  def merged(self, now):
    self.window_end, self.last_merge = None, now


class _Learner:
  """One learner: its parameters, anchor and optimizer state, its round,
  and the message it has out (what it sent, its tokens, when it reaches
  the syncer)."""

  def __init__(self, params0, inner, step_s, rounds):
    self.theta = self.anchor = params0
    self.opt, self.step_s, self.rounds = inner.init(params0), step_s, rounds
    self.done, self.next_end, self.blocked = 0, step_s, False
    self.sent = self.tokens = self.arrives = None


def _merge(learners, held, server, m, weighted):
  """The token-weighted mean of the held learners' anchor - sent, then
  the outer Nesterov step; returns the new model and momentum."""
  weight = [float(learners[w].tokens) if weighted else 1.0 for w in held]
  g = jax.tree.map(lambda *d: sum(d) / sum(weight), *[
      jax.tree.map(lambda a, t: c * (a - t), learners[w].anchor,
                   learners[w].sent) for w, c in zip(held, weight)])
  m = jax.tree.map(lambda m, x: MOMENTUM * m + x, m, g)
  return jax.tree.map(lambda s, x, m: s - OUTER_LR * (x + MOMENTUM * m),
                      server, g, m), m


def _reference(params0, model, data, inner, syncer, dylu=False,
               wait=False):
  """Events in continuous time; returns the syncer's model after TICKS
  seconds and each merge's (time, learners). A learner sends its round
  and goes on (``wait``: it waits for its merge); one that finishes a
  round while its message is out waits, and sends again at the merge
  (that message reaches the syncer a step of the fastest learner later:
  the engine's resolution)."""
  batch = {k: jnp.asarray(v[:BATCH]) for k, v in data.train.items()}
  grad = jax.jit(jax.grad(lambda p: model.loss(p, batch,
                                               jax.random.PRNGKey(0))[0]))
  rounds = [max(1, int(np.floor(H * v / max(SPEEDS)))) if dylu else H
            for v in SPEEDS]
  ls = [_Learner(params0, inner, 1.0 / v, r) for v, r in zip(SPEEDS, rounds)]
  server, m, merges = params0, jax.tree.map(jnp.zeros_like, params0), []
  while True:
    events = [x.next_end for x in ls if not x.blocked] + [
        x.arrives for x in ls if x.arrives is not None] + (
        [syncer.window_end] if syncer.window_end else [])
    now = min(events)
    if now > TICKS + 1e-9:
      return server, merges
    for x in ls:
      if not x.blocked and abs(x.next_end - now) < 1e-9:
        _step(x, grad, inner, now, wait)
      if x.arrives is not None and x.arrives <= now + 1e-9:
        x.arrives = None     # held by the syncer
    held = [w for w, x in enumerate(ls) if x.sent is not None and
            x.arrives is None]
    if not held or not syncer.due(now, held, [x.tokens for x in ls]):
      continue
    server, m = _merge(ls, held, server, m, syncer.weighted)
    merges.append((now, held))
    for w in held:
      _restart(ls[w], server, now)
    syncer.merged(now)


def _step(x, grad, inner, now, wait):
  upd, x.opt = inner.update(grad(x.theta), x.opt, x.theta)
  x.theta = optax.apply_updates(x.theta, upd)
  x.done += 1
  x.next_end += x.step_s
  if x.done < x.rounds:
    return
  if x.sent is not None or wait:    # a message is out, or it waits
    x.blocked = True
  if x.sent is None:
    x.sent, x.tokens, x.done = x.theta, x.done, 0


def _restart(x, server, now):
  """After its merge: the new model plus what it computed since it sent;
  a learner waiting with a finished round sends it."""
  x.theta = jax.tree.map(lambda g, t, s: g + (t - s), server, x.theta,
                         x.sent)
  x.anchor, x.sent = server, None
  if x.blocked:
    x.blocked, x.next_end = False, now + x.step_s
    if x.done:  # a round finished while the last message was out
      x.sent, x.tokens, x.done, x.arrives = x.theta, x.done, 0, now + 1.0


RULES = {
    # quorum 2 of 3 with uneven rounds (DyLU: 3, 1 and 1 steps): token
    # weights 3 : 1 : 1.
    "quorum_2_token_weighted": (dict(quorum=2, token_quorum=0.0, grace=0.0,
                                     adaptive_grace=False, dylu=True),
                                (2, 0.0, 0.0, False, True)),
    # one learner's tokens are not enough; a fixed 2 s grace window.
    "token_quorum_and_fixed_grace": (
        dict(quorum=1, token_quorum=0.5, grace=2.0, adaptive_grace=False),
        (1, 0.5, 2.0, False, True)),
    # the window is the time since the last merge (whole seconds, so
    # that it ends at a tick's end); a plain mean.
    "adaptive_grace_plain_mean": (
        dict(quorum=1, token_quorum=0.0, grace=1.0, token_weighted=False),
        (1, 0.0, 1.0, True, False)),
    # two learners: the fast one finishes another round before a second
    # message arrives, waits, and sends it at the merge.
    "quorum_2_waits_and_resends": (
        dict(quorum=2, token_quorum=0.0, grace=0.0, adaptive_grace=False),
        (2, 0.0, 0.0, False, True)),
    # the learners wait for their merges (wait_for_merge).
    "waiting_learners_quorum_2": (
        dict(quorum=2, token_quorum=0.5, grace=1.0, adaptive_grace=False,
             wait_for_merge=True), (2, 0.5, 1.0, False, True)),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_decoupled_diloco_matches_an_event_driven_syncer(rule):
  options, syncer = RULES[rule]
  inner = optax.adam(0.05)
  result, params0, model, data = _run(strategies.decoupled_diloco(
      inner=inner, H=H, **options))
  server, merges = _reference(params0, model, data, inner,
                              _Syncer(*syncer), options.get("dylu", False),
                              options.get("wait_for_merge", False))
  assert len(merges) >= 3
  for got, want in zip(jax.tree.leaves(result.params),
                       jax.tree.leaves(server)):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  # Each merge's learners upload the model once each: the merges happen
  # when and with whom the reference's do.
  model_bytes = 4 * sum(x.size for x in jax.tree.leaves(params0))
  sent = np.diff(result.history["sent_bytes"], prepend=0.0) / model_bytes
  np.testing.assert_array_equal(sent[sent > 0],
                                [len(who) for _, who in merges])
  np.testing.assert_allclose(result.history["sim_time_s"][sent > 0],
                             [t for t, _ in merges], atol=1e-4)


def _digits_run(strategy, speeds, steps=40, faults=None):
  net = ideal.network("100Mbps", "20ms", hardware="0.5s", speeds=speeds,
                      faults=faults)
  return lowbw.simulate(
      model=lowbw.models.mlp(hidden=(16,), num_classes=10),
      data=lowbw.data.digits(), strategy=strategy, workers=4,
      batch_size=8, steps=steps, network=net, eval_every=20, seed=1)


def test_decoupled_diloco_limits_are_diloco_and_async_diloco():
  """Quorum = every learner, no token quorum, no grace window, equal
  learners: DiLoCo's losses (to float32 rounding: the token-weighted mean
  divides a weighted sum; the learners' exchanges end within the step
  they send, so their overlap never starts). Learners that wait for their
  merges, quorum 1, no grace, no token weights on an uneven fleet:
  asynchronous DiLoCo's schedule and bytes exactly, its losses to float32
  rounding (the two programs are compiled apart)."""
  equal = [1.0] * 4
  sync = _digits_run(strategies.diloco(H=10), equal)
  everyone = _digits_run(strategies.decoupled_diloco(
      H=10, quorum=4, token_quorum=0.0, grace=0.0, adaptive_grace=False),
      equal)
  for key in ("eval_loss", "train_loss"):
    np.testing.assert_allclose(everyone.history[key], sync.history[key],
                               rtol=1e-5)
  uneven = [1.0, 1.0, 0.5, 0.25]
  async_ = _digits_run(strategies.async_diloco(H=10), uneven)
  one = _digits_run(strategies.decoupled_diloco(
      H=10, quorum=1, token_quorum=0.0, grace=0.0, adaptive_grace=False,
      token_weighted=False, wait_for_merge=True), uneven)
  for key in ("sim_time_s", "sent_bytes"):
    np.testing.assert_array_equal(one.history[key], async_.history[key])
  for key in ("eval_loss", "train_loss"):
    np.testing.assert_allclose(one.history[key], async_.history[key],
                               rtol=1e-6)
  # Bytes: every arrival one upload and one download of the whole model,
  # over the learner's own link (4 learners x 4 rounds on the equal fleet).
  model_bytes = 4 * sum(x.size for x in jax.tree.leaves(everyone.params))
  assert everyone.history["sent_bytes"][-1] == 4 * 4 * model_bytes
  assert everyone.history["received_bytes"][-1] == 4 * 4 * model_bytes


def test_fragments_limit_is_streaming_diloco_without_delay_or_mixing():
  """Fragments, quorum = every learner, no token quorum, no grace window,
  equal learners: each fragment merges at its step (p+1) x H / P of every
  round with every learner, and the learners take the merged fragment:
  Streaming DiLoCo with no delay and no mixing (alpha 0), to float32
  rounding (the token-weighted mean). Bytes: each merge uploads and
  downloads its fragment once per learner."""
  equal = [1.0] * 4
  streaming = _digits_run(strategies.streaming_diloco(
      H=10, fragments=2, delay=0, alpha=0.0, codec=None), equal)
  parts = _digits_run(strategies.decoupled_diloco(
      H=10, quorum=4, token_quorum=0.0, grace=0.0, adaptive_grace=False,
      fragments=2), equal)
  for key in ("eval_loss", "train_loss"):
    np.testing.assert_allclose(parts.history[key], streaming.history[key],
                               rtol=1e-5)
  model_bytes = 4 * sum(x.size for x in jax.tree.leaves(parts.params))
  # 4 rounds of 10 steps: both fragments merged 4 times by 4 learners.
  assert parts.history["sent_bytes"][-1] == 4 * 4 * model_bytes
  assert parts.history["received_bytes"][-1] == 4 * 4 * model_bytes
  # Goodput: a fragment's merge takes in half of its learners' steps
  # since they last sent it: fragment 0 merges 5 + 10 + 10 + 10 steps of
  # each learner (its last 5 are not merged yet), fragment 1 4 x 10.
  capacity = 4 * parts.summary["sim_time_s"] / 0.5
  assert parts.summary["goodput"] == pytest.approx(
      4 * (35 + 40) / 2 / capacity, rel=1e-6)


def test_a_learner_down_for_a_window_loses_its_round_and_pulls_back():
  """Learner 0 is down for ticks 5 to 14 of rounds of 10: the steps of its
  round are lost, the syncer (quorum 4) does not wait for it while it is
  down, and back at tick 15 it downloads the syncer's model and takes a
  round (ticks 17 to 26); once it is up the quorum counts it again."""
  faults = net_lib.Faults(windows=((0, 5, 15),))
  strategy = strategies.decoupled_diloco(H=10, quorum=4, token_quorum=0.0,
                                         grace=0.0, adaptive_grace=False)
  down = _digits_run(strategy, [1.0] * 4, steps=40, faults=faults)
  model_bytes = 4 * sum(x.size for x in jax.tree.leaves(down.params))
  arrivals = np.diff(down.history["sent_bytes"], prepend=0.0) / model_bytes
  ticks = np.flatnonzero(arrivals)
  # Tick 9: the three up learners (the quorum of 4 is capped at those
  # up). Learner 0 ends its first round back at tick 26; the others',
  # ended at 19, are held for it (it is up again), then all four.
  assert list(ticks) == [9, 26, 36]
  np.testing.assert_array_equal(arrivals[ticks], [3, 4, 4])
  sent = np.asarray(down.summary["sent_bytes_per_worker"])
  assert 2 * model_bytes == sent[0] < sent[1] == sent[2] == sent[3]
  assert np.isfinite(down.summary["final_eval_loss"])
  # Goodput: the merged learners' steps (H each) over the steps four
  # learners of 0.5 s could have taken in the simulated time.
  capacity = 4 * down.summary["sim_time_s"] / 0.5
  assert down.summary["goodput"] == pytest.approx(
      arrivals.sum() * 10 / capacity, rel=1e-9)
  assert down.summary["goodput"] < 0.9


def test_goodput_of_a_synchronous_fleet_waiting_for_its_slowest():
  """DiLoCo on a fleet with one learner four times slower: every step is
  merged, but the fast ones wait at each barrier; without a clock there
  is no goodput."""
  uneven = [1.0, 1.0, 1.0, 0.25]
  run = _digits_run(strategies.diloco(H=10), uneven)
  capacity = sum(uneven) * run.summary["sim_time_s"] / 0.5
  assert run.summary["goodput"] == pytest.approx(4 * 40 / capacity,
                                                 rel=1e-9)
  assert run.summary["goodput"] < 0.35
  untimed = lowbw.simulate(model=lowbw.models.mlp(hidden=(4,)),
                           data=lowbw.data.digits(), workers=2, steps=2,
                           batch_size=4, strategy=strategies.diloco(H=1),
                           clock=False)
  assert untimed.summary["goodput"] is None


def test_a_staleness_rule_scales_the_merges_by_their_age():
  """``stale_outer`` gets each merge's age: CGAD with a gate that reaches 0
  at age 1 keeps only the fresh merges (those whose learners all pulled
  the latest model), so the run differs from plain Adam; with no gate and
  no decay it is plain Adam bit for bit."""
  adam = strategies.outer_optimizer(0.02, kind="adam")
  kw = dict(inner=optax.adam(0.05), H=H, quorum=1, token_quorum=0.0,
            grace=0.0, adaptive_grace=False, outer=adam)
  plain = _run(strategies.decoupled_diloco(**kw))[0]
  off = _run(strategies.decoupled_diloco(
      stale_outer="cgad:alpha=0,cutoff=0", **kw))[0]
  gated = _run(strategies.decoupled_diloco(
      stale_outer="cgad:alpha=0,cutoff=1", **kw))[0]
  for a, b in zip(jax.tree.leaves(off.params), jax.tree.leaves(plain.params)):
    np.testing.assert_array_equal(a, b)
  assert np.nanmax(plain.history["strategy_staleness"]) >= 1
  assert any(np.abs(a - b).max() > 1e-4 for a, b in zip(
      jax.tree.leaves(gated.params), jax.tree.leaves(plain.params)))


def test_decoupled_diloco_refuses_bad_settings():
  for field, value in (("quorum", 0), ("token_quorum", 1.5),
                       ("grace", -1.0), ("adaptive_grace", "yes"),
                       ("token_weighted", 1), ("stale_outer", "cgad"),
                       ("wait_for_merge", "no"), ("fragments", 0)):
    with pytest.raises(ValueError, match=field):
      strategies.decoupled_diloco(**{field: value})
  with pytest.raises(ValueError, match=r"fragments=4 .*at most H=3"):
    strategies.decoupled_diloco(H=3, fragments=4)
  with pytest.raises(ValueError, match=r"wait_for_merge.*fragments=2"):
    strategies.decoupled_diloco(H=3, fragments=2, wait_for_merge=True)
  model, data = _problem()
  kw = dict(model=model, data=data, workers=W, batch_size=BATCH, steps=TICKS)
  with pytest.raises(ValueError, match=r"quorum=4 .*at most the 3 workers"):
    lowbw.build(strategy=strategies.decoupled_diloco(H=H, quorum=4), **kw)
  with pytest.raises(ValueError, match=r"fragments=3 .*2 blocks"):
    lowbw.build(strategy=strategies.decoupled_diloco(H=H, fragments=3), **kw)
  without_pull = strategies.decoupled_diloco(H=H)._replace(pull=None)
  with pytest.raises(ValueError, match=r"faults.*Strategy\.pull"):
    lowbw.build(strategy=without_pull, network=ideal.network(
        hardware="1s", faults=net_lib.Faults(windows=((0, 2, 5),))), **kw)
  with pytest.raises(ValueError, match="drop_prob"):
    lowbw.build(model=model, data=data, workers=W, batch_size=BATCH,
                steps=TICKS, strategy=strategies.decoupled_diloco(H=H),
                network=ideal.network(hardware="1s", faults=net_lib.Faults(
                    drop_prob=0.1)))


def test_the_printed_clock_names_an_exchange_with_the_server():
  """An asynchronous run's messages go to a server and back: the summary
  line says so rather than naming the (unused) all-reduce topology."""
  from lowbw.cli import _train
  s = {"topology": "ring", "group_size": None}
  exchange = {"collectives": {"pseudo_gradients": "exchange"}}
  assert _train._topology_text(exchange, s) == "each worker with the server"
  ring = {"collectives": {"pseudo_gradients": "all_reduce"}}
  assert _train._topology_text(ring, s) == "ring"


# Fragments: each learner sends its model in P parts (here P = 2, the
# MLP's two blocks), part p after (p+1) x H_w / P steps of its round
# (at least 1), and the syncer merges each part on its own: its own
# quorum, grace window, token weights, outer momentum and age. The
# syncer merges one part per engine tick (the fastest learner's step):
# parts ready at the same time merge in part order, a tick apart.

PARTS = ({"Dense_0"}, {"head"})


def _part(tree, p):
  """The leaves of ``tree`` in part ``p`` (by block name)."""
  return {k: v for k, v in tree.items() if k in PARTS[p]}


def _with_part(tree, p, part):
  return {**tree, **part}


class _PartLearner:
  """A learner with one message slot per part: what it sent, its tokens,
  when it reaches the syncer, and whether its round is blocked on it."""

  def __init__(self, params0, inner, step_s, rounds):
    self.theta, self.anchor = params0, [params0] * len(PARTS)
    self.opt, self.step_s, self.rounds = inner.init(params0), step_s, rounds
    self.position, self.next_end = 0, step_s
    self.since = [0] * len(PARTS)      # steps since it last sent part p
    self.sent = [None] * len(PARTS)
    self.tokens = [0] * len(PARTS)
    self.arrives = [None] * len(PARTS)
    self.blocked = [False] * len(PARTS)

  def offsets(self):
    P = len(PARTS)
    return [max(1, (p + 1) * self.rounds // P) for p in range(P)]


def _part_step(x, grad, inner):
  upd, x.opt = inner.update(grad(x.theta), x.opt, x.theta)
  x.theta = optax.apply_updates(x.theta, upd)
  x.position += 1
  x.since = [s + 1 for s in x.since]
  x.next_end += x.step_s
  for p, at in enumerate(x.offsets()):
    if x.position != at:
      continue
    if x.sent[p] is not None:   # its last message of part p is still out
      x.blocked[p] = True
    else:
      x.sent[p], x.tokens[p], x.since[p] = x.theta, x.since[p], 0
  if x.position >= x.rounds and not x.blocked[-1]:
    x.position = 0


def _part_merge(ls, held, p, server, m, weighted):
  weight = [float(ls[w].tokens[p]) if weighted else 1.0 for w in held]
  g = jax.tree.map(lambda *d: sum(d) / sum(weight), *[
      jax.tree.map(lambda a, t: c * (a - t), _part(ls[w].anchor[p], p),
                   _part(ls[w].sent[p], p)) for w, c in zip(held, weight)])
  m = jax.tree.map(lambda m, x: MOMENTUM * m + x, m, g)
  new = jax.tree.map(lambda s, x, m: s - OUTER_LR * (x + MOMENTUM * m),
                     _part(server, p), g, m)
  return _with_part(server, p, new), m


def _part_restart(x, p, server, now):
  """After part p's merge: that part of the new model plus what it
  computed since it sent; blocked on p, it sends p again."""
  moved = jax.tree.map(lambda g, t, s: g + (t - s), _part(server, p),
                       _part(x.theta, p), _part(x.sent[p], p))
  x.theta, x.anchor[p], x.sent[p] = _with_part(x.theta, p, moved), server, None
  if x.blocked[p]:
    x.blocked[p] = False
    x.sent[p], x.tokens[p], x.since[p] = x.theta, x.since[p], 0
    x.arrives[p] = now + 1.0
    if p == len(PARTS) - 1:
      x.position = 0
    if not any(x.blocked):
      x.next_end = now + x.step_s


def _parts_reference(params0, model, data, inner, rule, dylu):
  """The syncer's model after TICKS seconds and each merge's (time, part,
  learners)."""
  batch = {k: jnp.asarray(v[:BATCH]) for k, v in data.train.items()}
  grad = jax.jit(jax.grad(lambda p: model.loss(p, batch,
                                               jax.random.PRNGKey(0))[0]))
  rounds = [max(1, int(np.floor(H * v / max(SPEEDS)))) if dylu else H
            for v in SPEEDS]
  ls = [_PartLearner(params0, inner, 1.0 / v, r)
        for v, r in zip(SPEEDS, rounds)]
  syncers = [_Syncer(*rule) for _ in PARTS]
  momenta = [jax.tree.map(jnp.zeros_like, _part(params0, p))
             for p in range(len(PARTS))]
  server, merges, last = params0, [], -1.0
  while True:
    # A window that closed while another part merged waits for the next
    # tick, the syncer's next merge.
    events = [x.next_end for x in ls if not any(x.blocked)] + [
        a for x in ls for a in x.arrives if a is not None] + [
        max(s.window_end, last + 1.0) for s in syncers if s.window_end]
    now = min(events)
    if now > TICKS + 1e-9:
      return server, merges
    for x in ls:
      if not any(x.blocked) and abs(x.next_end - now) < 1e-9:
        _part_step(x, grad, inner)
      x.arrives = [None if a is not None and a <= now + 1e-9 else a
                   for a in x.arrives]
    ready = []
    for p, syncer in enumerate(syncers):
      held = [w for w, x in enumerate(ls) if x.sent[p] is not None and
              x.arrives[p] is None]
      if held and syncer.due(now, held, [x.tokens[p] for x in ls]):
        ready.append((p, held))
    if not ready or now < last + 1.0 - 1e-9:
      continue
    (p, held), last = ready[0], now
    server, momenta[p] = _part_merge(ls, held, p, server, momenta[p],
                                     syncers[p].weighted)
    merges.append((now, p, held))
    for w in held:
      _part_restart(ls[w], p, server, now)
    syncers[p].merged(now)


PART_RULES = {
    # quorum 2, token weights, DyLU rounds of 3, 1 and 1 steps: the slow
    # learners send both parts at their one step, so both parts are ready
    # together and merge a tick apart.
    "quorum_2_token_weighted": (dict(quorum=2, token_quorum=0.0, grace=0.0,
                                     adaptive_grace=False, dylu=True),
                                (2, 0.0, 0.0, False, True)),
    # an adaptive window per part, a plain mean; learners blocked on a
    # part whose last message is held.
    "adaptive_grace_plain_mean": (
        dict(quorum=2, token_quorum=0.0, grace=1.0, token_weighted=False),
        (2, 0.0, 1.0, True, False)),
}


@pytest.mark.parametrize("rule", sorted(PART_RULES))
def test_fragments_match_an_event_driven_syncer_per_part(rule):
  options, syncer = PART_RULES[rule]
  inner = optax.adam(0.05)
  result, params0, model, data = _run(strategies.decoupled_diloco(
      inner=inner, H=H, fragments=2, **options))
  server, merges = _parts_reference(params0, model, data, inner, syncer,
                                    options.get("dylu", False))
  assert len(merges) >= 6 and {p for _, p, _ in merges} == {0, 1}
  for got, want in zip(jax.tree.leaves(result.params),
                       jax.tree.leaves(server)):
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)
  # Each merge uploads its part once per learner merged (4 bytes a
  # parameter): the bytes say which part merged, when, with how many.
  size = [4 * sum(x.size for x in jax.tree.leaves(_part(params0, p)))
          for p in range(len(PARTS))]
  sent = np.diff(result.history["sent_bytes"], prepend=0.0)
  want = np.zeros_like(sent)
  for t, p, who in merges:
    want[int(round(t)) - 1] += len(who) * size[p]
  np.testing.assert_array_equal(sent, want)

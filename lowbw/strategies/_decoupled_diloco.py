"""Decoupled DiLoCo: learners on their own clocks, a syncer that merges
what has arrived once a minimum quorum is met, after a grace window, each
learner weighted by the tokens it processed (Douillard et al. 2026,
"Decoupled DiLoCo for Resilient Distributed Pre-training", arXiv
2604.21428).

It is asynchronous DiLoCo's learners and server (``_async_diloco``) with a
merge rule, ``Quorum``, that the engine's schedule (``simulation._pace``)
follows: an arrival waits at the syncer until the rule says to merge, and
the learners merged restart from the new model.
"""

from typing import NamedTuple

import jax.numpy as jnp

from lowbw import _validate
from lowbw.network import exchange
from lowbw.strategies import _base, _optim, _spec, _stale
from lowbw.strategies._async_diloco import (AsyncComm, _diloco_outer,
                                            async_send, asynchronous)
from lowbw.strategies._streaming_diloco import (_channel, _join,
                                                _replace_at, _split,
                                                fragment_of_leaves)
from lowbw.transforms import Codec, Compression, compression
from lowbw.transforms._compression import init_residual, message_bytes
from lowbw.transforms._reductions import current_fragment


class Quorum(NamedTuple):
  """The syncer's merge rule (``Strategy.syncer``).

  Attributes:
    count: the fewest learners whose pseudo-gradients it merges (at most
      those that are up).
    tokens: the least share of a full round's tokens (H steps of every
      learner that is up) that they must hold, in [0, 1].
    grace: how long it waits for more once the quorum is met: seconds, or
      with ``adaptive`` that fraction of the time since its last merge.
    adaptive: the grace window scales with the time since the last merge.
    token_weighted: each learner's pseudo-gradient weighs as the tokens it
      processed in its round (its inner steps; every learner's batch is
      the same size); False: a plain mean.
    overlap: learners go on computing after they send (the factory's
      ``wait_for_merge`` False); False: each waits for the merge its
      message joins.
    fragments: the parts of the model each learner sends on its own
      schedule (fragment p after (p+1) x H / P steps of each round) and the
      syncer merges on its own (own quorum, grace window, token weights).
  """

  count: int
  tokens: float
  grace: float
  adaptive: bool
  token_weighted: bool
  overlap: bool = True
  fragments: int = 1


def decoupled_diloco(
    inner=None,
    outer=None,
    H: int = 100,
    quorum: int = 1,
    token_quorum: float = 0.5,
    grace: float = 0.25,
    adaptive_grace: bool = True,
    token_weighted: bool = True,
    wait_for_merge: bool = False,
    codec: Codec | str | None = None,
    error_feedback: float | None = None,
    dylu: bool = False,
    stale_outer: str | None = None,
    fragments: int = 1,
) -> _base.Strategy:
  """Decoupled DiLoCo: a syncer that merges whichever learners' updates have
  arrived once a minimum quorum is met and a grace window has passed.

  Douillard et al. 2026, "Decoupled DiLoCo for Resilient Distributed
  Pre-training" (arXiv 2604.21428). Each learner takes H inner steps on its
  own clock, sends anchor - theta (anchor: the model it last pulled) to the
  syncer over its own link, and goes on with its next round (it waits only
  if it finishes that round before its message was merged; with
  ``wait_for_merge`` it waits for the merge its message joins).
  The syncer holds the arrivals until at least ``quorum`` learners and a
  ``token_quorum`` share of a full round's tokens are in, then waits the
  grace window for more (or until every learner that is up has arrived),
  and merges them: the mean of their pseudo-gradients weighted by the
  tokens each processed (the paper's w = tokens x tokens per step, which
  with equal batches is proportional to the inner steps taken), then the
  outer step (SGD with Nesterov momentum); each merged learner then takes
  the new model plus what it computed since it sent, as its anchor the new
  model. Learners that fail (a fault window) lose their round and,
  when back, restart from the syncer's model; the syncer never waits for
  more learners than are up.

  With ``quorum`` = every learner, no token quorum and no grace window,
  and equal learners whose exchanges end within a step, every merge takes
  every learner's round: DiLoCo. With ``wait_for_merge``, ``quorum=1``, no
  grace and no token weights it is asynchronous DiLoCo (each step's
  arrivals applied at once, the learners waiting for them).

  The paper's text beyond its abstract and merge rule could not be read
  here: the defaults of ``quorum``, ``token_quorum`` and ``grace``, and the
  adaptive window's form (a fraction of the time since the last merge),
  are lowbw's. The optimizers are DiLoCo's (inner AdamW lr 4e-4, weight
  decay 0.1; outer SGD lr 0.7, Nesterov momentum 0.9).

  Bytes per arrival: the learner uploads its pseudo-gradient (4 bytes x P,
  or the codec's payload) and downloads the model (4 bytes x P), as
  asynchronous DiLoCo's. The whole model is one fragment here.

  Args:
    inner: per-learner optimizer, state kept across rounds.
    outer: the syncer's optimizer, fed the merged pseudo-gradient.
    H: each learner's inner steps between pulls (>= 1).
    quorum: the fewest learners a merge takes (>= 1).
    token_quorum: the least share of a full round's tokens a merge takes,
      in [0, 1].
    grace: the grace window: with ``adaptive_grace`` a fraction (>= 0) of
      the time since the last merge, else seconds (>= 0).
    adaptive_grace: whether ``grace`` is a fraction of the time since the
      last merge (True) or seconds (False).
    token_weighted: weigh each learner by the tokens it processed.
    wait_for_merge: each learner waits for the merge its message joins;
      False (default): it goes on computing while its message travels and
      waits at the syncer (the paper's learners never wait for the
      syncer).
    codec: a codec spec for the pseudo-gradients, or None.
    error_feedback: residual decay beta in [0, 1] (needs a codec), or None.
    dylu: dynamic local updates: learner w takes floor(H x v_w / v_max)
      inner steps per round (at least 1).
    stale_outer: a staleness rule chained before the outer optimizer,
      given each merge's age (its learners' mean staleness):
      ``"cgad:alpha=A,cutoff=C"`` (CGAD, arXiv 2605.09126, which its paper
      proposes for Decoupled DiLoCo; with an Adam ``outer`` it is CGAD
      exactly), ``"heloco[:field=value,...]"`` (HeLoCo, arXiv
      2606.00271), or None.

  Example:
    >>> strategy = lowbw.strategies.decoupled_diloco(H=50, quorum=2,
    ...                                              grace=0.5)
  """
  inner = _base.optimizer("inner", inner, _base.default_inner)
  outer = _base.optimizer("outer", outer, _diloco_outer)
  H = _validate.positive_int("H", H)
  rule = _quorum(quorum, token_quorum, grace, adaptive_grace, token_weighted,
                 wait_for_merge, fragments, H)
  _validate.boolean("dylu", dylu)
  outer = _stale.stale_outer(stale_outer, outer)
  comp = compression(codec, error_feedback)
  strategy = asynchronous("decoupled_diloco", inner, outer, comp, H, {
      "quorum": rule.count, "token_quorum": rule.tokens, "grace": rule.grace,
      "adaptive_grace": rule.adaptive, "token_weighted": rule.token_weighted,
      "wait_for_merge": not rule.overlap, "dylu": dylu,
      "stale_outer": stale_outer, "fragments": rule.fragments}, sends=True,
      time_budget=dylu, syncer=rule, send=async_send)
  if rule.fragments == 1:
    return strategy
  return _fragmented(strategy, rule.fragments, outer, comp)


def _quorum(count, tokens, grace, adaptive, token_weighted,
            wait_for_merge, fragments, H) -> Quorum:
  count = _validate.positive_int("quorum", count)
  fragments = _validate.positive_int("fragments", fragments)
  if fragments > H:
    raise _validate.fail("fragments", fragments, f"at most H={H} (each "
                         "fragment is sent at its own step of the round)")
  if fragments > 1 and wait_for_merge:
    raise _validate.fail("wait_for_merge", wait_for_merge, "False with "
                         f"fragments={fragments}: learners that send "
                         "fragments go on computing")
  tokens = _validate.fraction("token_quorum", tokens, low_open=False)
  grace = _validate.non_negative("grace", grace)
  for field, value in (("adaptive_grace", adaptive),
                       ("token_weighted", token_weighted),
                       ("wait_for_merge", wait_for_merge)):
    _validate.boolean(field, value)
  return Quorum(count, float(tokens), float(grace), adaptive, token_weighted,
                not wait_for_merge, fragments)


# Fragments (``fragments`` > 1): the whole-model pieces of the asynchronous
# strategy run on one fragment's leaves at a time (``current_fragment()``,
# which the engine's schedule sets), each fragment with its own outer
# state, version, message state and channel ``fragment_<p>``.

def _fragmented(strategy: _base.Strategy, P: int, outer, comp: Compression
                ) -> _base.Strategy:
  """``strategy`` (whole-model) with its state, sync, send, pull and
  channels split into ``P`` fragments (Streaming DiLoCo's partition of the
  model's blocks, strided)."""
  ids_of = lambda params: fragment_of_leaves(params, P, "strided")  # noqa
  sync, send = strategy.sync, strategy.send

  def init(params, num_workers_, key):
    state = strategy.init(params, num_workers_, key)
    ids, c = ids_of(params), state.comm
    return state._replace(comm=c._replace(
        outer_state=tuple(outer.init(_split(params, ids, p))
                          for p in range(P)),
        pulled_W=jnp.zeros((num_workers_, P), jnp.int32),
        version=jnp.zeros(P, jnp.int32),
        residual_W=tuple(init_residual(comp, _split(state.params_W, ids, p))
                         for p in range(P))))

  def fragment_sync(state):
    p = current_fragment()
    if p is None:  # driven without the engine's schedule: every fragment
      reports = []
      for q in range(P):
        state, report = _on_fragment(sync, state, q, ids_of, P)
        reports.append(report)
      return state, {**reports[-1], **_base.events(
          **{_channel(q): 1 for q in range(P)})}
    return _on_fragment(sync, state, p, ids_of, P)

  def fragment_send(state, mask_W):
    p = current_fragment()
    return _on_fragment(lambda s: (send(s, mask_W), {}), state, p,
                        ids_of, P)[0]

  def channels(params, num_workers_):
    ids = ids_of(params)
    return {_channel(p): exchange(
        message_bytes(comp, _split(params, ids, p)),
        _base.payload_bytes(_split(params, ids, p)), num_workers_)
            for p in range(P)}

  return strategy._replace(
      init=init, sync=fragment_sync, send=fragment_send, channels=channels,
      step=_base.compose_step(strategy.local, fragment_sync,
                              strategy.asynchronous))


def _on_fragment(fn, state, p: int, ids_of, P: int):
  """``fn`` (a whole-model piece: state -> (state, report)) applied to
  fragment ``p``'s leaves of the workers' parameters and the syncer's
  state; its channel event renamed to the fragment's."""
  c = state.comm
  ids = ids_of(c.global_params)
  cut = lambda tree: _split(tree, ids, p)  # noqa: E731
  sub = state._replace(params_W=cut(state.params_W), comm=AsyncComm(
      cut(c.global_params), c.outer_state[p], cut(c.anchor_W),
      c.pulled_W[:, p], c.version[p], c.residual_W[p], cut(c.sent_W)))
  sub, report = fn(sub)
  s = sub.comm
  put = lambda tree, part: _join(tree, ids, p, part)  # noqa: E731
  comm = c._replace(
      global_params=put(c.global_params, s.global_params),
      outer_state=_replace_at(c.outer_state, p, s.outer_state),
      anchor_W=put(c.anchor_W, s.anchor_W),
      pulled_W=c.pulled_W.at[:, p].set(s.pulled_W),
      version=c.version.at[p].set(s.version),
      residual_W=_replace_at(c.residual_W, p, s.residual_W),
      sent_W=put(c.sent_W, s.sent_W))
  if "pseudo_gradients" in report:
    report = {k: v for k, v in report.items() if k != "pseudo_gradients"}
    report.update(_base.events(**{_channel(q): int(q == p)
                                  for q in range(P)}))
  return state._replace(params_W=put(state.params_W, sub.params_W),
                        comm=comm), report




SPEC = _spec.spec(
    decoupled_diloco, inner=_optim.DILOCO_INNER, outer=_optim.DILOCO_OUTER,
    paper="Douillard et al. 2026, arXiv 2604.21428",
    help={"quorum": "the fewest learners a merge takes (at most those up)",
          "token_quorum": "the least share of a full round's tokens (H "
          "steps of every learner up) a merge takes, in [0, 1]",
          "grace": "how long the syncer waits for more once the quorum is "
          "met: a fraction of the time since its last merge "
          "(adaptive_grace), else seconds",
          "adaptive_grace": "grace is a fraction of the time since the last "
          "merge (else seconds)",
          "token_weighted": "weigh each learner's pseudo-gradient by the "
          "tokens it processed in its round",
          "wait_for_merge": "each learner waits for the merge its message "
          "joins (else it goes on computing after it sends)",
          "codec": "codec of the pseudo-gradients",
          "fragments": "P: each learner sends the model in P fragments, "
          "fragment p after (p+1)H/P steps of its round, each merged on its "
          "own quorum and window (1: the whole model)"})

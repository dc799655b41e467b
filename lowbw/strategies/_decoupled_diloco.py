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

from lowbw import _validate
from lowbw.strategies import _base, _optim, _spec, _stale
from lowbw.strategies._async_diloco import (_diloco_outer, async_send,
                                            asynchronous)
from lowbw.transforms import Codec, compression


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
  """

  count: int
  tokens: float
  grace: float
  adaptive: bool
  token_weighted: bool
  overlap: bool = True


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
                 wait_for_merge)
  _validate.boolean("dylu", dylu)
  outer = _stale.stale_outer(stale_outer, outer)
  comp = compression(codec, error_feedback)
  return asynchronous("decoupled_diloco", inner, outer, comp, H, {
      "quorum": rule.count, "token_quorum": rule.tokens, "grace": rule.grace,
      "adaptive_grace": rule.adaptive, "token_weighted": rule.token_weighted,
      "wait_for_merge": not rule.overlap, "dylu": dylu,
      "stale_outer": stale_outer}, sends=True, time_budget=dylu,
      syncer=rule, send=async_send)


def _quorum(count, tokens, grace, adaptive, token_weighted,
            wait_for_merge) -> Quorum:
  count = _validate.positive_int("quorum", count)
  tokens = _validate.fraction("token_quorum", tokens, low_open=False)
  grace = _validate.non_negative("grace", grace)
  for field, value in (("adaptive_grace", adaptive),
                       ("token_weighted", token_weighted),
                       ("wait_for_merge", wait_for_merge)):
    _validate.boolean(field, value)
  return Quorum(count, float(tokens), float(grace), adaptive, token_weighted,
                not wait_for_merge)


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
          "codec": "codec of the pseudo-gradients"})

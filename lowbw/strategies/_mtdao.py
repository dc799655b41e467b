"""MT-DAO: local Adam-family workers whose update mixes several first
moments of different timescales with the gradient itself (Iacob et al.,
2025, "MT-DAO: Multi-Timescale Distributed Adaptive Optimizers with Local
Updates", arXiv 2510.05361).

Between averagings the workers drift apart; a first moment of beta1 = 0.9
forgets the averaged direction within a few steps (half-life 6.6 steps), so
with K = 32 local steps the workers follow their own noisy gradients. MT-DAO
keeps a slow first moment (beta ~ 0.999, half-life ~ 700 steps) that still
carries the averaged direction at the next averaging, and mixes it with
faster terms (the gradient, other moments) so that the update still reacts
to the loss. Parameters, first moments and the second moment are averaged
over the workers on periods of their own, as DES-LOC does
(``_desloc.desloc_sync``); there is no outer optimizer.

``multi_timescale`` builds the per-worker optimizer from any Adam-family
optax optimizer with an injected ``b1`` (lowbw's ``adopt``, ``adam``,
``adamw``): its update with first-moment decay beta is the moment's term of
the mix, so the mix is a weighted sum of that optimizer's updates with
different decays (0 for the gradient's term), sharing one second moment.
"""

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from lowbw import _validate
from lowbw.strategies import _base, _desloc, _optim, _spec
from lowbw.transforms import Compression, comm_channel

# The paper's base optimizer: ADOPT (Taniguchi et al. 2024, arXiv
# 2411.02853) with beta2 = 0.9999, its first moment the slow one.
INNER = _optim.Optimizer("adopt", 1e-3, b1=0.999, b2=0.9999)
# The fields of the state that the averagings read: the inner optimizer's own
# first moment and second moment (optax's ``mu`` and ``nu``) and the extra
# first moments this module keeps.
EXTRA = "extra_mu"
MOMENTS = {"first_moment": ("mu", EXTRA), "second_moment": ("nu",)}


class MultiTimescaleState(NamedTuple):
  """State of ``multi_timescale``: the inner optimizer's own state (its
  first moment is the first timescale's) and one first moment per extra
  decay, each shaped as the inner one's."""

  inner: Any
  extra_mu: tuple


def _weights(omega, betas, omegas) -> tuple[float, tuple, tuple]:
  """(omega, betas, omegas) validated, each error naming its field; the
  gradient's weight 1 - omega - sum(omegas) must not be negative."""
  omega = _validate.non_negative("omega", omega)
  betas = tuple(betas) if isinstance(betas, (tuple, list)) else betas
  omegas = tuple(omegas) if isinstance(omegas, (tuple, list)) else omegas
  if not isinstance(betas, tuple) or not isinstance(omegas, tuple):
    raise _validate.fail("betas", (betas, omegas), "expected tuples of "
                         "extra first-moment decays and their weights")
  if len(betas) != len(omegas):
    raise _validate.fail("omegas", omegas, f"expected one weight per extra "
                         f"decay in betas ({len(betas)} of them)")
  betas = tuple(_optim._beta(f"betas[{i}]", b) for i, b in enumerate(betas))
  omegas = tuple(_validate.non_negative(f"omegas[{i}]", w)
                 for i, w in enumerate(omegas))
  if omega + sum(omegas) > 1 + 1e-9:
    raise _validate.fail("omega", omega + sum(omegas), "the first moments' "
                         "weights (omega + sum(omegas)) must be at most 1: "
                         "the rest is the gradient's weight")
  return float(omega), betas, omegas


def _check_inner(inner: optax.GradientTransformation) -> None:
  """An error naming ``inner`` unless its state holds one Adam first moment
  (``mu``), one second moment (``nu``) and one injected ``b1``."""
  state = inner.init({"x": jnp.zeros((2,))})
  for key in ("mu", "nu", "b1"):
    found = optax.tree_utils.tree_get_all_with_path(state, key)
    if len(found) != 1:
      raise _validate.fail(
          "inner", "without " + ("an injected b1" if key == "b1" else
                                 f"one Adam moment {key!r}"),
          "MT-DAO runs one Adam-family optimizer at several first-moment "
          "decays; give lowbw's adopt, adam or adamw (--inner adopt / adam "
          "/ adamw), or optax.inject_hyperparams(optax.adam)(...)")


def multi_timescale(inner: optax.GradientTransformation, omega: float = 0.9,
                    betas: tuple = (), omegas: tuple = ()
                    ) -> optax.GradientTransformation:
  """MT-DAO's per-worker optimizer (arXiv 2510.05361): the update mixes
  the gradient, the inner optimizer's first moment (decay: its ``b1``) and
  one first moment per extra decay in ``betas``.

  With ``u(beta)`` the update ``inner`` makes with first-moment decay beta
  (the moment's own state), the update is

    (1 - omega - sum(omegas)) u(0) + omega u(b1) + sum_j omegas[j] u(betas[j])

  For Adam, u(beta) = m_beta / (sqrt(v) + eps) (bias-corrected as optax's),
  so the mix is ((1 - sum) g + omega m_b1 + ...) / (sqrt(v) + eps), the
  paper's quasi-hyperbolic update; for ADOPT, u(beta) is the moment of the
  normalised, clipped gradient. All terms share the one second moment v
  (each call updates it alike; one is kept). The extra moments and the
  gradient's term each cost one more call of ``inner`` per step. With
  ``omega = 1`` and no extra decays it is ``inner`` itself, bit for bit.

  Args:
    inner: an Adam-family optimizer with ``b1`` injected
      (``optax.inject_hyperparams``; lowbw's adopt, adam, adamw).
    omega: weight of the inner optimizer's own first moment.
    betas: extra first-moment decays, each in [0, 1).
    omegas: their weights; 1 - omega - sum(omegas) >= 0 is the gradient's.

  Example:
    >>> tx = lowbw.strategies.multi_timescale(
    ...     optax.inject_hyperparams(optax.adam)(1e-3, b1=0.999), omega=0.7,
    ...     betas=(0.9,), omegas=(0.2,))   # gradient weight 0.1
  """
  omega, betas, omegas = _weights(omega, betas, omegas)
  _check_inner(inner)
  return _mixed(inner, omega, betas, omegas)


def _mixed(inner, omega: float, betas: tuple, omegas: tuple
           ) -> optax.GradientTransformation:
  """``multi_timescale`` of weights already checked (``_weights``)."""
  rest = 1.0 - omega - sum(omegas)

  def init(params):
    state = inner.init(params)
    mu = optax.tree_utils.tree_get(state, "mu")
    return MultiTimescaleState(
        state, tuple(jax.tree.map(jnp.zeros_like, mu) for _ in betas))

  def at(state, b1, mu=None):
    """``state`` with first-moment decay ``b1`` (and moment ``mu``)."""
    old = optax.tree_utils.tree_get(state, "b1")
    values = {"b1": jnp.asarray(b1, jnp.asarray(old).dtype)}
    return optax.tree_utils.tree_set(
        state, **values, **({} if mu is None else {"mu": mu}))

  def update(grads, state, params=None):
    updates, new = inner.update(grads, state.inner, params)
    terms = [] if omega == 1.0 else [(omega, updates)]
    if rest > 0:
      terms.append((rest, inner.update(grads, at(state.inner, 0.0),
                                       params)[0]))
    extra = []
    for beta, weight, mu in zip(betas, omegas, state.extra_mu):
      u, st = inner.update(grads, at(state.inner, beta, mu), params)
      extra.append(optax.tree_utils.tree_get(st, "mu"))
      terms.append((weight, u))
    if terms:
      updates = jax.tree.map(
          lambda *us: sum(w * u for (w, _), u in zip(terms, us)),
          *[u for _, u in terms])
    return updates, MultiTimescaleState(new, tuple(extra))

  return optax.GradientTransformation(init, update)


def mtdao(
    inner: optax.GradientTransformation | None = None,
    Kx: int = 32,
    Ku: int | None = None,
    Kv: int | None = None,
    omega: float = 0.9,
    betas: tuple = (),
    omegas: tuple = (),
) -> _base.Strategy:
  """MT-DAO: local Adam-family workers mixing slow and fast first moments;
  parameters and moments averaged every Kx, Ku and Kv steps.

  Each worker applies ``multi_timescale(inner, omega, betas, omegas)``: the
  update is (1 - omega - sum(omegas)) x the gradient's term + omega x the
  inner optimizer's first moment (decay: its b1) + omegas[j] x a first
  moment of decay betas[j], all over one second moment (for ADOPT: of the
  normalised gradient). After steps Kx, 2Kx, ... the workers' parameters
  are averaged, after Ku, 2Ku, ... all their first moments, after Kv, ...
  their second moments (as DES-LOC, ``desloc``). With omega = 1 and no
  extra decays it is Local Adam (DES-LOC with its periods).

  Defaults follow arXiv 2510.05361 (docs/strategies/mtdao.md gives where):
  the quasi-hyperbolic form (one slow moment and the gradient, no extra
  memory), ADOPT with beta2 = 0.9999 and a slow beta1 = 0.999 weighted
  omega = 0.9, and one period K = Kx = Ku = Kv = 32 for every state.

  Bytes per worker: each averaging is a ring all-reduce (ρ(W) × payload on
  the wire) of one copy of the parameters (B), of the N first moments
  (N·B, N = 1 + len(betas)) or of the second moment (B): per step
  B (1/Kx + N/Ku + 1/Kv), 3B/32 at the defaults.

  Args:
    inner: Adam-family optimizer with an injected b1 (lowbw's adopt, adam,
      adamw); its b1 is the first timescale.
    Kx: steps between parameter averagings (>= 1).
    Ku: steps between first-moment averagings (all of them); None: Kx.
    Kv: steps between second-moment averagings; None: Kx.
    omega: weight of the inner optimizer's first moment.
    betas: extra first-moment decays (Python only), each in [0, 1).
    omegas: their weights (Python only); omega + sum(omegas) <= 1.

  Example:
    >>> qh = lowbw.strategies.mtdao(Kx=32)            # ADOPT, beta 0.999
    >>> three = lowbw.strategies.mtdao(omega=0.5, betas=(0.9,),
    ...                                omegas=(0.3,))  # gradient weight 0.2
  """
  inner = _base.optimizer("inner", inner, lambda: _optim.inner(INNER))
  omega, betas, omegas = _weights(omega, betas, omegas)
  _check_inner(inner)
  tx = _mixed(inner, omega, betas, omegas)
  Kx = _validate.positive_int("Kx", Kx)
  Ku = Kx if Ku is None else _validate.positive_int("Ku", Ku)
  Kv = Kx if Kv is None else _validate.positive_int("Kv", Kv)
  periods = {"params": Kx, "first_moment": Ku, "second_moment": Kv}
  plain = Compression(None, None)

  def init(params, num_workers_, key):
    return _base.inner_init(tx, params, num_workers_, key, ())

  def channels(params, num_workers_):
    copies = {"params": 1, "first_moment": 1 + len(betas),
              "second_moment": 1}
    return {name: comm_channel(plain, (params,) * n, num_workers_)
            for name, n in copies.items()}

  return _base.make(
      "mtdao", math.gcd(Kx, Ku, Kv), _base.Parts(
          init, lambda s, g: (_base.inner_update(tx, s, g), {}),
          _desloc.desloc_sync(periods, MOMENTS), _base.mean_of_workers,
          channels),
      {"name": "mtdao", "inner": _base.describe(inner), "Kx": Kx, "Ku": Ku,
       "Kv": Kv, "omega": omega, "betas": list(betas),
       "omegas": list(omegas)},
      inner=tx)


SPEC = _spec.spec(
    mtdao, inner=INNER, outer=None,
    paper="Iacob et al. 2025, arXiv 2510.05361",
    where="its experiments' quasi-hyperbolic form: ADOPT, beta2 0.9999, "
          "K = Kx = Ku = Kv = 32; the slow beta1 0.999, its weight 0.9 and "
          "lr 1e-3 are the authors' QHADOPT defaults",
    help={"Kx": "steps between parameter averagings",
          "Ku": "steps between first-moment averagings (default Kx)",
          "Kv": "steps between second-moment averagings (default Kx)",
          "omega": "weight of the inner optimizer's first moment (decay "
                   "--b1) in the update; the gradient's is 1 - omega",
          "betas": "extra first-moment decays (a tuple; Python only)",
          "omegas": "the extra first moments' weights (a tuple; Python "
                    "only)"})

"""Limit identities: where one method reduces to another, the two agree, for
random seeds, shapes and worker counts (hypothesis property tests).

Each test is named after its identity and its docstring gives the algebra
that makes it hold. Two kinds of comparison:

* ``assert_same``: both sides do the same arithmetic in the same order (one
  side only adds operations that are exact, such as a float32 cast, adding a
  zero residual or scattering all k = n values back), so their bits agree.
* ``assert_within_rounding``: the identity is exact in real arithmetic but
  the two sides round differently (a mean of updates against an update of
  the mean, theta - (theta - mean) against the mean itself). The tolerance
  comes from float32 rounding: each rounding is at most eps/2 relative
  (eps = 2^-23), a mean over W workers rounds W times, and a step's
  difference is carried into the later steps; so a side's entry is within
  ``ops x eps x scale`` of the other, where ``ops`` counts the roundings in
  which the two sides differ over the run (stated per test) and ``scale`` is
  the largest magnitude of the compared values. Each such test also checks
  that training moved the values far more than the tolerance, so the
  comparison has something to show.

Strategies are driven through their own ``step`` under one ``jax.jit`` and
``lax.scan`` (``_runner``): a seed draws the initial parameters and the
batches, which are traced, so a new example recompiles only for a new shape.
The engine-level identities (asynchronous DiLoCo on an equal fleet, the
paired DDP lane) build each side once and run it for the drawn seeds.
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from hypothesis import given, settings, strategies as st

import lowbw
from lowbw import strategies
from lowbw.transforms import quantize, robust_mean, worker_mean

EPS = float(np.finfo(np.float32).eps)  # 2^-23, twice float32's unit roundoff
STEPS = 6
SETTINGS = settings(max_examples=4, deadline=None, derandomize=True,
                    database=None)
SEEDS = st.integers(0, 2**31 - 1)
# Shapes: (inputs, outputs) of the toy regression, W; two of each keep the
# compiles few (every new shape is a new program).
DIMS = st.sampled_from([(3, 2), (5, 1)])
WORKERS = st.sampled_from([2, 3])


# ---------------------------------------------------------------- problem
def loss_fn(params, batch):
  pred = jnp.tanh(batch["x"] @ params["w"]) + params["b"][None]
  if "experts" in params:  # SPES's mixture: the mean of the experts' outputs
    pred = pred + jnp.mean(jnp.tanh(jnp.einsum(
        "nd,edk->enk", batch["x"], params["experts"]["w"])), axis=0)
  return jnp.mean(jnp.square(pred - batch["y"]))


def problem(seed: int, dims, workers: int, steps: int = STEPS, experts=0,
            same_data: bool = False):
  """(params, batches (steps, W, 4, ...)) drawn from ``seed``."""
  d, k = dims
  rng = np.random.default_rng(seed)
  params = {"w": rng.normal(size=(d, k)), "b": rng.normal(size=(k,))}
  if experts:
    params["experts"] = {"w": rng.normal(size=(experts, d, k))}
  n = 1 if same_data else workers
  batches = {"x": rng.normal(size=(steps, n, 4, d)),
             "y": rng.normal(size=(steps, n, 4, k))}
  if same_data:
    batches = jax.tree.map(lambda x: np.repeat(x, workers, axis=1), batches)
  f32 = lambda t: jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), t)  # noqa: E731
  return f32(params), f32(batches)


@functools.cache
def _runner(name: str, *args):
  """The jitted run of ``BUILD[name](*args)``: init from ``params``, one
  ``strategy.step`` per step of ``batches`` in a ``lax.scan``; the final
  state. Cached, so hypothesis' examples reuse the compiled program."""
  strategy = BUILD[name](*args)

  def run(params, batches):
    workers = batches["x"].shape[1]
    state = strategy.init(params, workers, jax.random.PRNGKey(3))

    def body(s, b):
      return strategy.step(s, jax.vmap(jax.grad(loss_fn))(s.params_W, b))[0], None

    return jax.lax.scan(body, state, batches)[0]

  return jax.jit(run), strategy


def run(name, params, batches, *args):
  fn, strategy = _runner(name, *args)
  state = fn(params, batches)
  return state, strategy.global_params(state)


def sgd():
  return optax.sgd(0.05, momentum=0.9)


def adam():
  return optax.adam(0.05)


def nesterov():
  return optax.sgd(0.7, momentum=0.9, nesterov=True)


def outer_sgd(lr=1.0):
  return optax.sgd(lr)


H = 3
BUILD = {
    "ddp": lambda: strategies.ddp(sgd()),
    "ddp_sgd_plain": lambda: strategies.ddp(optax.sgd(0.05)),
    "ddp_cast": lambda: strategies.ddp(sgd(), codec="cast:float32"),
    "ddp_topk_all": lambda: strategies.ddp(sgd(), codec="topk:1"),
    "fedavg_h1": lambda: strategies.fedavg(sgd(), H=1),
    "fedavg": lambda: strategies.fedavg(sgd(), H=H),
    "fedavg_adam": lambda: strategies.fedavg(adam(), H=H),
    "diloco_avg": lambda: strategies.diloco(sgd(), outer_sgd(), H=H),
    "diloco": lambda: strategies.diloco(sgd(), nesterov(), H=H),
    "diloco_adam": lambda: strategies.diloco(adam(), nesterov(), H=H),
    "diloco_sgd_outer": lambda: strategies.diloco(sgd(), outer_sgd(0.7), H=H),
    "diloco_cast": lambda: strategies.diloco(sgd(), nesterov(), H=H,
                                             codec="cast:float32"),
    "diloco_cast_ef": lambda: strategies.diloco(
        sgd(), nesterov(), H=H, codec="cast:float32", error_feedback=0.7),
    "diloco_heavy_ball": lambda: strategies.diloco(
        sgd(), optax.sgd(0.7, momentum=0.5), H=H),
    "sparta_p1": lambda: strategies.sparta(sgd(), p=1.0),
    "sparta_diloco_p1": lambda: strategies.sparta_diloco(
        sgd(), outer_sgd(), H=H, p=1.0),
    "streaming_1": lambda: strategies.streaming_diloco(
        sgd(), nesterov(), H=H, fragments=1, delay=0, alpha=0.0, codec=None),
    "sparseloco_dense": lambda: strategies.sparseloco(
        sgd(), outer_sgd(0.7), H=H, codec="topk:1", error_feedback=0.0),
    "hier_one_group": lambda: strategies.hierarchical_diloco(
        sgd(), nesterov(), H=H, groups=1, global_every=2),
    "hier_groups_of_one": lambda: strategies.hierarchical_diloco(
        sgd(), outer_sgd(), global_outer=nesterov(), H=H, group_size=1,
        global_every=1),
    "muloco_adam": lambda: strategies.muloco(adam(), nesterov(), H=H,
                                             codec=None),
    "noloco": lambda: strategies.noloco(sgd(), optax.sgd(0.7, momentum=0.5),
                                        H=H, pull=0.5),
    "demo": lambda: strategies.demo(optax.sgd(0.01), chunk=4, k=2),
    "desloc_equal": lambda: strategies.desloc(adam(), Kx=H, Ku=H, Kv=H),
    "desloc_params_only": lambda: strategies.desloc(adam(), Kx=H, Ku=4 * H,
                                                    Kv=4 * H),
    "spes": lambda: strategies.spes(sgd(), nesterov(), H=H,
                                    merge_warmup_steps=0, merge_top_k=1),
    "async_nesterov": lambda w: strategies.async_diloco(
        sgd(), strategies.outer_optimizer(0.7, 0.9), H=H,
        delayed_nesterov=w),
    "diloco_injected": lambda: strategies.diloco(
        sgd(), strategies.outer_optimizer(0.7, 0.9), H=H),
}


# ------------------------------------------------------------ comparisons
def assert_same(got, want):
  for x, y in zip(jax.tree.leaves(got), jax.tree.leaves(want), strict=True):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def assert_within_rounding(got, want, ops: int, start=None):
  """Every entry within ``ops x eps x scale`` (module docstring), ``scale``
  the largest magnitude in either tree (and ``start``): a rounding is
  relative to the operands that meet in it, and an entry's gradient and
  update mix every parameter, so a parameter that ends near 0 still
  carries errors of its neighbours' size. With ``start``, also that
  training moved ``want`` from it by more than 100x the tolerance."""
  trees = [got, want] + ([] if start is None else [start])
  scale = max(float(np.max(np.abs(np.asarray(x, np.float64))))
              for t in trees for x in jax.tree.leaves(t))
  tol = ops * EPS * scale
  moved = 0.0
  for i, (x, y) in enumerate(zip(jax.tree.leaves(got), jax.tree.leaves(want),
                                 strict=True)):
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    np.testing.assert_allclose(x, y, rtol=0, atol=tol, err_msg=f"leaf {i}")
    if start is not None:
      s = np.asarray(jax.tree.leaves(start)[i], np.float64)
      moved = max(moved, float(np.max(np.abs(y - s))))
  if start is not None:
    assert moved > 100 * tol, "training did not move the parameters"


def rounds(steps=STEPS):
  return steps // H


# ------------------------------------------------------------- identities
@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_fedavg_h1_with_inner_sgd_is_ddp_sgd(seed, dims, workers):
  """FedAvg with H = 1 and inner SGD (momentum 0.9) == DDP with it.

  DDP: theta <- theta - lr m, m <- mu m + mean_w g_w. FedAvg H = 1: each
  worker steps m_w <- mu m_w + g_w, theta_w = theta - lr m_w, then theta <-
  mean_w theta_w = theta - lr mean_w m_w; momentum is linear, so mean_w m_w
  follows DDP's m. Roundings that differ per step and entry: the two means
  (W each) and the step's multiply-add (2): ops = STEPS (2W + 2).
  """
  params, batches = problem(seed, dims, workers)
  a, _ = run("fedavg_h1", params, batches)
  b, _ = run("ddp", params, batches)
  assert_within_rounding(a.params_W, b.params_W, STEPS * (2 * workers + 2),
                         start=params)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_diloco_with_outer_sgd_at_rate_1_without_momentum_is_fedavg(
    seed, dims, workers):
  """DiLoCo with outer SGD(lr = 1), no momentum == FedAvg (same inner, H).

  DiLoCo's outer step: theta <- theta - 1 x (theta - mean_w theta_w) =
  mean_w theta_w, FedAvg's average; both keep each worker's inner state
  across rounds. Per sync, DiLoCo rounds the mean (W), the difference and
  the step (2): ops = rounds x (W + 2), doubled for the inner steps that
  carry a difference on.
  """
  params, batches = problem(seed, dims, workers)
  a, ga = run("diloco_avg", params, batches)
  b, gb = run("fedavg", params, batches)
  ops = 2 * rounds() * (workers + 2)
  assert_within_rounding(ga, gb, ops, start=params)
  assert_within_rounding(a.params_W, b.params_W, ops)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_sparta_with_p_1_and_inner_sgd_is_ddp_sgd(seed, dims, workers):
  """SPARTA with p = 1 and inner SGD == DDP with SGD.

  p = 1 selects every entry of every tensor (k = round(p n) = n), so each
  step replaces every parameter by the workers' mean after their own SGD
  steps: FedAvg with H = 1, which is DDP (above). ops = STEPS (2W + 2).
  """
  params, batches = problem(seed, dims, workers)
  a, _ = run("sparta_p1", params, batches)
  b, _ = run("ddp", params, batches)
  assert_within_rounding(a.params_W, b.params_W, STEPS * (2 * workers + 2),
                         start=params)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_streaming_diloco_with_one_fragment_no_delay_no_mixing_is_diloco(
    seed, dims, workers):
  """Streaming DiLoCo with P = 1, tau = 0, alpha = 0 and no codec == DiLoCo.

  One fragment holds every leaf and is synced every H / P = H steps with
  DiLoCo's own outer step (``outer_step``) on the list of leaves; tau = 0
  merges at once and alpha = 0 makes the merge 0 x local + 1 x global,
  which is the global value exactly. Same arithmetic, same order: the bits
  agree.
  """
  params, batches = problem(seed, dims, workers)
  a, ga = run("streaming_1", params, batches)
  b, gb = run("diloco", params, batches)
  assert_same(ga, gb)
  assert_same(a.params_W, b.params_W)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_sparseloco_dense_unquantized_beta_0_is_diloco_without_momentum(
    seed, dims, workers):
  """SparseLoCo at full density (top-k with k = n), no quantization, beta = 0
  == DiLoCo with the same outer SGD and no momentum.

  With beta = 0 the accumulator is e = 0 x e + Delta = Delta; top-k of all
  entries sends Delta whole, leaving e = 0; each entry's mean over the
  workers that sent it (every worker, as no Delta entry of random data is
  exactly 0) is DiLoCo's mean pseudo-gradient. SparseLoCo averages the
  deltas, DiLoCo subtracts the mean: per sync W + 2 roundings, doubled for
  the inner steps after it: ops = 2 rounds (W + 2).
  """
  params, batches = problem(seed, dims, workers)
  a, ga = run("sparseloco_dense", params, batches)
  b, gb = run("diloco_sgd_outer", params, batches)
  assert_within_rounding(ga, gb, 2 * rounds() * (workers + 2), start=params)


def _local_adam_reference(params, batches, K, lr=0.05):
  """Local Adam as a loop over workers: each worker runs optax.adam on its
  own batches; every K steps the parameters and both moments are replaced
  by the workers' means."""
  adam_ = optax.adam(lr)
  workers = batches["x"].shape[1]
  p = [params] * workers
  s = [adam_.init(params) for _ in range(workers)]
  grad = jax.jit(jax.grad(loss_fn))
  mean = lambda trees: jax.tree.map(lambda *x: sum(x) / len(x), *trees)  # noqa: E731
  for t in range(batches["x"].shape[0]):
    for w in range(workers):
      g = grad(p[w], jax.tree.map(lambda x: x[t, w], batches))
      u, s[w] = adam_.update(g, s[w], p[w])
      p[w] = optax.apply_updates(p[w], u)
    if (t + 1) % K == 0:
      p = [mean(p)] * workers
      mu, nu = mean([x[0].mu for x in s]), mean([x[0].nu for x in s])
      s = [(x[0]._replace(mu=mu, nu=nu),) + tuple(x[1:]) for x in s]
  return p


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_desloc_with_equal_periods_is_local_adam(seed, dims, workers):
  """DES-LOC with Kx = Ku = Kv = K == Local Adam (every worker's parameters
  and both Adam moments averaged every K steps), written here as a loop over
  workers.

  DES-LOC averages each state on its own period; equal periods average all
  three at the same steps. The sides sum the means in different orders
  (W roundings each, three states) and Adam's update divides by the root of
  the second moment, whose relative error it passes on undamped: ops =
  rounds x 3 (W + 2), doubled for the carried-on steps.
  """
  params, batches = problem(seed, dims, workers)
  a, _ = run("desloc_equal", params, batches)
  want = _local_adam_reference(params, batches, H)
  got = [jax.tree.map(lambda x, w=w: x[w], a.params_W) for w in range(workers)]
  assert_within_rounding(got, want, 2 * rounds() * 3 * (workers + 2),
                         start=[params] * workers)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_desloc_averaging_only_parameters_is_fedavg_with_adam(
    seed, dims, workers):
  """DES-LOC whose moment periods lie beyond the run == FedAvg with the same
  Adam (H = Kx).

  Within the run only the parameters are averaged, every Kx steps, and each
  worker keeps its own Adam state, as FedAvg does: both replace the
  parameters by the same ``replace_with_mean``, so the bits agree.
  """
  params, batches = problem(seed, dims, workers)
  a, _ = run("desloc_params_only", params, batches)
  b, _ = run("fedavg_adam", params, batches)
  assert_same(a.params_W, b.params_W)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_hierarchical_diloco_with_one_group_is_diloco(seed, dims, workers):
  """Hierarchical DiLoCo with one group (default global averaging) ==
  DiLoCo with the regional outer optimizer.

  The regional tier is DiLoCo's outer step over the group's W workers (each
  keeps an identical copy of the outer state); the global tier, outer SGD
  at lr 1 over one group, sets theta <- theta - (theta - group) = group.
  Per sync: the mean of deltas against the delta of the mean (W + 2), the
  global step (2): ops = 2 rounds (W + 4).
  """
  params, batches = problem(seed, dims, workers)
  a, ga = run("hier_one_group", params, batches)
  b, gb = run("diloco", params, batches)
  assert_within_rounding(ga, gb, 2 * rounds() * (workers + 4), start=params)
  assert_within_rounding(a.params_W, b.params_W, 2 * rounds() * (workers + 4))


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_hierarchical_diloco_with_groups_of_one_is_diloco_with_its_global_outer(
    seed, dims, workers):
  """Hierarchical DiLoCo with groups of one worker, regional outer SGD at
  lr 1 and R = 1 == DiLoCo with the global outer optimizer.

  A group of one's regional step, g <- g - 1 x (g - theta_w), makes its
  model theta_w (to two roundings), and the global tier is DiLoCo's outer
  step over the W group models. ops = 2 rounds (W + 4).
  """
  params, batches = problem(seed, dims, workers)
  _, ga = run("hier_groups_of_one", params, batches)
  _, gb = run("diloco", params, batches)
  assert_within_rounding(ga, gb, 2 * rounds() * (workers + 4), start=params)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_codec_cast_float32_is_no_codec(seed, dims, workers):
  """A codec of ``cast:float32`` == no codec.

  Casting float32 values to float32 is the identity. DDP averages what the
  workers decode exactly as it averages raw gradients: the bits agree.
  DiLoCo without a codec computes theta - mean_w theta_w, and with one the
  mean of the decoded theta - theta_w: ops = 2 rounds (W + 2).
  """
  params, batches = problem(seed, dims, workers)
  a, _ = run("ddp_cast", params, batches)
  b, _ = run("ddp", params, batches)
  assert_same(a.params_W, b.params_W)
  _, ga = run("diloco_cast", params, batches)
  _, gb = run("diloco", params, batches)
  assert_within_rounding(ga, gb, 2 * rounds() * (workers + 2), start=params)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_top_k_with_k_all_is_no_codec(seed, dims, workers):
  """Top-k with k = every entry == no codec (DDP).

  The payload holds every value and its index; decoding scatters each
  value back to its place, so every worker's gradient arrives unchanged and
  is averaged as DDP's is: the bits agree.
  """
  params, batches = problem(seed, dims, workers)
  a, _ = run("ddp_topk_all", params, batches)
  b, _ = run("ddp", params, batches)
  assert_same(a.params_W, b.params_W)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_error_feedback_with_a_lossless_codec_is_none(seed, dims, workers):
  """Error feedback (any beta) with a lossless codec == no error feedback.

  E <- beta E + x; m = decode(encode(E)); E <- E - m. From E = 0: E = beta x
  0 + x = x exactly, m = x, and E = x - x = 0 again: every round sends
  exactly x and keeps a zero residual, so the bits agree.
  """
  params, batches = problem(seed, dims, workers)
  a, ga = run("diloco_cast_ef", params, batches)
  b, gb = run("diloco_cast", params, batches)
  assert_same(ga, gb)
  assert_same(a.params_W, b.params_W)
  residuals = [r for r in jax.tree.leaves(a.comm.residual_W)
               if jnp.issubdtype(r.dtype, jnp.floating) and r.ndim > 1]
  assert residuals and not any(np.any(np.asarray(r)) for r in residuals)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_sparta_diloco_with_p_1_and_outer_averaging_is_sparta_with_p_1(
    seed, dims, workers):
  """SPARTA-DiLoCo with p = 1 and outer SGD at lr 1 == SPARTA with p = 1.

  With p = 1 every step averages every parameter, so at a sync all workers
  hold the same theta_bar and the outer step sets theta <- theta - (theta -
  theta_bar) = theta_bar, where they already are. ops: the outer step's
  two roundings per sync, doubled for the steps after it: 4 rounds.
  """
  params, batches = problem(seed, dims, workers)
  a, _ = run("sparta_diloco_p1", params, batches)
  b, _ = run("sparta_p1", params, batches)
  assert_within_rounding(a.params_W, b.params_W, 4 * rounds() + 2,
                         start=params)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_muloco_with_an_adam_inner_and_no_codec_is_diloco(seed, dims, workers):
  """MuLoCo with an Adam inner optimizer and no codec == DiLoCo with them.

  MuLoCo is DiLoCo with Muon inside and a compressed message; given Adam
  and no codec, it builds the same parts: the bits agree.
  """
  params, batches = problem(seed, dims, workers)
  a, ga = run("muloco_adam", params, batches)
  b, gb = run("diloco_adam", params, batches)
  assert_same(ga, gb)
  assert_same(a.params_W, b.params_W)


@SETTINGS
@given(seed=SEEDS, dims=DIMS)
def test_noloco_with_two_workers_is_diloco_with_its_outer_optimizer(seed, dims):
  """NoLoCo with W = 2 == DiLoCo with the same (heavy-ball) outer optimizer,
  for any pull.

  Two workers are always one pair, so the pair's means are the global ones.
  Both workers' outer weights phi start equal and get the same update, so
  the pull term mean(phi) - phi_i is 0, and d_i = mean(theta) - phi:
  NoLoCo feeds -d_i = phi - mean(theta), DiLoCo's pseudo-gradient, to the
  same optimizer. ops = 2 rounds (W + 4).
  """
  params, batches = problem(seed, dims, 2)
  a, ga = run("noloco", params, batches)
  b, gb = run("diloco_heavy_ball", params, batches)
  assert_within_rounding(ga, gb, 2 * rounds() * 6, start=params)
  assert_within_rounding(a.params_W, b.params_W, 2 * rounds() * 6)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_demo_with_identical_data_is_demo_on_one_worker(seed, dims, workers):
  """DeMo whose W workers see the same batches == DeMo on one worker.

  Each worker's momentum, DCT and top-k see the same values, and the
  update is the sign of the coefficients' mean over their senders (the
  mean of W equal values, sign-exact) or of their sum (W x, the same sign):
  every worker's parameters are the single worker's.
  """
  params, batches = problem(seed, dims, workers, same_data=True)
  a, _ = run("demo", params, batches)
  b, _ = run("demo", params, jax.tree.map(lambda x: x[:, :1], batches))
  for w in range(workers):
    assert_same(jax.tree.map(lambda x, w=w: x[w], a.params_W),
                jax.tree.map(lambda x: x[0], b.params_W))


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_identical_data_keeps_workers_identical_and_equal_to_one_run(
    seed, dims, workers):
  """Identical batches on every worker keep DiLoCo's workers identical (bit
  for bit: each computes the same function of the same values) and equal to
  a single-worker run, up to the mean of W equal values: (W x)/W can round
  (W - 1 additions and a division): ops = 2 rounds (W + 2).
  """
  params, batches = problem(seed, dims, workers, same_data=True)
  a, ga = run("diloco", params, batches)
  for w in range(1, workers):
    assert_same(jax.tree.map(lambda x, w=w: x[w], a.params_W),
                jax.tree.map(lambda x: x[0], a.params_W))
  _, gb = run("diloco", params, jax.tree.map(lambda x: x[:, :1], batches))
  assert_within_rounding(ga, gb, 2 * rounds() * (workers + 2), start=params)


def _lookahead_reference(params, batches, alpha):
  """One model trained by optax.lookahead(SGD, H, alpha): the fast weights
  take H steps, then slow <- slow + alpha (fast - slow) and fast <- slow."""
  opt = optax.lookahead(sgd(), sync_period=H, slow_step_size=alpha)
  p = optax.LookaheadParams.init_synced(params)
  state = opt.init(p)

  @jax.jit
  def step(p, state, batch):
    g = jax.grad(loss_fn)(p.fast, batch)
    u, state = opt.update(g, state, p)
    return optax.apply_updates(p, u), state

  for t in range(batches["x"].shape[0]):
    p, state = step(p, state, jax.tree.map(lambda x: x[t, 0], batches))
  return p.slow


@SETTINGS
@given(seed=SEEDS, dims=DIMS)
def test_diloco_on_one_worker_is_lookahead(seed, dims):
  """DiLoCo with W = 1 and outer SGD at lr alpha, no momentum == one model
  under optax.lookahead(inner, sync_period=H, slow_step_size=alpha).

  DiLoCo: theta <- theta - alpha (theta - theta_1); Lookahead: slow <- slow
  + alpha (fast - slow); both restart the fast weights from it and keep the
  inner state. Per sync: the difference, the product, the sum (3), doubled
  for the steps after it: ops = 6 rounds.
  """
  params, batches = problem(seed, dims, 1)
  _, got = run("diloco_sgd_outer", params, batches)
  want = _lookahead_reference(params, batches, 0.7)
  assert_within_rounding(got, want, 6 * rounds(), start=params)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, experts=st.sampled_from([2, 3]))
def test_spes_with_one_worker_owning_everything_is_diloco(seed, dims, experts):
  """SPES with one worker owning every expert == DiLoCo.

  The only worker trains the shared parameters and all experts (nothing is
  frozen), and the global model takes the shared mean over one worker and
  each expert from its owner, that same worker: DiLoCo's outer step on the
  same pseudo-gradient, computed as a sum over the owner rows instead of a
  mean over workers: ops = 2 rounds x 3.
  """
  params, batches = problem(seed, dims, 1, experts=experts)
  a, ga = run("spes", params, batches)
  b, gb = run("diloco", params, batches)
  assert_within_rounding(ga, gb, 6 * rounds(), start=params)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_async_diloco_with_delayed_nesterov_n_w_is_nesterov_diloco(
    seed, dims, workers):
  """Asynchronous DiLoCo with Delayed Nesterov N = W, every worker arriving
  together (driven step by step) == DiLoCo with Nesterov outer SGD at the
  same rate and momentum.

  W arrivals at once: share = (W / N) g = g, the momentum moves (count W >=
  N): m <- mu m + g, and the step is -lr (g + mu m), Nesterov's. The server
  averages the decoded deltas where DiLoCo subtracts the mean: ops = 2
  rounds (W + 3).
  """
  params, batches = problem(seed, dims, workers)
  _, ga = run("async_nesterov", params, batches, workers)
  _, gb = run("diloco_injected", params, batches)
  assert_within_rounding(ga, gb, 2 * rounds() * (workers + 3), start=params)


@SETTINGS
@given(seed=SEEDS, dims=DIMS, workers=WORKERS)
def test_ddp_with_w_workers_of_batch_b_is_one_model_with_batch_w_b(
    seed, dims, workers):
  """DDP with W workers of batch b == one model trained on batch W x b.

  The mean over workers of each worker's mean-loss gradient over b
  examples is the gradient of the mean loss over all W b examples. The
  sides sum the W b per-example terms in different groupings: W + 2
  roundings per step (the outer mean and the step): ops = STEPS (W + 2),
  doubled for the steps after.
  """
  params, batches = problem(seed, dims, workers)
  a, _ = run("ddp_sgd_plain", params, batches)
  one = jax.tree.map(lambda x: x.reshape((x.shape[0], 1, -1) + x.shape[3:]),
                     batches)
  b, _ = run("ddp_sgd_plain", params, one)
  assert_within_rounding(jax.tree.map(lambda x: x[0], a.params_W),
                         jax.tree.map(lambda x: x[0], b.params_W),
                         2 * STEPS * (workers + 2), start=params)


# ----------------------------------------------------- transforms alone
@SETTINGS
@given(seed=SEEDS, workers=st.sampled_from([1, 2, 3, 4, 5]),
       shape=st.sampled_from([(7,), (2, 3)]))
def test_robust_median_and_trimmed_mean_of_identical_workers_are_the_mean(
    seed, workers, shape):
  """The coordinate-wise median of W identical rows is that row exactly (the
  middle value, or (x + x) / 2 = x); their mean and trimmed mean are sums
  of up to W copies divided by their count, within W roundings of it."""
  row = np.random.default_rng(seed).normal(size=shape).astype(np.float32)
  tree_W = {"a": jnp.asarray(np.repeat(row[None], workers, axis=0))}
  assert_same(robust_mean(tree_W, "median"), {"a": row})
  assert_within_rounding(worker_mean(tree_W), {"a": row}, workers)
  assert_within_rounding(robust_mean(tree_W, "trimmed_mean", 0.2),
                         {"a": row}, workers)


@SETTINGS
@given(seed=SEEDS, shape=st.sampled_from([(300,), (16, 20)]))
def test_quantize_8_bits_of_values_on_its_grid_is_exact(seed, shape):
  """8-bit linear quantization of values already on its grid decodes them
  exactly.

  The grid is lo + c (hi - lo) / 255 for codes c in [0, 255]. With lo a
  multiple of 2^-8 and hi = lo + 255 x 2^-8 (both codes present), the step
  is 2^-8 exactly, (v - lo) / step is the integer c exactly and lo + c x
  2^-8 is v again: no rounding anywhere.
  """
  rng = np.random.default_rng(seed)
  codes = rng.integers(0, 256, size=int(np.prod(shape)))
  codes[:2] = (0, 255)  # both ends present: min and max are lo and hi
  rng.shuffle(codes)
  lo = rng.integers(-512, 512) / 256
  x = jnp.asarray((lo + codes / 256).reshape(shape), jnp.float32)
  codec = quantize(8)
  key = jax.random.PRNGKey(0)
  assert_same(codec.decode(codec.encode(x, key, 0), key), x)


# -------------------------------------------------- through the engine
RUN = dict(model=lowbw.models.mlp(hidden=(8,), num_classes=10),
           data=lowbw.data.digits(), workers=4, batch_size=8, steps=12,
           eval_every=6)


@functools.cache
def _built(name: str):
  net = lowbw.network.network("100Mbps", "20ms", hardware="0.5s",
                              speeds=[1.0] * 4)
  if name == "async":
    return lowbw.build(strategy=strategies.async_diloco(sgd(), H=H),
                       network=net, **RUN)
  if name == "sync":
    return lowbw.build(strategy=strategies.diloco(sgd(), H=H), network=net,
                       **RUN)
  if name == "lane":
    return lowbw.build(strategy=strategies.diloco(sgd(), H=H), shadow=sgd(),
                       **RUN)
  return lowbw.build(strategy=strategies.ddp(sgd()), **RUN)


@settings(max_examples=2, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**20))
def test_async_diloco_on_an_equal_fleet_is_diloco(seed):
  """Asynchronous DiLoCo on a fleet of equal workers == DiLoCo (the engine's
  schedule, not a notebook's step).

  Equal speeds make every worker's H steps end in the same engine step, so
  all W arrivals land together and are one outer step on their mean, from
  the model all of them pulled: synchronous DiLoCo. The server averages
  decoded deltas, DiLoCo subtracts the mean: per sync W + 2 roundings,
  carried through the rounds (12 steps, H = 3): ops = 2 x 4 (W + 2).
  """
  a = _built("async").run(seed=seed, progress=False)
  b = _built("sync").run(seed=seed, progress=False)
  # The losses are sums over examples of functions of these parameters:
  # the same relative tolerance as the parameters' rounding.
  ops = 2 * 4 * (4 + 2)
  assert_within_rounding(a.params, b.params, ops, start=None)
  np.testing.assert_allclose(a.history["eval_loss"], b.history["eval_loss"],
                             rtol=ops * EPS * 10)


@settings(max_examples=2, deadline=None, derandomize=True, database=None)
@given(seed=st.integers(0, 2**20))
def test_a_paired_ddp_lane_is_a_ddp_run(seed):
  """A run's paired DDP lane (``shadow``) == a DDP run with the same seed,
  workers, batch size and optimizer: it samples the run's batches and
  applies the optimizer to their mean gradient, as DDP does."""
  a = _built("lane").run(seed=seed, progress=False)
  b = _built("ddp").run(seed=seed, progress=False)
  at = ~np.isnan(b.history["eval_loss"])
  assert_within_rounding(a.state.shadow.params, b.params, 2 * 12 * (4 + 2))
  np.testing.assert_allclose(np.asarray(a.history["shadow_eval_loss"])[at],
                             b.history["eval_loss"][at], rtol=1e-5)

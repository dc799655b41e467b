"""MT-DAO against its update written in NumPy over a Python list of workers,
its one-timescale limit against DES-LOC (Local Adam), and its bytes."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from lowbw import cli, strategies
from toy_regression import loss_fn, problem

W, STEPS, LR, B2 = 3, 12, 0.05, 0.95
OMEGA, BETAS, OMEGAS = 0.5, (0.9,), (0.3,)   # the gradient's weight: 0.2
B1 = 0.99   # the inner optimizer's own first moment: the slow one


def mean_over(trees):
  return {k: sum(t[k] for t in trees) / len(trees) for k in trees[0]}


def reference_step(kind, t, g, x, us, v, decays, weights):
  """One worker's step t (1-based) of the paper's update, in place: the
  first moments ``us`` (one per decay) and the second moment ``v`` of the
  gradient ``g``. Adam: ((1 - sum w) g + sum w_j u_j / (1 - b_j^t)) /
  (sqrt(v / (1 - b2^t)) + eps). ADOPT: the same mix of the gradient
  normalised by the previous v (clipped to (t-1)^0.25) and the moments of
  that normalised gradient; its first step only sets v."""
  rest = 1 - sum(weights)
  for k in x:
    if kind == "adam":
      for j, b in enumerate(decays):
        us[j][k] = b * us[j][k] + (1 - b) * g[k]
      v[k] = B2 * v[k] + (1 - B2) * g[k] ** 2
      denom = np.sqrt(v[k] / (1 - B2 ** t)) + 1e-8
      mix = rest * g[k] + sum(w * u[k] / (1 - b ** t) for w, u, b in
                              zip(weights, us, decays))
      x[k] = x[k] - LR * mix / denom
    elif t == 1:
      v[k] = g[k] ** 2
    else:
      clip = (t - 1) ** 0.25
      gn = np.clip(g[k] / np.maximum(np.sqrt(v[k]), 1e-6), -clip, clip)
      for j, b in enumerate(decays):
        us[j][k] = b * us[j][k] + (1 - b) * gn
      v[k] = B2 * v[k] + (1 - B2) * g[k] ** 2
      mix = rest * gn + sum(w * u[k] for w, u in zip(weights, us))
      x[k] = x[k] - LR * mix


def inner_of(kind):
  return strategies.inner_optimizer(kind, LR, b1=B1, b2=B2)


@pytest.mark.parametrize("kind", ["adam", "adopt"])
def test_mtdao_matches_the_papers_update_per_worker(kind):
  """Three timescales (the gradient, a first moment of 0.9 and the inner
  optimizer's of 0.99) over one second moment; parameters averaged after
  every 2nd step, the first moments every 3rd, the second every 4th, for
  13 steps (the last one unaveraged)."""
  Kx, Ku, Kv, steps = 2, 3, 4, 13
  params, batches = problem(steps, W)
  strategy = strategies.mtdao(inner_of(kind), Kx=Kx, Ku=Ku, Kv=Kv,
                              omega=OMEGA, betas=BETAS, omegas=OMEGAS)
  state = strategy.init(params, W, jax.random.key(0))
  step = jax.jit(strategy.step)
  grads = jax.jit(jax.vmap(jax.grad(loss_fn)))
  decays, weights = (B1, *BETAS), (OMEGA, *OMEGAS)
  x = [jax.tree.map(np.asarray, params) for _ in range(W)]
  zeros = lambda: jax.tree.map(np.zeros_like, x[0])  # noqa: E731
  us = [[zeros() for _ in decays] for _ in range(W)]
  v = [zeros() for _ in range(W)]
  sent = {"params": 0, "first_moment": 0, "second_moment": 0}
  for t in range(1, steps + 1):
    batch = jax.tree.map(lambda b: b[t - 1], batches)
    state, report = step(state, grads(state.params_W, batch))
    for name in sent:
      sent[name] += int(report[name])
    for w in range(W):
      g = jax.grad(loss_fn)(jax.tree.map(jnp.asarray, x[w]),
                            jax.tree.map(lambda b: b[w], batch))
      reference_step(kind, t, jax.tree.map(np.asarray, g), x[w], us[w], v[w],
                     decays, weights)
    if t % Kx == 0:
      mean = mean_over(x)
      x[:] = [dict(mean) for _ in range(W)]
    if t % Ku == 0:
      for j in range(len(decays)):
        mean = mean_over([u[j] for u in us])
        for u in us:
          u[j] = dict(mean)
    if t % Kv == 0:
      mean = mean_over(v)
      v[:] = [dict(mean) for _ in range(W)]
  for w in range(W):
    for k in x[w]:
      np.testing.assert_allclose(state.params_W[k][w], x[w][k], atol=2e-5)
  assert sent == {"params": steps // Kx, "first_moment": steps // Ku,
                  "second_moment": steps // Kv}
  # the workers drift between averagings, and the moments are not all equal
  assert float(jnp.std(state.params_W["w"], axis=0).max()) > 1e-4
  extra = state.inner_W.extra_mu[0]["w"]
  assert not np.allclose(extra, optax.tree_utils.tree_get(
      state.inner_W.inner, "mu")["w"])


def test_one_timescale_is_local_adam_and_desloc_bit_for_bit():
  """omega = 1 and no extra decay: each worker applies its inner optimizer
  alone, which is DES-LOC with Kx = Ku = Kv = K (Local Adam): the same
  states, reports and channels, bit for bit."""
  K = 3
  params, batches = problem(STEPS, W)
  mt = strategies.mtdao(inner_of("adam"), Kx=K, omega=1.0)
  dl = strategies.desloc(inner_of("adam"), Kx=K, Ku=K, Kv=K)
  grads = jax.jit(jax.vmap(jax.grad(loss_fn)))
  states = [s.init(params, W, jax.random.key(0)) for s in (mt, dl)]
  steps = [jax.jit(s.step) for s in (mt, dl)]
  for t in range(STEPS):
    batch = jax.tree.map(lambda b: b[t], batches)
    out = [step(st, grads(st.params_W, batch))
           for step, st in zip(steps, states)]
    states = [s for s, _ in out]
    assert out[0][1] == pytest.approx(out[1][1])
  a, b = states
  for k in params:
    np.testing.assert_array_equal(a.params_W[k], b.params_W[k])
  assert a.inner_W.extra_mu == ()
  for x, y in zip(jax.tree.leaves(a.inner_W.inner), jax.tree.leaves(b.inner_W)):
    np.testing.assert_array_equal(x, y)
  assert ({n: c.payload_bytes for n, c in mt.channels(params, W).items()} ==
          {n: c.payload_bytes for n, c in dl.channels(params, W).items()})


def test_mtdao_channels_send_each_first_moment():
  params = {"w": jnp.zeros((64, 32)), "b": jnp.zeros((32,))}
  B = 4 * (64 * 32 + 32)
  channels = strategies.mtdao(betas=(0.9, 0.99), omegas=(0.05, 0.05),
                              omega=0.8).channels(params, 8)
  assert {n: c.payload_bytes for n, c in channels.items()} == {
      "params": B, "first_moment": 3 * B, "second_moment": B}
  for c in channels.values():
    assert c.collective == "ring_allreduce"
    assert c.wire_bytes == pytest.approx(2 * 7 / 8 * c.payload_bytes)


def test_mtdao_trains_from_the_cli_with_its_bytes(tmp_path):
  """(T/Kx + N T/Ku + T/Kv) B per worker, N = 1 first moment at the
  defaults; the loss falls."""
  steps, out = 24, tmp_path / "run"
  assert cli.main(["train", "--strategy", "mtdao", "--data", "digits",
                   "--hidden", "8", "--workers", "2", "--batch-size", "8",
                   "--steps", str(steps), "--eval-every", "12", "--Kx", "4",
                   "--Ku", "6", "--Kv", "12", "--inner-lr", "0.01",
                   "--no-progress", "--out", str(out)]) == 0
  rows = (out / "metrics.csv").read_text().splitlines()
  header = rows[0].split(",")
  first, last = (dict(zip(header, r.split(","))) for r in (rows[1], rows[-1]))
  P = 64 * 8 + 8 + 8 * 10 + 10
  assert int(last["payload_bytes"]) == (steps // 4 + steps // 6 +
                                        steps // 12) * 4 * P
  assert float(last["eval_loss"]) < float(first["train_loss"])
  config = json.loads((out / "config.json").read_text())
  assert config["strategy"]["name"] == "mtdao"
  assert config["strategy"]["omega"] == 0.9


def test_mtdao_defaults_are_the_papers():
  s = strategies.mtdao()
  assert (s.config["Kx"], s.config["Ku"], s.config["Kv"]) == (32, 32, 32)
  assert s.period == 32 and s.config["omega"] == 0.9
  hyper = s.config["inner"]["hyperparams"]
  assert (hyper["b1"], hyper["b2"]) == (0.999, 0.9999)   # ADOPT
  assert strategies.mtdao(Kx=4, Ku=6, Kv=10).period == 2


@pytest.mark.parametrize("call, field", [
    (lambda: strategies.mtdao(Kx=0), "Kx"),
    (lambda: strategies.mtdao(Ku=-3), "Ku"),
    (lambda: strategies.mtdao(omega=-0.1), "omega"),
    (lambda: strategies.mtdao(omega=0.8, betas=(0.9,), omegas=(0.3,)),
     "omega"),
    (lambda: strategies.mtdao(betas=(0.9,)), "omegas"),
    (lambda: strategies.mtdao(betas=(1.5,), omegas=(0.1,)), "betas"),
    (lambda: strategies.mtdao(optax.sgd(0.1)), "inner"),
    (lambda: strategies.mtdao(optax.adam(0.1)), "inner"),   # b1 not injected
])
def test_bad_mtdao_settings_name_the_field(call, field):
  with pytest.raises(ValueError, match=field):
    call()

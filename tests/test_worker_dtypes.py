"""Every strategy trains under every worker storage type: each pair builds,
runs a few rounds and ends with a finite loss (a strategy whose branches
return different types under a narrow worker state fails at build)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowbw
from lowbw import data, models, strategies
from lowbw.config._settings import WORKER_DTYPES

H = 2
STEPS = 2 * H
TINY_MOE = dict(layers=1, d_model=16, heads=2, seq_len=16, num_experts=4,
                top_k=2, expert_hidden=16)
# Settings that make each strategy communicate within STEPS (the registry
# defaults sync every 100 steps or more) on the tiny models below.
SETTINGS = {
    "hierarchical_diloco": {"global_every": 1},
    "spes": {"merge_warmup_steps": STEPS, "merge_every": H,
             "merge_top_k": 2},
    "desloc": {"Kx": 1, "Ku": H, "Kv": 2 * H},
    "mtdao": {"Kx": 1, "Ku": H, "Kv": 2 * H},
}
# Code paths the defaults do not reach: Streaming DiLoCo merges in its sync
# when delay is 0 and in its local step otherwise.
EXTRA = [("streaming_diloco", {"H": 2 * H, "delay": 1})]
CASES = [(name, {}) for name in strategies.SPECS] + EXTRA


def _strategy(name: str, extra: dict):
  spec = strategies.spec(name)
  kw = {"H": H} if any(p.name == "H" for p in spec.params) else {}
  return strategies.get(name, **{**kw, **SETTINGS.get(name, {}), **extra})


def _model_and_data(name: str):
  model = strategies.spec(name).model
  if model is None:
    return models.mlp(hidden=(8,)), data.digits()
  return (models.get(model, **TINY_MOE),
          data.text_bytes(seq_len=TINY_MOE["seq_len"]))


@pytest.mark.parametrize("dtype", WORKER_DTYPES)
@pytest.mark.parametrize("name,extra", CASES,
                         ids=[n + "".join(f"-{k}{v}" for k, v in e.items())
                              for n, e in CASES])
def test_every_strategy_trains_in_every_worker_dtype(name, extra, dtype):
  model, source = _model_and_data(name)
  if dtype == "float32":
    # Every other test trains every strategy in float32 (test_strategies'
    # registry, the equivalences); here it must build, where a dtype
    # mismatch between a strategy's branches would surface.
    sim = lowbw.build(model, source, _strategy(name, extra), workers=2,
                      batch_size=4, steps=STEPS, worker_dtype=dtype,
                      clock=False, compile=False)
    assert sim.config.worker_dtype == dtype
    return
  r = lowbw.simulate(model, source, _strategy(name, extra), workers=2,
                     batch_size=4, steps=STEPS, eval_every=STEPS,
                     eval_examples=32, progress=False, worker_dtype=dtype,
                     clock=False)
  assert r.config["worker_dtype"] == dtype
  assert np.all(np.isfinite(r.history["train_loss"]))
  assert np.isfinite(r.summary["final_eval_loss"])
  assert r.summary["wire_bytes"] > 0  # it communicated
  # Worker tensors are stored in the asked type, the global model in float32.
  st = r.state.strategy
  stored = {x.dtype for x in jax.tree.leaves((st.params_W, st.inner_W))
            if x.ndim >= 2 and jnp.issubdtype(x.dtype, jnp.floating)}
  assert stored == {jnp.dtype(dtype)}
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(r.params))

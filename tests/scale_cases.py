"""Runs shared by test_scale.py and the subprocesses it starts.

``python scale_cases.py devices OUT``: with 4 host devices (XLA_FLAGS set by
the caller), every case on 1 device and on 4; writes both trajectories to OUT.
``python scale_cases.py process PORT ID OUT``: process ID of 2 joins
``jax.distributed`` on 127.0.0.1:PORT and runs the multi-process case (the
``diloco_q4_ef_faults`` case, whose one-device run ``devices`` writes)
three times from one build, logging in OUT's folder: uninterrupted
(``whole``), checkpointed and stopped halfway (``stopped``), resumed from
that checkpoint; process 0 writes the trajectories to OUT.
"""

import json
import os
import sys

import numpy as np
import optax

W, STEPS = 8, 6  # two rounds of H = 3


def cases():
  from lowbw import network, strategies, transforms
  faults = network.network(
      "100Mbps", "10ms", faults=network.Faults(drop_prob=0.2),
      stragglers=network.Stragglers(jitter=0.3, mitigation="threshold",
                                    fraction=0.75))
  uneven = network.network("100Mbps", "10ms", hardware="0.01s",
                           speeds=[1.0] * (W - 1) + [0.5])
  byzantine = network.network(
      "100Mbps", "10ms", hardware="0.01s",
      faults=network.Faults(byzantine=(5,), byzantine_kind="random",
                            joins=((2, 3),)))
  return {
      # The schedule's per-worker state and arrivals across devices.
      "async_diloco_uneven": (strategies.async_diloco(
          optax.adamw(1e-3), H=3, delayed_nesterov=4), uneven),
      # A syncer's quorum and token weights over all devices' learners;
      # a learner down for a window pulls the model back.
      "decoupled_diloco_window": (strategies.decoupled_diloco(
          optax.adamw(1e-3), H=3, quorum=3, grace=0.5, dylu=True),
          uneven._replace(faults=network.Faults(windows=((1, 2, 6),)))),
      # Two fragments, each with its own quorum and window: the (W, P)
      # messages over all devices' learners.
      "decoupled_diloco_fragments": (strategies.decoupled_diloco(
          optax.adamw(1e-3), H=3, quorum=3, grace=0.5, fragments=2),
          uneven._replace(faults=network.Faults(windows=((1, 2, 6),)))),
      # A coordinate-wise median over all devices' workers, corrupted
      # messages keyed by the global worker index, a join's download.
      "diloco_median_byzantine": (strategies.diloco(
          optax.adamw(1e-3), H=3, robust="median"), byzantine),
      "ddp": (strategies.ddp(optax.sgd(0.1)), None),
      "diloco": (strategies.diloco(optax.adamw(1e-3), H=3), None),
      # Each worker's own outer model: the mix's 1/W is all devices' W.
      "diloco_eager": (strategies.diloco(optax.adamw(1e-3), H=3,
                                         outer_delay=1, eager=True), None),
      "sparta": (strategies.sparta(optax.adamw(1e-3), p=0.05), None),
      # Groups that span devices, private codec noise, and the fault masks.
      "fedavg_islands": (strategies.fedavg(optax.sgd(0.1), H=3,
                                           island_size=2), None),
      "diloco_q4_ef_faults": (strategies.diloco(
          optax.adamw(1e-3), H=3,
          codec=transforms.parse_codec("quant:4:stochastic"),
          error_feedback=0.9), faults),
      # Gossip across devices: each gathers its peers' rows (a random
      # cycle, a momentum on the proposals; the matching NoLoCo shares),
      # with workers down.
      "gasloc_two_peer_faults": (strategies.gasloc(
          optax.adamw(1e-3), H=3, graph="two_peer", accel=0.2), faults),
      "noloco_faults": (strategies.noloco(optax.adamw(1e-3), H=3), faults),
      # The paired DDP lane: each device's gradient over its own workers,
      # averaged over devices; evaluated from the replicated replica.
      "diloco_shadow": (strategies.diloco(optax.adamw(1e-3), H=3), None,
                        {"shadow": "ddp"}),
      # Sampled clients: every device's slots draw from the replicated
      # clients' table, by their global slot index.
      "fedavg_clients": (strategies.fedavg(optax.adamw(1e-3), H=3), None,
                         {"clients": 40}),
  }


def _fields(strategy, net, devices, workers=W, steps=STEPS):
  from lowbw import models
  return dict(model=models.mlp(hidden=(16,)), data="digits",
              strategy=strategy, workers=workers, batch_size=4, steps=steps,
              seed=3, progress=False, devices=devices, eval_examples=64,
              **({"clock": False} if net is None else {"network": net}))


def trajectory(strategy, net, devices, workers=W, steps=STEPS, **kw):
  import lowbw
  return _summed(lowbw.simulate(**_fields(strategy, net, devices, workers,
                                          steps), **kw))


def _summed(r):
  import jax
  hist = {k: np.asarray(v).tolist() for k, v in r.history.items()
          if k != "wall_time_s"}
  params = [np.asarray(x).ravel().tolist() for x in jax.tree.leaves(r.params)]
  return {"history": hist, "params": params, "devices": r.config["devices"],
          "processes": r.config["processes"]}


def stopped_and_resumed(strategy, net, folder):
  """One build, three runs: ``folder/whole`` runs uninterrupted;
  ``folder/stopped`` checkpoints at step 3 and is stopped (Ctrl-C, with
  step 4's row already in its metrics.csv), then resumed to the end in the
  same folder. Returns the uninterrupted and the resumed trajectories."""
  import lowbw
  sim = lowbw.build(**_fields(strategy, net, None))
  whole = _summed(sim.run(seed=3, out=os.path.join(folder, "whole")))

  def ctrl_c(row):
    if row["step"] > STEPS // 2:
      raise KeyboardInterrupt

  stopped = os.path.join(folder, "stopped")
  try:
    sim.run(seed=3, out=stopped, checkpoint_every=STEPS // 2, callback=ctrl_c)
  except KeyboardInterrupt:
    pass
  else:
    raise AssertionError("the run was not stopped")
  resumed = _summed(sim.run(seed=3, out=stopped, resume_from=stopped))
  return whole, resumed


def main(argv):
  import gc
  import jax
  import lowbw  # noqa: F401  (imported before the heap is frozen)
  jax.config.update("jax_numpy_rank_promotion", "raise")
  # As in the test processes (conftest's GC_THRESHOLD): what is alive now is
  # frozen out of the cyclic collector's walks, which run a tenth as often.
  gc.collect()
  gc.freeze()
  gc.set_threshold(10_000, 50, 50)
  if argv[0] == "devices":
    out = {}
    for name, (strategy, net, *kw) in cases().items():
      kw = kw[0] if kw else {}
      out[name] = [trajectory(strategy, net, 1, **kw),
                   trajectory(strategy, net, 4, **kw)]
    # A checkpoint written on 4 devices, resumed on 1.
    import tempfile
    strategy, net = cases()["diloco"]
    with tempfile.TemporaryDirectory() as tmp:
      trajectory(strategy, net, 4, steps=3, out=tmp, checkpoint_every=3)
      resumed = trajectory(strategy, net, 1, resume_from=tmp)
    out["resume_4_to_1"] = [out["diloco"][0], resumed]
    path = argv[1]
  else:
    port, pid, path = argv[1], int(argv[2]), argv[3]
    import lowbw
    lowbw.initialize(f"127.0.0.1:{port}", 2, pid)
    strategy, net = cases()["diloco_q4_ef_faults"]
    whole, resumed = stopped_and_resumed(strategy, net,
                                         os.path.dirname(path))
    out = {**whole, "resumed": resumed}
    if pid != 0:
      return
  with open(path, "w") as f:
    json.dump(out, f)


if __name__ == "__main__":
  main(sys.argv[1:])

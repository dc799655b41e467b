"""Eval loss at every sync of MuLoCo with top-k 10% pseudo-gradients, with and
without error feedback: the trajectory behind the one outlier of
muloco_compression.py (same settings: default GPT, 4 workers, batch 8, H = 30,
300 steps, Muon lr 2e-2 with warm-up and cosine decay to 0.1x).

Usage:
  python experiments/muloco_topk_trajectory.py      # about 2 minutes on 2 CPU cores
"""

import numpy as np
import optax

import lowbw
from lowbw import data, models, strategies, transforms

STEPS, LR = 300, 2e-2


def main():
  for beta in (0.9, None):
    schedule = optax.warmup_cosine_decay_schedule(0.0, LR, 30, STEPS,
                                                  end_value=0.1 * LR)
    strategy = strategies.muloco(
        strategies.muon_inner(schedule),
        optax.sgd(0.8, momentum=0.9, nesterov=True), H=30,
        codec=transforms.top_k(0.1), error_feedback=beta)
    result = lowbw.simulate(
        model=models.gpt(), data=data.text_bytes(), strategy=strategy,
        num_workers=4, batch_size=8, steps=STEPS, eval_every=30,
        eval_examples=256, progress=False)
    h = result.history
    logged = ~np.isnan(h["eval_loss"])
    print(f"error feedback {beta}: eval loss at steps "
          f"{h['step'][logged].tolist()}:")
    print("  " + ", ".join(f"{v:.3f}" for v in h["eval_loss"][logged]),
          flush=True)


if __name__ == "__main__":
  main()

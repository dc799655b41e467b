"""Writes a digits-shaped dataset of any size as ``.npz`` arrays, for
benchmarks whose W·b outgrows the digits' 1,438 examples.

Each example is 8x8x1 standard-normal pixels; its label (10 classes) is the
argmax of a fixed random linear map of the pixels, so the task is learnable.
Seeded: the same arguments write the same file.

Usage:
  python benchmarks/synthetic_digits.py --examples 80000 --out /tmp/digits80k.npz
  lowbw bench --model mlp --data /tmp/digits80k.npz --strategy diloco --workers 1000,10000
"""

import argparse

import numpy as np


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--examples", type=int, default=80_000,
                 help="training examples (default 80000)")
  p.add_argument("--out", required=True, help="the .npz file to write")
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args()
  if args.examples < 1:
    p.error(f"--examples={args.examples}: expected an integer >= 1")
  rng = np.random.default_rng(args.seed)
  x = rng.normal(size=(args.examples, 8, 8, 1)).astype(np.float32)
  mix = rng.normal(size=(64, 10))
  y = np.argmax(x.reshape(args.examples, 64) @ mix, axis=1).astype(np.int32)
  np.savez(args.out, x=x, y=y)
  print(f"wrote {args.out}: x {x.shape} float32, y {y.shape} int32")


if __name__ == "__main__":
  main()

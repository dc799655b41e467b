"""Client populations: speed and memory of ``clients=M`` against a plain run.

FedAvg on the digits MLP (hidden 64), W = 64 workers per round, H = 10,
batch 16 per worker. Each configuration runs in its own child process (a
clean peak): the plain run (64 workers, each a client of its own) and runs
of M clients of which 64 are drawn every round. Each reports

- ``steps_per_s``: the run's summary figure (after compiling);
- ``peak_bytes``: the process's peak resident memory (VmHWM) after the run;
- ``table_bytes``: the clients' shard table on the device, (M, shard) int32.

With ``--repeats R`` the configurations run R times, interleaved, and the
table shows the median speed and the largest peak (a shared machine's load
moves single runs by tens of percent). *Per client* is the growth of the
peak between the two largest populations over the growth of M: what an
idle client costs.

Usage:
  python benchmarks/clients.py                      # plain, 1,000, 100,000
  python benchmarks/clients.py --repeats 3
  python benchmarks/clients.py --clients 1000,10000,100000 --steps 500
"""

import argparse
import json
import statistics
import subprocess
import sys

_CHILD = """
import json, sys
import lowbw

from lowbw.bench import _proc_status as rss  # /proc/self/status, bytes

clients = None if sys.argv[1] == "none" else int(sys.argv[1])
workers, steps = int(sys.argv[2]), int(sys.argv[3])
config = lowbw.Config(strategy="fedavg", data="digits", model="mlp",
                      hidden="64", workers=workers, clients=clients, H=10,
                      steps=steps, batch_size=16, seed=0, progress=False)
sim = lowbw.build(config)
result = sim.run(seed=0)
sampler = sim.initial(0)[1]
table = sum(x.nbytes for x in (getattr(sampler, "shard_idx_M", None),
                               getattr(sampler, "shard_len_M", None))
            if x is not None)
print(json.dumps({"clients": clients, "steps_per_s":
                  result.summary["steps_per_s"], "peak_bytes": rss("VmHWM"),
                  "table_bytes": table,
                  "eval_loss": result.summary["final_eval_loss"]}))
"""


def measure(clients, workers: int, steps: int) -> dict:
  out = subprocess.run(
      [sys.executable, "-c", _CHILD, "none" if clients is None else
       str(clients), str(workers), str(steps)],
      check=True, capture_output=True, text=True)
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--clients", default="1000,100000",
                      help="populations M, comma-separated")
  parser.add_argument("--workers", type=int, default=64,
                      help="clients drawn per round")
  parser.add_argument("--steps", type=int, default=2000)
  parser.add_argument("--repeats", type=int, default=1)
  args = parser.parse_args()
  populations = [None] + [int(m) for m in args.clients.split(",")]
  runs = [[measure(m, args.workers, args.steps) for m in populations]
          for _ in range(args.repeats)]
  rows = [dict(r[0], steps_per_s=statistics.median(
      x["steps_per_s"] for x in r), peak_bytes=max(x["peak_bytes"] for x in r))
          for r in zip(*runs)]
  plain = rows[0]["steps_per_s"]
  print(f"{'clients':>9} {'steps/s':>8} {'ratio':>6} {'peak MiB':>9} "
        f"{'table MiB':>9} {'eval_loss':>9}")
  for r in rows:
    print(f"{str(r['clients'] or 'plain'):>9} {r['steps_per_s']:8.1f} "
          f"{r['steps_per_s'] / plain:6.2f} {r['peak_bytes'] / 2**20:9.1f} "
          f"{r['table_bytes'] / 2**20:9.2f} {r['eval_loss']:9.4f}")
  if len(rows) >= 3:
    a, b = rows[-2], rows[-1]
    per = (b["peak_bytes"] - a["peak_bytes"]) / (b["clients"] - a["clients"])
    print(f"peak growth per client, M={a['clients']:,} -> "
          f"{b['clients']:,}: {per:.0f} bytes")
  print(json.dumps(runs))


if __name__ == "__main__":
  main()

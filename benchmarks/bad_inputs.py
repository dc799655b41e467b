"""About 240 bad or edge inputs against the command line and the Python API, as a
new user would try them, each classified:

- ``error``: a one-line ``lowbw: error:`` (or a ValueError from the API) in
  under ``EARLY_S`` seconds, before anything trains;
- ``late error``: the same, after longer (something compiled first);
- ``warning``: the run finished and its summary carries warnings;
- ``accepted``: the run finished with no word (fine for good edge inputs);
- ``traceback``: any other exception: a defect.

A run is "silent degenerate" when it is accepted but its summary says
``degenerate`` without a warning: also a defect.

    python benchmarks/bad_inputs.py                # all of them, about 2 minutes
    python benchmarks/bad_inputs.py --limit 40     # the first 40
    python benchmarks/bad_inputs.py --json out.json

Prints a table (input, outcome, seconds, message) and the counts.
"""

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
import warnings

EARLY_S = 5.0
# A tiny accepted run: digits, an 8-unit MLP, 2 workers, 10 steps.
TINY = ["--data", "digits", "--hidden", "8", "--workers", "2",
        "--batch-size", "4", "--steps", "10", "--H", "5", "--eval-every",
        "5", "--no-progress"]


def _flag_cases():
  """Every numeric and unit flag given values a user might mistype."""
  ints = ["workers", "steps", "batch-size", "H", "eval-every", "log-every",
          "checkpoint-every", "eval-examples", "seed", "layers", "d-model",
          "heads", "seq-len", "devices", "backups"]
  floats = ["inner-lr", "outer-lr", "outer-momentum", "weight-decay", "mfu",
            "jitter", "keep-fraction", "drop-prob", "message-loss", "alpha",
            "ef", "momentum"]
  units = {"bandwidth": ["100", "fast", "-1Mbps", "0Gbps", "1e400Gbps",
                         "100 Mbps", "125MB/s"],
           "latency": ["50", "-5ms", "fast", "1e400s", "0", "20 ms"],
           "hardware": ["100", "abacus", "0s", "-1TFLOPS", "a100", "0.5s"],
           "memory-budget": ["8", "0GB", "150%", "lots", "2GB"],
           "regional-bandwidth": ["10"], "regional-latency": ["5"],
           "clock-params": ["1X", "-1B", "0", "1B"]}
  for flag in ints:
    for value in ("0", "-1", "1.5", "x", "99999999999999999999"):
      yield f"--{flag} {value}", [f"--{flag}", value]
  for flag in floats:
    for value in ("-1", "nan", "inf", "2"):
      yield f"--{flag} {value}", [f"--{flag}", value]
  for flag, values in units.items():
    for value in values:
      yield f"--{flag} {value}", [f"--{flag}", value]


def _choice_cases():
  for flag, value in [("strategy", "nope"), ("inner", "lion"),
                      ("schedule", "linear"), ("topology", "star"),
                      ("mitigation", "vote"), ("sharding", "random"),
                      ("model", "resnet"), ("codec", "quant:3"),
                      ("codec", "topk:2"), ("codec", "nonsense"),
                      ("worker-dtype", "int8"), ("worker-batch", "three"),
                      ("worker-batch", "3"), ("selector", "magic"),
                      ("compress", "grads")]:
    yield f"--{flag} {value}", [f"--{flag}", value]


def _combination_cases(tmp):
  garbage = os.path.join(tmp, "garbage.npz")
  with open(garbage, "wb") as f:
    f.write(b"not an archive")
  nan = os.path.join(tmp, "nan.npz")
  import numpy as np
  x = np.ones((40, 3), np.float32)
  x[3, 0] = np.nan
  np.savez(nan, x=x, y=np.zeros(40, int))
  pickled = os.path.join(tmp, "objects.npz")
  np.savez(pickled, x=np.array([object()] * 4, dtype=object), y=np.zeros(4))
  a_file = os.path.join(tmp, "a_file")
  open(a_file, "w").close()
  yield "--drop-prob 1.0 (all down)", ["--drop-prob", "1.0"]
  yield "--failures all workers", ["--failures", "0@0,1@0"]
  yield "--failures one worker", ["--failures", "0@0"]
  yield "--windows all down", ["--windows", "0:0-10,1:0-10"]
  yield "--message-loss 1.0", ["--message-loss", "1.0"]
  yield "--steps 4 (< H)", ["--steps", "4"]
  yield "--steps 7 (not a multiple of H)", ["--steps", "7"]
  yield "--eval-every 3 (not a multiple of H)", ["--eval-every", "3"]
  yield "--checkpoint-every 3", ["--checkpoint-every", "3"]
  yield "--data garbage.npz", ["--data", garbage]
  yield "--data nan.npz", ["--data", nan]
  yield "--data objects.npz", ["--data", pickled]
  yield "--data /no/such.npz", ["--data", "/no/such.npz"]
  yield "--data folder-less.txt", ["--data", "/no/such.txt"]
  yield "--out a file", ["--out", a_file]
  yield "--out /proc/x", ["--out", "/proc/x/y"]
  yield "--failures 9@0 (no worker 9)", ["--failures", "9@0"]
  yield "--failures 1-5", ["--failures", "1-5"]
  yield "--windows 1:9-3", ["--windows", "1:9-3"]
  yield "--speeds 1,2,3", ["--speeds", "1,2,3"]
  yield "--speeds 1,0", ["--speeds", "1,0"]
  yield "--topology hierarchical", ["--topology", "hierarchical"]
  yield "--group-size 2 (ring)", ["--group-size", "2"]
  yield "--keep-fraction (no mitigation)", ["--keep-fraction", "0.5"]
  yield "--p with diloco", ["--p", "0.1"]
  yield "--ef without codec", ["--ef", "0.9"]
  yield "--layers with mlp", ["--layers", "3"]
  yield "--data-root with digits", ["--data-root", "/tmp"]
  yield "--jitter 0.5", ["--jitter", "0.5"]
  yield "--jitter 0.5 --clock-params 1B", ["--jitter", "0.5",
                                           "--clock-params", "1B"]
  yield "--batch-size 5000", ["--batch-size", "5000"]
  yield "--resume /no/such", ["--resume", "/no/such/dir"]
  yield "--config /no/such.toml", ["--config", "/no/such.toml"]


def _config_cases(tmp):
  for i, text in enumerate([
      "bandwidth = 100\n", "latency = 50\n", 'steps = "ten"\n',
      "inner_lr = true\n", "[strategy]\nname = 'diloco'\n",
      'progress = "false"\n', "wokers = 4\n", "workers = [2, 4]\n",
      "this is not toml\n", "seed = -3\n", "memory_budget = 8\n",
      "worker_batch = 2.5\n"]):
    path = os.path.join(tmp, f"c{i}.toml")
    with open(path, "w") as f:
      f.write(text)
    yield f"config: {text.strip()!r}", ["--config", path]


def _api_cases():
  import optax
  from lowbw import data, models, network, strategies
  base = dict(model=models.mlp(hidden=(8,)), data=data.digits(),
              strategy=strategies.diloco(H=5), num_workers=2, batch_size=4,
              steps=10, progress=False)
  changes = {
      "num_workers=0": {"num_workers": 0}, "steps=0": {"steps": 0},
      "batch_size=-1": {"batch_size": -1}, "seed=-1": {"seed": -1},
      "seed=2**32": {"seed": 2 ** 32}, "seed=1.5": {"seed": 1.5},
      "steps=3 (< H)": {"steps": 3},
      "strategy='nope'": {"strategy": "nope"}, "model='nope'": {
          "model": "nope"},
      "data='nope'": {"data": "nope"},
      "network='1Gbps'": {"network": "1Gbps"},
      "latency='50'": {"network": "latency"},
      "worker_dtype='int8'": {"worker_dtype": "int8"},
      "worker_batch=3": {"worker_batch": 3},
      "memory_budget='8'": {"memory_budget": "8"},
      "memory_budget='1kB'": {"memory_budget": "1kB"},
      "eval_every=3": {"eval_every": 3},
      "log_dir=a file": {"log_dir": "/etc/passwd"},
      "inner=MultiSteps": {"strategy": strategies.diloco(
          inner=optax.MultiSteps(optax.sgd(0.1), 2), H=5)},
      "inner='adam' (a string)": {"strategy": "inner"},
      "hparams={'nope': 1}": {"hparams": {"nope": 1}},
      "hparams={'inner_lr': -1}": {"hparams": {"inner_lr": -1.0}},
      "drop_prob=1.0": {"network": network.network(
          faults=network.Faults(drop_prob=1.0))},
      "clock_params='1X'": {"network": "clock"},
  }
  for name, change in changes.items():
    yield f"api: {name}", (base, change)


def _api_call(base, change):
  import lowbw
  from lowbw import network, strategies
  kwargs = {**base, **change}
  if change.get("network") == "latency":
    kwargs["network"] = network.network("1Gbps", "50")
  if change.get("network") == "clock":
    kwargs["network"] = network.network(clock_params="1X")
  if change.get("strategy") == "inner":
    kwargs["strategy"] = strategies.diloco(inner="adam", H=5)
  return lowbw.simulate(**kwargs).summary


def classify(kind, payload, tmp):
  """(outcome, seconds, message)."""
  from lowbw import cli
  start = time.perf_counter()
  err, out = io.StringIO(), io.StringIO()
  try:
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out), \
        warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      if kind == "cli":
        folder = tempfile.mkdtemp(dir=tmp)
        os.rmdir(folder)
        argv = ["train", *TINY, *payload]
        if "--out" not in payload and "--resume" not in payload:
          argv += ["--out", folder]
        code = cli.main(argv)
        summary = None
        if code == 0 and os.path.isfile(os.path.join(folder,
                                                     "summary.json")):
          with open(os.path.join(folder, "summary.json")) as f:
            summary = json.load(f)
      else:
        code, summary = 0, _api_call(*payload)
  except ValueError as e:  # the API's clear error
    seconds = time.perf_counter() - start
    return ("error" if seconds < EARLY_S else "late error", seconds,
            str(e).splitlines()[0])
  except BaseException as e:  # noqa: BLE001 - a traceback is the finding
    return ("traceback", time.perf_counter() - start,
            f"{type(e).__name__}: {e}".splitlines()[0])
  seconds = time.perf_counter() - start
  text = err.getvalue().strip()
  if code != 0:
    lines = text.splitlines()
    one_line = len(lines) == 1 and "Traceback" not in text
    outcome = ("error" if one_line and seconds < EARLY_S else
               "late error" if one_line else "traceback")
    return outcome, seconds, lines[-1] if lines else f"exit {code}"
  warned = (summary or {}).get("warnings") or [
      str(w.message) for w in caught if "RunWarning" in type(
          w.message).__name__]
  if warned:
    return "warning", seconds, warned[0]
  if (summary or {}).get("degenerate"):
    return "silent degenerate", seconds, "degenerate without a warning"
  return "accepted", seconds, ""


def cases(tmp):
  out = [("cli", name, argv) for name, argv in _flag_cases()]
  out += [("cli", name, argv) for name, argv in _choice_cases()]
  out += [("cli", name, argv) for name, argv in _combination_cases(tmp)]
  out += [("cli", name, argv) for name, argv in _config_cases(tmp)]
  out += [("api", name, payload) for name, payload in _api_cases()]
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--limit", type=int, help="only the first N inputs")
  p.add_argument("--json", help="write the rows here")
  args = p.parse_args(argv)
  os.environ.setdefault("LOWBW_COMPILE_CACHE", os.path.join(
      tempfile.gettempdir(), "lowbw-bad-inputs-cache"))
  rows, counts = [], {}
  with tempfile.TemporaryDirectory() as tmp:
    todo = cases(tmp)[:args.limit]
    for i, (kind, name, payload) in enumerate(todo):
      outcome, seconds, message = classify(kind, payload, tmp)
      counts[outcome] = counts.get(outcome, 0) + 1
      rows.append({"input": name, "outcome": outcome,
                   "seconds": round(seconds, 2), "message": message})
      print(f"{i + 1:3d} {outcome:17s} {seconds:6.2f}s  {name:38s} "
            f"{message[:110]}", flush=True)
  print(f"\n{len(rows)} inputs: " + ", ".join(
      f"{n} {k}" for k, n in sorted(counts.items(), key=lambda kv: -kv[1])))
  if args.json:
    with open(args.json, "w") as f:
      json.dump({"counts": counts, "rows": rows}, f, indent=1)
  bad = counts.get("traceback", 0) + counts.get("silent degenerate", 0)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())

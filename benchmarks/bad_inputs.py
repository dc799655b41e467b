"""About 360 bad or edge inputs against the command line and the Python API,
as a new user would try them, each classified:

- ``error``: a one-line ``lowbw: error:`` (or a ValueError from the API) in
  under ``EARLY_S`` seconds (``CHILD_EARLY_S`` in a child process), before
  anything trains;
- ``late error``: the same, after longer (something compiled first);
- ``warning``: the run finished and its summary carries warnings;
- ``accepted``: the run finished with no word (fine for good edge inputs);
- ``traceback``: any other exception: a defect;
- ``timeout``: a case run in a child process (one that could run for ever
  if accepted) still running after ``CHILD_TIMEOUT_S``: a defect;
- ``silent nan``: exit 0 and no warning, but a NaN or infinite number in
  what the command reported (a train summary's losses and clock, an eval's
  scores): a defect;
- ``silent degenerate``: accepted, but the summary says ``degenerate``
  without a warning: also a defect.

Families: train flags and their values, choices, combinations, config files
(wrong types, deep nesting), extreme values, paths (folders, /dev/null, files
where folders are expected), fleet trace files, prepared data folders
(meta.json variants), ``data prepare`` sources (binary, archives, empty, one
long line), ``eval``, ``generate`` and ``plot``, and the Python API.

    python benchmarks/bad_inputs.py                # all of them, a few minutes
    python benchmarks/bad_inputs.py --limit 40     # the first 40
    python benchmarks/bad_inputs.py --only prepared --json out.json

Prints a table (input, outcome, seconds, message) and the counts.
"""

import argparse
import contextlib
import gzip
import io
import json
import math
import os
import re
import shutil
import struct
import sys
import tempfile
import time
import warnings
import zipfile

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
              strategy=strategies.diloco(H=5), workers=2, batch_size=4,
              steps=10, progress=False)
  changes = {
      "workers=0": {"workers": 0}, "steps=0": {"steps": 0},
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
      "out=a file": {"out": "/etc/passwd"},
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


# Cases that may run for ever if accepted (10^9 steps) run in a child
# process under this limit; running past it is the outcome ``timeout``.
CHILD_TIMEOUT_S = 30.0
# A child first imports Python, JAX and lowbw (3-5 s on 2 cores) before it
# reads its input, so its early errors are allowed that much longer.
CHILD_EARLY_S = EARLY_S + 5.0
LM_TINY = ["--layers", "1", "--d-model", "16", "--heads", "2", "--seq-len",
           "16", "--workers", "2", "--batch-size", "2", "--steps", "4",
           "--H", "2", "--eval-every", "2", "--no-progress", "--no-plot"]
STORY = ("The little robot rolled into the garden. It saw a red flower and "
         "a blue bird. The bird sang a song and the robot listened.")


def _write(path, content) -> str:
  mode = "wb" if isinstance(content, bytes) else "w"
  with open(path, mode, **({} if mode == "wb" else {"newline": ""})) as f:
    f.write(content)
  return str(path)


def _extreme_cases():
  for flag, value in [("bandwidth", "1e-300bit/s"), ("bandwidth",
                      "1e300Gbps"), ("latency", "1e300s"), ("latency",
                      "1e-300s"), ("hardware", "1e300s"), ("H", "1000000000"),
                      ("steps", "1000000000"), ("eval-every", "1000000000"),
                      ("clock-params", "1e30B"), ("mfu", "1e-300"),
                      ("hardware", "1e-300TFLOPS"), ("speeds", "1e-300,1")]:
    yield f"--{flag} {value}", [f"--{flag}", value]


def _trace_cases(tmp):
  rows = "time,w0,w1\n0,1,1\n10,1,0.5\n"
  many = "time,w0,w1\n" + "".join(f"{i * 0.01:.2f},1,{0.5 + (i % 2) / 2}\n"
                                   for i in range(200_000))
  traces = {
      "one row": "time,w0,w1\n0,1,0.5\n",
      "BOM": "\ufeff" + rows, "CRLF": rows.replace("\n", "\r\n"),
      "200,000 rows": many, "non-numeric": "time,w0,w1\n0,1,fast\n",
      "header only": "time,w0,w1\n", "empty": "",
      "3 workers for 2": "time,w0,w1,w2\n0,1,1,1\n",
      "time not from 0": "time,w0,w1\n5,1,1\n",
      "times decreasing": "time,w0,w1\n0,1,1\n10,1,1\n5,1,1\n",
      "speed 0": "time,w0,w1\n0,1,0\n", "NaN speed": "time,w0,w1\n0,1,nan\n",
      "binary": b"\x00\x01\x02\xff" * 100}
  for name, text in traces.items():
    path = _write(os.path.join(tmp, f"speeds-{len(name)}-{name[:3]}.csv"), text)
    yield f"--speeds trace: {name}", ["--speeds", path]
  bw = {"1e-300bit/s": "time,w0,w1\n0,1e-300bit/s,1Gbps\n",
        "non-numeric": "time,w0,w1\n0,fast,1Gbps\n",
        "CRLF + BOM": "\ufefftime,w0,w1\r\n0,1Gbps,1Gbps\r\n"}
  for name, text in bw.items():
    path = _write(os.path.join(tmp, f"bw-{name[:4]}.csv"), text)
    yield f"--bandwidth-trace: {name}", ["--bandwidth-trace", path]


def _empty_folder(tmp) -> str:
  folder = os.path.join(tmp, "empty-folder")
  os.makedirs(folder, exist_ok=True)
  return folder


def _path_cases(tmp):
  folder = _empty_folder(tmp)
  a_file = _write(os.path.join(tmp, "plain.txt"), "hello\n")
  for flag in ("data", "config", "speeds", "resume", "out"):
    yield f"--{flag} a folder", [f"--{flag}", folder]
    yield f"--{flag} /dev/null", [f"--{flag}", "/dev/null"]
  yield "--resume a file", ["--resume", a_file]
  yield "--data-root a file", ["--data", "text", "--data-root", a_file]
  yield "--out under a file", ["--out", os.path.join(a_file, "run")]
  yield "--data a file where a folder is expected", ["--data", a_file]
  yield "--speeds a file without .csv", ["--speeds", a_file]
  mixed = os.path.join(tmp, "mixed-text")
  os.makedirs(mixed, exist_ok=True)
  _write(os.path.join(mixed, "a.txt"), "plain text " * 400)
  _write(os.path.join(mixed, "b.bin"), bytes(range(128, 256)) * 8)
  yield "--data text folder with a binary file", [
      "train", "--data", "text", "--data-root", mixed, *LM_TINY, "--out",
      "{out}"]


def _deep_config_cases(tmp):
  depth = 100_000
  files = {
      "deep.json": '{"a":' * depth + "1" + "}" * depth,
      "deep.yaml": "[" * depth + "]" * depth,
      "deep.toml": "a = " + "[" * 5_000 + "]" * 5_000 + "\n",
      "list.json": "[1, 2]", "null.json": "null", "scalar.yaml": "5\n",
      "types.json": '{"steps": [1]}', "types2.toml": "workers = {a = 1}\n",
      "huge.json": '{"seed": 1e400}', "bom.json": '\ufeff{"steps": 10}',
      "binary.yaml": b"\x00\xff\x00\xff",
      # Aliases of aliases: nine lines that stand for 9^9 values.
      "laughs.yaml": "".join(
          f"a{i}: &a{i} [" + ", ".join(
              ['"lol"'] * 9 if i == 0 else [f"*a{i - 1}"] * 9) + "]\n"
          for i in range(9))}
  for name, text in files.items():
    path = _write(os.path.join(tmp, name), text)
    yield f"config: {name}", ["--config", path]


def _idx(path, array) -> None:
  import numpy as np
  header = struct.pack(">BBBB", 0, 0, 0x08, array.ndim)
  header += struct.pack(f">{array.ndim}I", *array.shape)
  _write(path, header + array.astype(np.uint8).tobytes())


def _mnist(folder) -> str:
  import numpy as np
  os.makedirs(folder, exist_ok=True)
  rng = np.random.default_rng(0)
  for name, n in (("train", 30), ("t10k", 10)):
    _idx(os.path.join(folder, f"{name}-images-idx3-ubyte"),
         rng.integers(0, 256, (n, 28, 28)))
    _idx(os.path.join(folder, f"{name}-labels-idx1-ubyte"),
         rng.integers(0, 10, (n,)))
  return folder


def _prepare_cases(tmp):
  """``data prepare`` sources and settings; ``{out}``: a fresh folder."""
  import numpy as np
  root = os.path.join(tmp, "sources")
  os.makedirs(root, exist_ok=True)
  text = "\n\n".join(f"{STORY} Day {i}." for i in range(40))
  corpus = _write(os.path.join(root, "corpus.txt"), text)
  zipped = os.path.join(root, "corpus.zip")
  with zipfile.ZipFile(zipped, "w") as z:
    z.writestr("corpus.txt", text)
  mixed = os.path.join(root, "mixed")
  os.makedirs(mixed, exist_ok=True)
  _write(os.path.join(mixed, "a.txt"), text)
  _write(os.path.join(mixed, "weights"), np.arange(300, dtype=np.float32)
         .tobytes())
  sources = {
      "a small corpus": corpus, "an MNIST folder": _mnist(
          os.path.join(root, "mnist")),
      "an IDX file": os.path.join(root, "mnist", "train-labels-idx1-ubyte"),
      "a zip": zipped, "a .gz": _write(os.path.join(root, "c.txt.gz"),
                                       gzip.compress(text.encode())),
      "an .npy": _write(os.path.join(root, "a.npy"), b"\x93NUMPY" + bytes(200)),
      "a text and a binary file": mixed,
      "an empty file": _write(os.path.join(root, "empty.txt"), ""),
      "blank lines only": _write(os.path.join(root, "blank.txt"), "\n \n\n"),
      "one long line": _write(os.path.join(root, "long.txt"), "a" * 300_000),
      "latin-1 text": _write(os.path.join(root, "latin.txt"), text.replace(
          "robot", "r\xf6bot").encode("latin-1")),
      "/dev/null": "/dev/null", "an empty folder": _empty_folder(tmp),
      "a corrupt parquet": _write(os.path.join(root, "bad.parquet"),
                                  b"PAR1 nope"),
      "non-UTF-8 JSONL": _write(os.path.join(root, "bad.jsonl"),
                                b'{"text": "caf\xe9"}\n'),
      "JSONL without text": _write(os.path.join(root, "notext.jsonl"),
                                   '{"body": "x"}\n'),
      "/no/such": "/no/such/corpus.txt"}
  for name, source in sources.items():
    yield f"prepare: {name}", ["data", "prepare", source, "--out", "{out}",
                               "--vocab-size", "300", "--no-progress"]
  for flags in (["--tokenizer", "/etc/passwd"], ["--tokenizer", root],
                ["--vocab-size", "10"], ["--vocab-size", "1000000"],
                ["--val-fraction", "1.0"], ["--delimiter", ""],
                ["--out", corpus]):
    yield f"prepare: {' '.join(flags)}", ["data", "prepare", corpus,
                                          "--out", "{out}", *flags,
                                          "--no-progress"]


def _prepared_folder(tmp) -> str:
  from lowbw import data
  folder = os.path.join(tmp, "prepared")
  if not os.path.isdir(folder):
    corpus = _write(os.path.join(tmp, "story.txt"), "\n\n".join(
        f"{STORY} Day {i}." for i in range(40)))
    data.prepare(corpus, folder, vocab_size=300)
  return folder


def _prepared_variant(tmp, name, change) -> str:
  """A copy of the prepared folder, changed by ``change(folder, meta)``."""
  out = os.path.join(tmp, "variants", re.sub(r"[^\w.]+", "-", name))
  shutil.copytree(_prepared_folder(tmp), out)
  with open(os.path.join(out, "meta.json")) as f:
    meta = json.load(f)
  written = change(out, meta)
  if written is None:
    with open(os.path.join(out, "meta.json"), "w") as f:
      json.dump(meta, f)
  return out


def _set_key(key, value):
  """A change of meta.json's ``key`` (None: removed)."""
  def change(_, meta):
    if value is None:
      meta.pop(key)
    else:
      meta[key] = value
  return change


def _meta_text(text):
  return lambda folder, _: _write(os.path.join(folder, "meta.json"), text)


def _damage(name, content):
  return lambda folder, _: _write(os.path.join(folder, name), content)


def _bump_id(split):
  """A token id beyond the 300-id vocabulary in ``split``."""
  def change(folder, _):
    import numpy as np
    path = os.path.join(folder, f"{split}.bin")
    ids = np.fromfile(path, "<u2")
    ids[3] = 5000
    ids.tofile(path)
  return change


def _as_uint32(folder, meta):
  import numpy as np
  for split in ("train", "val"):
    path = os.path.join(folder, f"{split}.bin")
    np.fromfile(path, "<u2").astype("<u4").tofile(path)
  meta["dtype"] = "uint32"


PREPARED_VARIANTS = {
    "as prepared": lambda folder, meta: None,
    "tokenizer ../../../../etc/passwd": _set_key(
        "tokenizer", "../../../../etc/passwd"),
    "tokenizer /etc/passwd": _set_key("tokenizer", "/etc/passwd"),
    "no vocab_size": _set_key("vocab_size", None),
    "vocab_size 10": _set_key("vocab_size", 10),
    "vocab_size '300'": _set_key("vocab_size", "300"),
    "dtype uint32 (tokens uint32)": _as_uint32,
    "dtype uint32 (tokens uint16)": _set_key("dtype", "uint32"),
    "dtype int64": _set_key("dtype", "int64"),
    "version '1'": _set_key("version", "1"),
    "no tokenizer": _set_key("tokenizer", None),
    "meta.json a list": _meta_text("[1, 2]"),
    "meta.json not JSON": _meta_text("{"),
    "meta.json empty": _meta_text(""),
    "val id beyond vocab": _bump_id("val"),
    "train id beyond vocab": _bump_id("train"),
    "train.bin odd size": _damage("train.bin", b"\x01\x00\x02"),
    "train.bin empty": _damage("train.bin", b""),
    "train_docs.npy garbage": _damage("train_docs.npy", b"garbage"),
    "tokenizer.json garbage": _damage("tokenizer.json", "not json"),
}


def _prepared_cases(tmp):
  for name, change in PREPARED_VARIANTS.items():
    folder = _prepared_variant(tmp, name, change)
    yield f"prepared: {name}", ["train", "--data", folder, *LM_TINY,
                                "--out", "{out}"]


class _Runs:
  """Finished runs for eval / generate / plot cases, trained once."""

  def __init__(self, tmp):
    from lowbw import cli
    self.tmp = tmp
    self.classifier = os.path.join(tmp, "runs", "classifier")
    self.lm = os.path.join(tmp, "runs", "lm")
    with contextlib.redirect_stdout(io.StringIO()), \
        contextlib.redirect_stderr(io.StringIO()):
      assert cli.main(["train", *TINY, "--no-plot", "--out",
                       self.classifier]) == 0
      assert cli.main(["train", "--data", _prepared_folder(tmp), *LM_TINY,
                       "--out", self.lm]) == 0

  def damaged(self, run, name, damage) -> str:
    out = os.path.join(self.tmp, "runs", re.sub(r"\W+", "-", name))
    shutil.copytree(run, out)
    damage(out)
    return out


def _truncate(folder):
  path = os.path.join(folder, "params.npz")
  with open(path, "rb") as f:
    whole = f.read()
  _write(path, whole[:len(whole) // 2])


def _nan_params(folder):
  import numpy as np
  path = os.path.join(folder, "params.npz")
  with np.load(path) as saved:
    params = {k: np.full_like(saved[k], np.nan) for k in saved.files}
  np.savez(path, **params)


def _npz(tmp, name, x, y) -> str:
  import numpy as np
  path = os.path.join(tmp, name)
  np.savez(path, x=x, y=y, x_eval=x, y_eval=y)
  return path


def _eval_cases(tmp, runs):
  import numpy as np
  images = np.random.default_rng(0).random((20, 8, 8, 1)).astype(np.float32)
  c, lm = runs.classifier, runs.lm
  yield "eval: digits", ["eval", c, "--data", "digits"]
  yield "eval: labels beyond the classes", ["eval", c, "--data", _npz(
      tmp, "labels.npz", images, np.arange(20))]
  yield "eval: examples of another width", ["eval", c, "--data", _npz(
      tmp, "wide.npz", np.ones((20, 5), np.float32), np.arange(20) % 10)]
  yield "eval: NaN params", ["eval", runs.damaged(c, "nan", _nan_params),
                             "--data", "digits"]
  yield "eval: truncated params.npz", ["eval", runs.damaged(
      c, "truncated", _truncate), "--data", "digits"]
  yield "eval: unreadable config.json", ["eval", runs.damaged(
      c, "bad-config", lambda f: _write(os.path.join(f, "config.json"),
                                        '{"model": ')), "--data", "digits"]
  yield "eval: text data on a classifier", ["eval", c, "--data", "text"]
  yield "eval: --eval-examples 0", ["eval", c, "--data", "digits",
                                    "--eval-examples", "0"]
  yield "eval: run_dir /dev/null", ["eval", "/dev/null", "--data", "digits"]
  yield "eval: run_dir not a run", ["eval", tmp, "--data", "digits"]
  yield "eval: lm on its data", ["eval", lm, "--data", _prepared_folder(tmp)]
  yield "eval: lm, val id beyond vocab", ["eval", lm, "--data", os.path.join(
      tmp, "variants", "val-id-beyond-vocab")]


def _generate_cases(runs):
  lm = runs.lm
  yield "generate: lm", ["generate", lm, "--max-tokens", "5"]
  yield "generate: truncated params.npz", ["generate", runs.damaged(
      lm, "lm-truncated", _truncate)]
  yield "generate: another model's params", ["generate", runs.damaged(
      lm, "foreign", lambda f: shutil.copy(
          os.path.join(runs.classifier, "params.npz"), f))]
  yield "generate: a classifier", ["generate", runs.classifier]
  for flags in (["--max-tokens", "0"], ["--max-tokens", "-1"],
                ["--temperature", "nan"], ["--temperature", "-1"],
                ["--top-k", "0"], ["--prompt", ""], ["--step", "7"]):
    yield f"generate: {' '.join(flags)}", ["generate", lm, *flags]


def _plot_cases(tmp, runs):
  empty = os.path.join(tmp, "plots", "empty")
  garbage = os.path.join(tmp, "plots", "garbage")
  for folder in (empty, garbage):
    os.makedirs(folder, exist_ok=True)
  _write(os.path.join(empty, "metrics.csv"), "")
  _write(os.path.join(garbage, "metrics.csv"), b"\x00\xffnot,a\ncsv")
  infinite = os.path.join(tmp, "plots", "infinite")
  os.makedirs(infinite, exist_ok=True)
  _write(os.path.join(infinite, "metrics.csv"),
         "step,train_loss\n1,inf\n2,inf\n")
  c, out = runs.classifier, os.path.join(tmp, "plots", "p.png")
  for name, argv in {"a run": [c], "/dev/null": ["/dev/null"],
                     "a folder without metrics": [tmp],
                     "an empty metrics.csv": [empty],
                     "a binary metrics.csv": [garbage],
                     "an infinite train_loss": [infinite, "--y",
                                                "train_loss"],
                     "--x nope": [c, "--x", "nope"],
                     "--smooth 0": [c, "--smooth", "0"],
                     "--out a folder": [c, "--out", tmp]}.items():
    yield f"plot: {name}", ["plot", *argv, *(["--out", out] if "--out"
                                             not in argv else [])]


def _saved_run_cases(tmp):
  runs = _Runs(tmp)
  yield from _eval_cases(tmp, runs)
  yield from _generate_cases(runs)
  yield from _plot_cases(tmp, runs)


def _non_finite(summary: dict) -> str | None:
  """The first loss or clock figure of a train summary that is NaN,
  infinite or missing (JSON writes NaN as null)."""
  for key in ("final_train_loss", "final_eval_loss", "sim_time_s", "comm_s"):
    if key not in summary:
      continue
    value = summary[key]
    if value is None or (isinstance(value, float) and not math.isfinite(
        value)):
      return f"{key} = {value}"
  return None


_NAN_WORD = re.compile(r"\b(nan|-?inf(inity)?)\b", re.IGNORECASE)


def _run_child(argv):
  """(exit code, stderr) of ``lowbw ARGV`` in a child process."""
  import subprocess
  try:
    done = subprocess.run([sys.executable, "-m", "lowbw", *argv],
                          capture_output=True, text=True,
                          timeout=CHILD_TIMEOUT_S)
  except subprocess.TimeoutExpired:
    return None, ""
  return done.returncode, done.stderr


def _call(kind, payload, folder):
  """Runs one case; (exit code, summary or None, stdout, stderr), code
  None for a child that ran past its time."""
  from lowbw import cli
  err, out = io.StringIO(), io.StringIO()
  summary = None
  with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
    if kind == "api":
      return 0, _api_call(*payload), "", ""
    argv = ([a.replace("{out}", folder) for a in payload] if kind == "cmd"
            else ["train", *TINY, *payload])
    if kind in ("cli", "child") and "--out" not in payload and (
        "--resume" not in payload):
      argv += ["--out", folder]
    if kind == "child":
      code, text = _run_child(argv)
      err.write(text)
    else:
      code = cli.main(argv)
  if code == 0 and argv[0] == "train" and os.path.isfile(
      os.path.join(folder, "summary.json")):
    with open(os.path.join(folder, "summary.json")) as f:
      summary = json.load(f)
  return code, summary, out.getvalue(), err.getvalue()


def classify(kind, payload, tmp):
  """(outcome, seconds, message)."""
  start = time.perf_counter()
  folder = tempfile.mkdtemp(dir=tmp)
  os.rmdir(folder)
  try:
    with warnings.catch_warnings(record=True) as caught:
      warnings.simplefilter("always")
      code, summary, printed, text = _call(kind, payload, folder)
  except ValueError as e:  # the API's clear error
    seconds = time.perf_counter() - start
    return ("error" if seconds < EARLY_S else "late error", seconds,
            str(e).splitlines()[0])
  except BaseException as e:  # noqa: BLE001 - a traceback is the finding
    return ("traceback", time.perf_counter() - start,
            f"{type(e).__name__}: {e}".splitlines()[0])
  seconds = time.perf_counter() - start
  text = text.strip()
  if code is None:
    return "timeout", seconds, f"still running after {CHILD_TIMEOUT_S:g} s"
  if code != 0:
    lines = text.splitlines()
    one_line = len(lines) == 1 and "Traceback" not in text
    early = CHILD_EARLY_S if kind == "child" else EARLY_S
    outcome = ("error" if one_line and seconds < early else
               "late error" if one_line else "traceback")
    return outcome, seconds, lines[-1] if lines else f"exit {code}"
  warned = (summary or {}).get("warnings") or [
      str(w.message) for w in caught if "RunWarning" in type(
          w.message).__name__]
  if warned:
    return "warning", seconds, warned[0]
  bad = _non_finite(summary or {})
  if bad is None and kind == "cmd" and payload[0] != "generate":
    found = _NAN_WORD.search(printed)  # generated text may hold any word
    bad = found and f"printed {found.group(0)}: {printed.strip()[:80]}"
  if bad:
    return "silent nan", seconds, bad
  if (summary or {}).get("degenerate"):
    return "silent degenerate", seconds, "degenerate without a warning"
  return "accepted", seconds, ""


DEFECTS = ("traceback", "silent nan", "silent degenerate", "timeout")
FAMILIES = {
    "flags": lambda tmp: [("cli", n, a) for n, a in _flag_cases()],
    "choices": lambda tmp: [("cli", n, a) for n, a in _choice_cases()],
    "combinations": lambda tmp: [("cli", n, a)
                                 for n, a in _combination_cases(tmp)],
    "configs": lambda tmp: [("cli", n, a) for n, a in _config_cases(tmp)]
    + [("cli", n, a) for n, a in _deep_config_cases(tmp)],
    "extreme": lambda tmp: [("child", n, a) for n, a in _extreme_cases()],
    # A case that names its command is run as given, without TINY's flags.
    "paths": lambda tmp: [("cmd" if a[0] == "train" else "cli", n, a)
                          for n, a in _path_cases(tmp)],
    "traces": lambda tmp: [("cli", n, a) for n, a in _trace_cases(tmp)],
    "prepare": lambda tmp: [("cmd", n, a) for n, a in _prepare_cases(tmp)],
    "prepared": lambda tmp: [("cmd", n, a) for n, a in _prepared_cases(tmp)],
    "saved": lambda tmp: [("cmd", n, a) for n, a in _saved_run_cases(tmp)],
    "api": lambda tmp: [("api", n, p) for n, p in _api_cases()],
}


def cases(tmp, only=None):
  out = []
  for family, make in FAMILIES.items():
    if only is None or family in only:
      out += make(tmp)
  return out


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--limit", type=int, help="only the first N inputs")
  p.add_argument("--json", help="write the rows here")
  p.add_argument("--only", nargs="+", choices=list(FAMILIES),
                 help="only these families")
  args = p.parse_args(argv)
  os.environ.setdefault("LOWBW_COMPILE_CACHE", os.path.join(
      tempfile.gettempdir(), "lowbw-bad-inputs-cache"))
  rows, counts = [], {}
  with tempfile.TemporaryDirectory() as tmp:
    todo = cases(tmp, args.only)[:args.limit]
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
  bad = sum(counts.get(k, 0) for k in DEFECTS)
  return 1 if bad else 0


if __name__ == "__main__":
  sys.exit(main())

"""Commands on a finished run's folder: ``lowbw generate`` samples text from
its language model, ``lowbw eval`` scores it on another dataset."""

import filecmp
import json
import math
import os

import jax
import numpy as np

from lowbw import _validate
from lowbw.telemetry import _progress
from lowbw.config import _resolve
from lowbw import simulation
from lowbw.models import generate


def add_parsers(subparsers) -> None:
  g = subparsers.add_parser(
      "generate", help="sample text from a trained language model",
      description="Continue a prompt with the final parameters of a lowbw "
      "run (its params.npz), tokenized with the run's tokenizer.")
  g.add_argument("run_dir", metavar="RUN_DIR", help="a lowbw train --out "
                 "folder")
  g.add_argument("--prompt", default="\n", help="the text to continue "
                 "(default: a newline)")
  g.add_argument("--max-tokens", type=int, default=200, metavar="N",
                 help="tokens to add (default 200)")
  g.add_argument("--temperature", type=float, default=0.8, metavar="T",
                 help="softmax temperature; 0 takes the likeliest token "
                 "(default 0.8)")
  g.add_argument("--top-k", type=int, metavar="K", help="sample among the "
                 "K likeliest tokens (default: all)")
  g.add_argument("--seed", type=int, default=0, help="same seed, same text")
  g.add_argument("--step", type=int, help="a checkpointed step's parameters "
                 "instead of the final ones")
  g.set_defaults(run=run_generate)
  e = subparsers.add_parser(
      "eval", help="evaluate a finished run on a dataset",
      description="The held-out loss (and accuracy; perplexity for text) of "
      "a run's final parameters on a dataset: a folder made by lowbw data "
      "prepare with the same tokenizer, or any --data of lowbw train.")
  e.add_argument("run_dir", metavar="RUN_DIR", help="a lowbw train --out "
                 "folder")
  e.add_argument("--data", required=True, help="a prepared folder, digits, "
                 "text, an .npz or a .bin file")
  e.add_argument("--eval-examples", type=int, metavar="N", help="held-out "
                 "examples to score (default: the dataset's evaluation set)")
  e.add_argument("--step", type=int, help="a checkpointed step's parameters")
  e.add_argument("--json", action="store_true", help="print JSON")
  e.set_defaults(run=run_eval)


def run_generate(args) -> int:
  run = simulation.load(args.run_dir, args.step)
  if run.tokenizer is None:
    raise _validate.fail("run_dir", args.run_dir, f"trained a "
                         f"{run.model.name}, not a language model")
  prompt = run.tokenizer.encode_ids(args.prompt)
  if not prompt:
    raise _validate.fail("prompt", args.prompt, "expected some text")
  try:  # the parameters must be this model's (shapes only, no compute)
    jax.eval_shape(run.model.apply, run.params, np.zeros((1, 1), np.int32))
  except Exception as e:  # pylint: disable=broad-except
    raise _validate.fail("run_dir", args.run_dir, "its params.npz does not "
                         f"fit the model in its config.json ({_why(e)})"
                         ) from None
  stop = run.tokenizer.eos_id()
  # Tokens come one at a time: a long generation shows its pace on a
  # terminal (stdout keeps only the text).
  bar = (_progress.ProgressBar(args.max_tokens, desc="generate", unit="token")
         if _progress.is_terminal() else None)
  try:
    ids = generate(run.model, run.params, prompt, args.max_tokens,
                   args.temperature, args.top_k, args.seed, stop,
                   on_token=bar and (lambda n: bar.update(n, {})))
  finally:
    if bar:
      bar.close()
  print(args.prompt + run.tokenizer.decode_ids(
      [i for i in ids if i != stop]))
  return 0


def run_eval(args) -> int:
  # Checked under the flag's own name (the data calls it max_examples).
  _validate.optional_positive_int("eval_examples", args.eval_examples)
  run = simulation.load(args.run_dir, args.step)
  source = _dataset(args.data, run)
  _check_tokenizer(run, source, args.data)
  batches = source.eval_batches(args.eval_examples)
  _check_fits(run, batches, args.data)
  loss = jax.jit(run.model.loss)
  key = jax.random.key(0)
  totals: dict[str, float] = {}
  count = len(next(iter(batches.values())))
  for i in range(count):
    value, metrics = loss(run.params, {k: v[i] for k, v in batches.items()},
                          key)
    for name, x in {"loss": value, **metrics}.items():
      if np.ndim(x) == 0:
        totals[name] = totals.get(name, 0.0) + float(x) / count
  bad = {k: v for k, v in totals.items() if not math.isfinite(v)}
  if bad:  # a number that means nothing is not a result
    raise _validate.fail("data", args.data, f"gives eval_{min(bad)} "
                         f"{bad[min(bad)]} with the run's parameters (step "
                         f"{run.step}); check the data's values, or whether "
                         "the run diverged")
  if run.model.task == "lm":
    totals["perplexity"] = math.exp(min(totals["loss"], 700.0))
  out = {"run_dir": args.run_dir, "data": args.data, "step": run.step,
         "examples": int(count * len(next(iter(batches.values()))[0])),
         **{f"eval_{k}": v for k, v in totals.items()}}
  if args.json:
    print(json.dumps(out, indent=2))
  else:
    print(", ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}"
                    for k, v in out.items()))
  return 0


def _dataset(spec: str, run):
  seq_len = run.model.config.get("seq_len", 128)
  settings = {"data": spec, "sharding": "iid", "alpha": 0.5,
              "seq_len": seq_len, "data_root": None}
  source = _resolve.build_data(settings)
  task = "lm" if run.model.task == "lm" else "classification"
  if source.task != task:
    raise _validate.fail("data", spec, f"is {source.task} data; the run "
                         f"trained a {task} model")
  vocab = run.model.config.get("vocab")
  if vocab is not None and (source.vocab_size or 0) > vocab:
    raise _validate.fail("data", spec, f"has {source.vocab_size} token ids; "
                         f"the model knows {vocab}")
  return source


def _check_fits(run, batches: dict, spec: str) -> None:
  """Classification data must fit the run's model: examples of the shape
  it takes and labels below its number of classes (a label beyond them
  makes the loss NaN). Probed on one example's shapes, nothing computed."""
  if run.model.task == "lm":
    return  # token ids and windows were checked against the model above
  x, y = batches["x"][0][:1], batches["y"]
  try:
    logits = jax.eval_shape(run.model.apply, run.params, x)
  except Exception as e:  # pylint: disable=broad-except
    # flax, jax and numpy each raise their own kind for a shape mismatch.
    raise _validate.fail("data", spec, f"has examples shaped {x.shape[1:]}, "
                         f"which the run's model does not take ({_why(e)})"
                         ) from None
  classes = logits.shape[-1]
  if y.size and int(y.max()) >= classes:
    raise _validate.fail("data", spec, f"has class label {int(y.max())}; "
                         f"the run's model has {classes} classes, labels "
                         f"0..{classes - 1}")


def _why(error: Exception) -> str:
  """An error's first line without the documentation link flax adds."""
  return str(error).splitlines()[0].split(" (https://")[0]


def _check_tokenizer(run, source, spec: str) -> None:
  """Token ids only mean the same under the same tokenizer."""
  ours = os.path.join(run.run_dir, "tokenizer.json")
  theirs = getattr(source, "tokenizer", None)
  if run.model.task != "lm" or (not os.path.isfile(ours) and theirs is None):
    return
  if theirs is None or not os.path.isfile(ours) or not filecmp.cmp(
      ours, theirs, shallow=False):
    raise _validate.fail("data", spec, "was tokenized differently from the "
                         "run's data (compare their tokenizer.json); prepare "
                         "it with --tokenizer RUN_DIR/tokenizer.json")

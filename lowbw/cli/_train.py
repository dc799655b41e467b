"""``lowbw train``: one simulated run from flags, a config file, or a resume."""

import argparse
import datetime
import inspect
import json
import os
import re
import sys

import jax

from lowbw import _validate, telemetry
from lowbw.cli._config import check_types, flag_types, quantity, read_config
from lowbw import data as data_lib
from lowbw import models as models_lib
from lowbw import network as network_lib
from lowbw.cli import _plot, _strategy
from lowbw.simulation import (_backward, _defaults, _logdir, _memory,
                              initialize, simulate)
from lowbw.strategies import _optim
from lowbw.telemetry import names

METADATA_KEY = "train_args"  # where config.json keeps these settings

# The default run: a small GPT on the standard library's source bytes, 8
# workers, DiLoCo; about a minute on a 2-core CPU. Workers, batch, steps and
# the network are the Python API's defaults (lowbw.simulation._defaults and
# lowbw.network.network); strategy hyperparameters are each strategy's
# spec's, its papers' (lowbw/cli/_strategy.py).
_NETWORK = {name: p.default for name, p in inspect.signature(
    network_lib.network).parameters.items()}
DEFAULTS = {
    "strategy": _strategy.DEFAULT_STRATEGY,
    "workers": _defaults.NUM_WORKERS,
    "model": None, "layers": 2, "d_model": 128, "heads": 4, "seq_len": 128,
    "experts": 8, "top_k": 2, "expert_hidden": 256,
    "hidden": "64", "channels": "16,32",
    "data": "text", "data_root": None, "sharding": "iid", "alpha": 0.5,
    "steps": _defaults.STEPS, "batch_size": _defaults.BATCH_SIZE, "seed": 0,
    "eval_every": None,
    "log_every": None, "checkpoint_every": None, "eval_examples": None,
    "out": None, "progress": None, "devices": None, "worker_dtype": None,
    "worker_batch": "auto", "memory_budget": None, "minibatch_size": None,
    "autocast": None, "correlation_every": None, "eval_local": False,
    "wandb_project": None,
    # The simulated clock (lowbw.network): every run has one.
    **{name: _NETWORK[name] for name in (
        "bandwidth", "latency", "topology", "group_size",
        "regional_bandwidth", "regional_latency", "hardware", "mfu",
        "speeds", "overlap", "clock_params")},
    "jitter": None, "mitigation": "none",
    "keep_fraction": network_lib.Stragglers._field_defaults["fraction"],
    "backups": network_lib.Stragglers._field_defaults["backups"],
    "drop_prob": None,
    "message_loss": None, "failures": None, "windows": None,
}
# Settings that only some choices use; giving one that the run ignores is an
# error rather than a silent no-op.
_USED_BY = {
    "strategy": _strategy.used_by(),
    "inner": {kind: set(names) for kind, names in _optim.USES.items()},
    "model": {"gpt": {"layers", "d_model", "heads", "seq_len"},
              "moe_gpt": {"layers", "d_model", "heads", "seq_len", "experts",
                          "top_k", "expert_hidden"},
              "mlp": {"hidden"},
              "cnn": {"channels"}},
    "data": {"text": {"data_root", "seq_len"}, "tokens": {"seq_len"},
             "folder": {"seq_len"}, "classification": set()},
    "sharding": {"dirichlet": {"alpha"}, "iid": set(), "contiguous": set()},
    "topology": {"hierarchical": {"group_size", "regional_bandwidth",
                                  "regional_latency"},
                 "ring": set(), "parameter_server": set()},
    "mitigation": {"threshold": {"keep_fraction"}, "backup": {"backups"},
                   "none": set()},
    "schedule": {"cosine": {"min_lr_ratio"}, "constant": set()},
}


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "train", help="simulate a distributed training run",
      description="Simulate W workers training one model with a "
      "low-bandwidth strategy; log loss, bytes and time. With no arguments: "
      "DiLoCo, 8 workers, a small GPT on the Python standard library's source "
      "bytes (a few minutes on a 2-core CPU).",
  )
  p.add_argument("--config", metavar="FILE", help="TOML or JSON file of "
                 "these options (keys as the long option names, '-' or '_'); "
                 "flags override it")
  p.add_argument("--resume", metavar="DIR", help="continue the run logged in "
                 "DIR from its latest checkpoint with its settings; only "
                 + _may_change() + " may change")
  p.add_argument("--no-plot", action="store_true",
                 help="do not draw OUT/plot.png (train loss against simulated "
                 "time; drawn by default when matplotlib is installed)")
  p.add_argument("--fail-on-divergence", action="store_true",
                 help="exit with an error (code 3, after writing the logs) "
                 "when the loss ends far above its start or the accuracy at "
                 "or below chance; by default a warning says so")
  add_run_flags(p)
  p.set_defaults(run=run)


def add_run_flags(p) -> None:
  """Every setting of a run (train and sweep)."""
  d = DEFAULTS
  g = p.add_argument_group("strategy", "defaults are each strategy's "
                           "paper's (see docs/strategies/)")
  g.add_argument("--workers", type=int, help=f"number of simulated workers W (default {d['workers']})")
  c = p.add_argument_group(
      "compression", "codec specs chain stages with commas: topk:F, randk:F, "
      "quant:BITS[:statistical][:stochastic][:chunk=N], sign, cast:DTYPE "
      "(bf16, fp16, fp8, e5m2), dct[:CHUNK[:K]], none; e.g. topk:0.1,quant:4")
  _strategy.add_flags(g, c)
  _strategy.add_optimizer_flags(p.add_argument_group("optimizers"))
  g = p.add_argument_group("model and data")
  g.add_argument("--model", help="gpt | moe_gpt | mlp | cnn (default: gpt for text, "
                 "moe_gpt for --strategy spes, mlp for classification)")
  g.add_argument("--layers", type=int, help=f"gpt, moe_gpt (default {d['layers']})")
  g.add_argument("--d-model", type=int, help=f"gpt, moe_gpt (default {d['d_model']})")
  g.add_argument("--heads", type=int, help=f"gpt, moe_gpt (default {d['heads']})")
  g.add_argument("--experts", type=int, help=f"moe_gpt experts E (default {d['experts']})")
  g.add_argument("--top-k", type=int, help=f"moe_gpt experts per token (default {d['top_k']})")
  g.add_argument("--expert-hidden", type=int,
                 help=f"moe_gpt SwiGLU width of each expert (default {d['expert_hidden']})")
  g.add_argument("--seq-len", type=int, help=f"gpt context and text window (default {d['seq_len']})")
  g.add_argument("--hidden", help=f"mlp hidden sizes, comma-separated (default {d['hidden']})")
  g.add_argument("--channels", help=f"cnn channels, comma-separated (default {d['channels']})")
  g.add_argument("--data", help="text | digits | PATH (.npz arrays, .bin uint16 tokens, "
                 "or a folder of text files) (default text: the stdlib sources)")
  g.add_argument("--data-root", help="folder of text files for --data text")
  g.add_argument("--sharding", choices=sorted(_USED_BY["sharding"]),
                 help="how examples are split over workers (default iid)")
  g.add_argument("--alpha", type=float, help="dirichlet concentration (default 0.5)")
  g = p.add_argument_group(
      "network (the simulated clock, sim_time_s)",
      "per step: the slowest participating worker's compute, plus the "
      "collective's time on the links (latency per message hop + bytes / "
      "bandwidth); see docs/network.md")
  g.add_argument("--bandwidth", type=quantity(network_lib.bandwidth,
                                              "bandwidth"),
                 help="each worker's link, e.g. 100Mbps, 1Gbps "
                 f"(default {d['bandwidth']})")
  g.add_argument("--latency", type=quantity(network_lib.duration, "latency"),
                 help=f"one-way latency per message hop, e.g. "
                 f"50ms (default {d['latency']})")
  g.add_argument("--topology", choices=sorted(_USED_BY["topology"]),
                 help="the collectives' algorithm (default ring)")
  if "group_size" not in _strategy.flag_names():  # else a strategy flag too
    g.add_argument("--group-size", type=int, help="hierarchical: workers per "
                   "region (on --regional-* links)")
  g.add_argument("--regional-bandwidth", type=quantity(
      network_lib.bandwidth, "regional_bandwidth"), help=f"hierarchical "
      f"(default {d['regional_bandwidth']})")
  g.add_argument("--regional-latency", type=quantity(
      network_lib.duration, "regional_latency"), help=f"hierarchical "
      f"(default {d['regional_latency']})")
  g.add_argument("--hardware", type=quantity(_hardware_spec, "hardware"),
                 help="per worker: a preset (" + ", ".join(
      sorted(network_lib.PRESETS)) + "), a peak such as 312TFLOPS, or a time "
      f"per step such as 0.5s (default {d['hardware']})")
  g.add_argument("--mfu", type=float, help=f"model-FLOP utilisation (default {d['mfu']})")
  g.add_argument("--speeds", help="per-worker speed multipliers, comma-"
                 "separated (one per worker; 0.5 = half as fast)")
  g.add_argument("--clock-params", type=_count("clock_params"),
                 help="time compute and messages as if the model had this "
                 "many parameters, e.g. 1B or 350M (FLOPs and bytes scaled "
                 "from the model's; the bytes logged stay the model's)")
  g.add_argument("--overlap", action=argparse.BooleanOptionalAction,
                 help="overlap sync communication with the next round's "
                 "compute (Streaming DiLoCo's schedule)")
  g.add_argument("--jitter", type=float, help="stragglers: lognormal sigma of "
                 "every step's time (default none)")
  g.add_argument("--mitigation", choices=sorted(_USED_BY["mitigation"]),
                 help="stragglers (default none)")
  g.add_argument("--keep-fraction", type=float, help="threshold: fraction of "
                 f"the workers aggregated, fastest first (default {d['keep_fraction']})")
  g.add_argument("--backups", type=int, help="backup: spare workers, the "
                 f"slowest dropped each round (default {d['backups']})")
  g.add_argument("--drop-prob", type=float, help="faults: probability a "
                 "worker is down for a round")
  g.add_argument("--message-loss", type=float, help="faults: probability a "
                 "worker's message is lost")
  g.add_argument("--failures", help="faults: permanent failures, "
                 "WORKER@STEP,... e.g. 3@500")
  g.add_argument("--windows", help="faults: down windows, "
                 "WORKER:START-END,... e.g. 1:100-200")
  g = p.add_argument_group("run")
  g.add_argument("--steps", type=int, help=f"inner steps per worker (default {d['steps']})")
  g.add_argument("--batch-size", type=int, help=f"examples per worker and step (default {d['batch_size']})")
  g.add_argument("--seed", type=int, help="default 0")
  g.add_argument("--eval-every", type=int,
                 help="a multiple of H (default: the first multiple of H >= 100)")
  g.add_argument("--log-every", type=int, help="default: the power of two giving 200 to 400 rows")
  g.add_argument("--checkpoint-every", type=int, help="save a checkpoint every N steps")
  g.add_argument("--eval-examples", type=int, help="held-out examples per evaluation")
  g.add_argument("--eval-local", action=argparse.BooleanOptionalAction,
                 help="also evaluate every worker's own parameters "
                 "(eval_local_loss: their mean; eval_local_loss_std: the "
                 "spread)")
  g.add_argument("--wandb-project", help="also log to this Weights & Biases "
                 "project (pip install 'lowbw[wandb]'; WANDB_MODE=offline "
                 "needs no network)")
  g.add_argument("--correlation-every", type=int, help="log "
                 "worker_correlation, the workers' mean pairwise parameter "
                 "correlation, every N steps (a multiple of H)")
  g.add_argument("--out", help="log folder (default runs/<time>-<strategy>); "
                 "one holding another run is refused unless --overwrite")
  g.add_argument("--overwrite", action="store_true", help="clear what "
                 "another run wrote in --out (nothing else) before this one")
  g.add_argument("--progress", action=argparse.BooleanOptionalAction,
                 help="progress bar (default: on a terminal)")
  add_scale_flags(p)


_CAP_MIB = _memory.CPU_ACTIVATION_CAP // 2 ** 20


def _group_size(text: str) -> str:
  """``--worker-batch``: kept as given ("auto", "all" or digits; checked by
  ``lowbw.build``); a config file may give an integer."""
  return text


_group_size.config_types = (int, str)


def _count(field):
  check = quantity(network_lib._units.count, field)
  check.config_types = (int, float, str)
  return check


def _hardware_spec(text, field):
  return network_lib.hardware(text)


def _budget(text, field):
  return _memory.check_budget(text)


def add_scale_flags(p) -> None:
  """Devices, worker precision and multi-process flags (train and bench)."""
  g = p.add_argument_group("compute")
  g.add_argument("--minibatch-size", type=int, help="gradient accumulation: "
                 "compute each worker's batch in micro-batches of this size "
                 "(must divide --batch-size; the same gradient, one "
                 "micro-batch's activations in memory); default the batch")
  g.add_argument("--autocast", choices=tuple(_backward.AUTOCAST),
                 help="run forward and backward passes in this type, with "
                 "float32 parameters, gradients and optimizer state (mixed "
                 "precision); default float32")
  g = p.add_argument_group("devices and hosts")
  g.add_argument("--devices", type=int, help="spread the workers over N "
                 "devices (must divide --workers; default 1, or all devices "
                 "of a multi-process run)")
  g.add_argument("--worker-dtype", help="bfloat16: keep every worker's "
                 "parameters and optimizer state in bf16 (half the memory; "
                 "see docs/performance.md); default float32")
  g.add_argument("--worker-batch", type=_group_size,
                 help="compute the inner steps of this "
                 "many workers at a time (memory for activations and "
                 "gradients of one group only; diloco, muloco, fedavg); "
                 "'all': every worker at once; default 'auto': all at once "
                 f"while their activations fit {_CAP_MIB} MiB (CPU; a quarter "
                 "of the budget on a GPU) and the memory budget")
  g.add_argument("--memory-budget", type=quantity(_budget, "memory_budget"),
                 help="memory the run may use: '8GB', "
                 "'512MiB' or a share of free memory, '60%%' (default 80%% "
                 "of free memory); a run estimated to need more is refused "
                 "before compiling")
  g.add_argument("--coordinator", help="multi-process: host:port of process "
                 "0 (or JAX_COORDINATOR_ADDRESS)")
  g.add_argument("--num-processes", type=int, help="multi-process: K "
                 "processes (or JAX_NUM_PROCESSES)")
  g.add_argument("--process-id", type=int, help="multi-process: this "
                 "process's index in [0, K) (or JAX_PROCESS_ID)")


def setting_names() -> set[str]:
  """Every setting of a run: config-file keys and resumable values."""
  return set(DEFAULTS) | _strategy.flag_names()


def join_processes(args: argparse.Namespace) -> None:
  """``jax.distributed.initialize`` when flags or environment ask for it."""
  if (args.coordinator or args.num_processes is not None or
      args.process_id is not None or "JAX_COORDINATOR_ADDRESS" in os.environ):
    initialize(args.coordinator, args.num_processes, args.process_id)


def settings(args: argparse.Namespace) -> tuple[dict, set[str]]:
  """Defaults < resumed run's settings < config file < flags.

  Returns the merged settings and the names given explicitly (flags and
  config file), which must all be used by the run.
  """
  merged, explicit, saved = dict(DEFAULTS), set(), {}
  if args.resume:
    path = os.path.join(args.resume, "config.json")
    saved = None
    if os.path.isfile(path):
      with open(path) as f:
        saved = json.load(f).get("metadata", {}).get(METADATA_KEY)
    if saved is None:
      raise _validate.fail("resume", args.resume,
                           "not the log folder of a lowbw train run "
                           "(no config.json with its settings)")
    merged.update(saved)
    merged["out"] = args.resume
  from_file = {}
  if args.config:
    from_file = check_types(read_config(args.config, setting_names()),
                            flag_types(add_run_flags), args.config)
    merged.update(from_file)
    explicit |= set(from_file)
  flags = {k: v for k, v in vars(args).items()
           if k in setting_names() and v is not None}
  if args.resume:
    _check_resume_changes(saved, {**from_file, **flags})
  merged.update(flags)
  explicit |= set(flags)
  merged = _strategy.fill(merged, explicit | set(saved or {}))
  return merged, explicit


# What ``--resume`` may change: how long the run goes on and how it is logged.
RESUME_MAY_CHANGE = ("steps", "eval_every", "log_every", "checkpoint_every",
                     "eval_examples", "progress", "out", "devices",
                     "worker_batch", "memory_budget")


def _may_change() -> str:
  return ", ".join("--" + n.replace("_", "-") for n in RESUME_MAY_CHANGE)


def _check_resume_changes(saved: dict, given: dict) -> None:
  for name, value in sorted(given.items()):
    if name not in RESUME_MAY_CHANGE and value != saved.get(name):
      raise _validate.fail(
          name, value, f"the resumed run has {name}={saved.get(name)!r}; on "
          "--resume only " + _may_change() + " may change")
  if ("steps" in given and given["steps"] != saved.get("steps") and
      saved.get("schedule") == "cosine"):
    raise _validate.fail("steps", given["steps"],
                         "a cosine schedule decays over the first run's "
                         f"{saved.get('steps')} steps; it cannot be extended")


def _data_kind(s: dict, source) -> str:
  if source.task != "lm":
    return "classification"
  if s["data"] == "text":
    return "text"
  return "folder" if os.path.isdir(s["data"]) else "tokens"


def check_used(s: dict, explicit: set[str], model_name: str, source) -> None:
  """Raises for an explicitly given setting that the chosen run ignores."""
  chosen = {"strategy": s["strategy"], "inner": s["inner"], "model": model_name,
            "data": _data_kind(s, source), "sharding": s["sharding"],
            "topology": s["topology"], "mitigation": s["mitigation"],
            "schedule": s["schedule"]}
  used = set().union(*(options.get(chosen[kind], set())
                        for kind, options in _USED_BY.items()))
  if "compress" in explicit and str(s["codec"]).lower() == "none":
    raise _validate.fail("compress", s["compress"],
                         "says what --codec encodes; give a --codec")
  for name in sorted(explicit - used):
    owners = [kind for kind, options in _USED_BY.items()
              if any(name in names for names in options.values())]
    if owners:  # a setting some choice would use, but none of these does
      raise _validate.fail(
          name, s[name], "not used by " + ", ".join(
              f"{kind} {chosen[kind]!r}" for kind in owners))


def _ints(field, text):
  try:
    values = tuple(int(v) for v in str(text).split(",") if v.strip())
  except ValueError:
    values = ()
  if not values or min(values) < 1:
    raise _validate.fail(field, text, "expected positive integers, comma-separated")
  return values


def build_data(s: dict):
  """The settings' dataset; a bad file is reported under --data."""
  try:
    return _build_data(s)
  except _validate.ConfigError as e:
    if e.field in ("data", "data_root", "sharding", "alpha", "seq_len"):
      raise
    allowed = e.allowed if e.field == "path" else str(e)
    raise _validate.fail("data", s["data"], allowed) from None


def _build_data(s: dict):
  name = s["data"]
  common = {"sharding": s["sharding"]}
  labelled = {**common, "alpha": s["alpha"]} if s["sharding"] == "dirichlet" else common
  if name == "text":
    return data_lib.text_bytes(seq_len=s["seq_len"], root=s["data_root"],
                               **common)
  if name == "digits":
    return data_lib.digits(**labelled)
  if os.path.isdir(name):
    return data_lib.text_bytes(seq_len=s["seq_len"], root=name, **common)
  if name.endswith(".npz"):
    return data_lib.arrays(name, **labelled)
  if name.endswith(".bin"):
    return data_lib.token_file(name, seq_len=s["seq_len"], **common)
  raise _validate.fail("data", name, "expected text, digits, a folder, an "
                       ".npz file or a .bin token file")


def build_model(s: dict, source):
  lm = _strategy.spec_of(s).model or "gpt"
  name = s["model"] or (lm if source.task == "lm" else "mlp")
  if name in ("gpt", "moe_gpt"):
    shape = dict(layers=s["layers"], d_model=s["d_model"], heads=s["heads"],
                 seq_len=s["seq_len"], vocab=max(256, source.vocab_size or 0))
    if name == "gpt":
      return models_lib.gpt(**shape)
    return models_lib.moe_gpt(**shape, num_experts=s["experts"],
                              top_k=s["top_k"],
                              expert_hidden=s["expert_hidden"])
  num_classes = getattr(source, "num_classes", None) or 10
  if name == "mlp":
    return models_lib.mlp(hidden=_ints("hidden", s["hidden"]),
                          num_classes=num_classes)
  if name == "cnn":
    return models_lib.cnn(channels=_ints("channels", s["channels"]),
                          num_classes=num_classes)
  return models_lib.get(name)  # raises the registry's error


def _pairs(field, text, pattern, size):
  """"3@500,5@800" or "1:100-200" -> tuples of ints."""
  out = []
  for item in str(text).split(","):
    match = re.fullmatch(pattern, item.strip())
    if not match:
      raise _validate.fail(field, text, "expected " + (
          "WORKER@STEP" if size == 2 else "WORKER:START-END") +
          " items, comma-separated")
    out.append(tuple(int(v) for v in match.groups()))
  return tuple(out)


def build_network(s: dict) -> network_lib.Network:
  stragglers = faults = None
  if s["jitter"] is not None or s["mitigation"] != "none":
    stragglers = network_lib.Stragglers(
        jitter=0.0 if s["jitter"] is None else s["jitter"],
        mitigation=s["mitigation"], fraction=s["keep_fraction"],
        backups=s["backups"])
  fault_settings = ("drop_prob", "message_loss", "failures", "windows")
  if any(s[k] is not None for k in fault_settings):
    faults = network_lib.Faults(
        drop_prob=s["drop_prob"] or 0.0, message_loss=s["message_loss"] or 0.0,
        failures=_pairs("failures", s["failures"], r"(\d+)@(\d+)", 2)
        if s["failures"] else (),
        windows=_pairs("windows", s["windows"], r"(\d+):(\d+)-(\d+)", 3)
        if s["windows"] else ())
  overlap = s["overlap"]
  if not isinstance(overlap, bool):
    raise _validate.fail("overlap", overlap, "expected true or false")
  return network_lib.network(
      s["bandwidth"], s["latency"], topology=s["topology"],
      group_size=s["group_size"] if s["topology"] == "hierarchical" else None,
      regional_bandwidth=s["regional_bandwidth"],
      regional_latency=s["regional_latency"], hardware=s["hardware"],
      mfu=s["mfu"], speeds=s["speeds"], stragglers=stragglers, faults=faults,
      overlap=overlap, clock_params=s["clock_params"])


# The build arguments named as the settings are (``batch_size``), and those
# the API names otherwise: API field -> setting (and so flag) name.
_BUILD_SETTINGS = ("batch_size", "steps", "log_every", "eval_examples",
                   "devices", "worker_dtype", "worker_batch", "memory_budget",
                   "minibatch_size", "autocast", "correlation_every",
                   "eval_local")
API_NAMES = {"num_workers": "workers", "log_dir": "out",
             "resume_from": "resume", "stragglers.fraction": "keep_fraction",
             "error_feedback": "ef"}


def build_args(s: dict, explicit: set[str]) -> dict:
  """``lowbw.build`` arguments from merged settings (train and sweep)."""
  source = build_data(s)
  model = build_model(s, source)
  check_used(s, explicit, model.name, source)
  strategy = _strategy.build(s)
  eval_every = s["eval_every"]
  if eval_every is None:  # the first multiple of H at or after 100 steps
    eval_every = strategy.period * -(-100 // strategy.period)
  return dict(model=model, data=source, strategy=strategy,
              num_workers=s[API_NAMES["num_workers"]],
              network=build_network(s), eval_every=eval_every,
              **{name: s[name] for name in _BUILD_SETTINGS})


def default_out(s: dict, kind: str = "") -> str:
  return s["out"] or os.path.join(
      "runs", datetime.datetime.now().strftime("%Y%m%d-%H%M%S") + "-" + kind +
      s["strategy"])


def run(args: argparse.Namespace) -> int:
  join_processes(args)
  s, explicit = settings(args)
  out = default_out(s)
  _logdir.prepare(out, resuming=bool(args.resume), overwrite=args.overwrite,
                  create=False, field="out")
  say = _status(s)
  say(f"loading data ({s['data']}) and building the {s['strategy']} run")
  run_args = build_args(s, explicit)
  saved = {k: v for k, v in s.items() if k not in ("progress", "out")}
  for key in ("data", "data_root"):  # resumable from another directory
    if saved[key] and os.path.exists(saved[key]):
      saved[key] = os.path.abspath(saved[key])
  say(f"compiling {s['workers']} workers' program (kept in the compilation "
      f"cache for later runs), then {s['steps']} steps; logs in {out}")
  result = simulate(
      **run_args, seed=s["seed"], log_dir=out,
      checkpoint_every=s["checkpoint_every"], resume_from=args.resume,
      progress=s["progress"], metadata={METADATA_KEY: saved},
      overwrite=args.overwrite, callback=_row_printer(s),
      wandb_project=s["wandb_project"],
      fail_on_divergence=args.fail_on_divergence)
  if result.config["processes"] == 1 or jax.process_index() == 0:
    print(format_summary(result.summary, s))
    if not args.no_plot:
      print(_default_plot(out, result))
    for text in result.summary["warnings"]:
      print(f"lowbw: warning: {text}", file=sys.stderr)
  return 0


def _default_plot(out: str, result) -> str:
  """Draws the run's train loss against simulated time (against steps
  without a clock) into ``out/plot.png``; the summary's line about it."""
  x = names.SIM_TIME_S if names.SIM_TIME_S in result.history else names.STEP
  try:
    # Smoothed: each point is a window's mean loss, not one noisy step's.
    smooth = max(1, len(result.history[names.STEP]) // 20)
    path, x_axis, y_axis = _plot.write([out], x, names.TRAIN_LOSS, smooth,
                                       log_x=False)
  except ModuleNotFoundError:
    return "  plot              none (needs matplotlib: pip install 'lowbw[plot]')"
  return (f"  plot              {path} ({y_axis.label} against "
          f"{x_axis.label}; lowbw plot {out} --x ... --y ... for others)")


def _status(s: dict):
  """A line on stdout at once, saying what the run is doing before its first
  row (loading, compiling): off a terminal nothing else shows for a while."""

  def say(text: str) -> None:
    if s["progress"] is not False and jax.process_index() == 0:
      print(f"lowbw: {text}", flush=True)

  return say


def _row_printer(s: dict):
  """Off a terminal (a log file, a batch job) with no progress setting: one
  line per logged row on stdout instead of a bar; else None."""
  if s["progress"] is not None or telemetry.is_terminal():
    return None
  steps = s["steps"]

  def show(row: dict) -> None:
    if jax.process_index() != 0:
      return
    parts = [f"step {row[names.STEP]}/{steps}"]
    for key in (names.TRAIN_LOSS, names.EVAL_LOSS):
      if row.get(key) is not None and row[key] == row[key]:
        parts.append(f"{key} {row[key]:.4f}")
    if row.get(names.SIM_TIME_S) is not None:
      parts.append(f"sim {_duration(row[names.SIM_TIME_S])}")
    parts.append(f"sent {_bytes(row[names.WIRE_BYTES])}")
    print("  ".join(parts), flush=True)

  return show


def _bytes(n: float) -> str:
  for unit in ("B", "KB", "MB", "GB", "TB"):
    if abs(n) < 1000 or unit == "TB":
      return f"{n:,.1f} {unit}" if unit != "B" else f"{n:,.0f} B"
    n /= 1000
  return str(n)


def _duration(seconds: float) -> str:
  if seconds >= 3600:
    return f"{seconds / 3600:,.2f} h"
  if seconds >= 60:
    return f"{seconds / 60:.1f} min"
  return network_lib._units.format_duration(seconds)


def format_summary(summary: dict, s: dict) -> str:
  lines = [f"{s['strategy']}: {summary['num_workers']} workers x "
           f"{summary['steps']} steps, {summary['num_params']:,} parameters"]
  if summary.get("final_eval_loss") is not None:
    extra = ""
    if summary.get("final_eval_perplexity") is not None:
      extra = f", perplexity {summary['final_eval_perplexity']:.3f}"
    elif summary.get("final_eval_accuracy") is not None:
      extra = f", accuracy {summary['final_eval_accuracy']:.3f}"
    lines.append(f"  final eval loss   {summary['final_eval_loss']:.4f}{extra}")
  collectives = ", ".join(sorted(set(summary.get("collectives", {}).values())))
  lines.append(f"  sent per worker   {_bytes(summary['payload_bytes'])} payload, "
               f"{_bytes(summary['wire_bytes'])} on the wire ({collectives})")
  rate = f"{summary['steps_per_s']:.2f} steps/s"
  if summary.get("tokens_per_s"):
    rate += f", {summary['tokens_per_s']:,.0f} tokens/s"
  if summary.get("sim_time_s") is not None:
    topology = s["topology"] + (f" of {s['group_size']}" if s["group_size"]
                                else "")
    lines.append(f"  simulated time    {_duration(summary['sim_time_s'])} on "
                 f"{s['bandwidth']}, {s['latency']} ({topology}), "
                 f"{s['hardware']} at MFU {s['mfu']}")
  if summary.get("comm_share") is not None:
    steps = max(1, summary["steps"])
    lines.append(
        f"  time per step     compute "
        f"{network_lib._units.format_duration(summary['compute_s'] / steps)}, "
        "communication "
        f"{network_lib._units.format_duration(summary['comm_s'] / steps)} "
        f"({summary['comm_share']:.1%} of the nominal time"
        + (f"; clock as if {s['clock_params']} parameters"
           if s.get("clock_params") else "") + ")")
  lines.append(f"  throughput        {rate} (compile {summary['compile_s']:.1f} s)")
  lines.append(f"  logs              {summary['log_dir']}")
  lines += [f"  WARNING           {w}" for w in summary.get("warnings", ())]
  return "\n".join(lines)

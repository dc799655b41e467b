"""``lowbw export``: a lowbw configuration handed to a production trainer.

A method that looks good in the simulator is next run in torchtitan, MaxText
or torchft. Each target's option names were read in the target project's own
sources, at the version its ``Source`` names (``TORCHTITAN``, ``MAXTEXT``,
``TORCHFT``); what a target cannot express (codecs, simulated faults,
stragglers, strategies it lacks) is listed, setting by setting, in a table of
what does not transfer, never dropped in silence.
"""

import dataclasses
import json
import os
import sys
from typing import Any, Callable, NamedTuple

import yaml

from lowbw import _validate, network
from lowbw.config import Config
from lowbw.config import _resolve
from lowbw.config._config import FIELDS


class Source(NamedTuple):
  """Where a target's option names were read: its repository, the release
  or commit, and the files that define the names."""

  project: str
  version: str
  files: tuple


TORCHTITAN = Source(
    "pytorch/torchtitan", "v0.2.2 (commit 73a0e6979dd10b6b1904098eb3c8f62c18a"
    "b87ce), its last release with TOML job configs",
    ("torchtitan/config/job_config.py",
     "torchtitan/components/ft/config/job_config.py",
     "torchtitan/components/ft/manager.py"))
MAXTEXT = Source(
    "AI-Hypercomputer/maxtext",
    "commit e591f30cbbf217ed67ef71263ec0538239f9c3b8 (2026-08-22)",
    ("src/maxtext/configs/base.yml", "src/maxtext/configs/types.py",
     "src/maxtext/trainers/diloco/diloco.py"))
TORCHFT = Source(
    "pytorch/torchft",
    "commit 73dafea422116b2a713542719c8454efe5444c6c (2025-10-21)",
    ("torchft/local_sgd.py", "torchft/manager.py", "torchft/ddp.py"))

# torchtitan v0.2.2 builds DiLoCo's outer optimizer in code, not from its
# config (components/ft/manager.py, maybe_semi_sync_training).
TORCHTITAN_OUTER = ("sgd", 0.7, 0.9)


class Row(NamedTuple):
  """One lowbw setting that does not transfer, and why."""

  setting: str
  value: Any
  why: str


@dataclasses.dataclass
class Export:
  """One configuration for one target: ``text`` (what the target reads),
  ``options`` (each emitted option name -> value) and ``rows`` (what does
  not transfer)."""

  target: str
  strategy: str
  text: str
  options: dict
  rows: list

  def table(self) -> str:
    """What does not transfer, as a Markdown table."""
    lines = [f"lowbw settings that do not transfer to {NAMES[self.target]} "
             f"({self.strategy}):", "",
             "| setting | value | why |", "| --- | --- | --- |"]
    for r in self.rows:
      lines.append(f"| {r.setting} | {_show(r.value)} | {r.why} |")
    if not self.rows:
      lines.append("| (none) | | every setting the run reads transfers |")
    return "\n".join(lines) + "\n"


class View(NamedTuple):
  """The settings an export reads, resolved: the config's values and the
  built strategy's (the inner optimizer's hyperparameters, the delay)."""

  c: Any            # the lowbw.Config
  built: dict       # the strategy's resolved settings (its config dict)

  @property
  def inner(self) -> dict:
    return self.built.get("inner", {}).get("hyperparams", {})


# Settings whose value changes nothing in the run they are listed for.
_INERT = {"robust": "mean", "aggregation": "all_gather",
          "compress": "deltas", "leave_shards": "drop",
          "schedule": "constant"}
# Settings of the simulated fleet: in a production trainer these are real.
_FLEET = ("speeds", "jitter", "mitigation", "keep_fraction", "backups",
          "drop_prob", "message_loss", "failures", "windows", "joins",
          "byzantine", "byzantine_kind", "byzantine_scale", "bandwidth_trace")
_MODEL_GROUP = "model and data"
_GROUPS = ("strategy", "compression", "optimizers")


def load(path: str) -> Config:
  """The ``lowbw.Config`` of a config file (YAML, TOML, JSON) or of a run's
  folder (its config.yaml, else the settings in its config.json)."""
  if not os.path.exists(path):
    raise _validate.fail("config", path, "no such file or folder; give a "
                         "config file (YAML, TOML, JSON) or a lowbw train "
                         "--out folder")
  if not os.path.isdir(path):
    return Config.load(path)
  yaml_path = os.path.join(path, "config.yaml")
  if os.path.isfile(yaml_path):
    return Config.load(yaml_path)
  return Config(**_saved_settings(path))


def _saved_settings(folder: str) -> dict:
  """The settings a ``lowbw train`` run keeps in its config.json."""
  json_path = os.path.join(folder, "config.json")
  record = None
  if os.path.isfile(json_path):
    with open(json_path) as f:
      try:
        record = json.load(f)
      except ValueError as e:
        raise _validate.fail("config", folder, f"its config.json is not "
                             f"valid JSON ({e})") from None
  meta = record.get("metadata") if isinstance(record, dict) else None
  saved = meta.get("train_args") if isinstance(meta, dict) else None
  if not isinstance(saved, dict):
    raise _validate.fail("config", folder, "not a run's folder: it has no "
                         "config.yaml and no config.json with the run's "
                         "settings")
  return {k: v for k, v in saved.items() if k in FIELDS}


def view(config: Config) -> View:
  """The config with its strategy's resolved settings."""
  settings = {name: getattr(config, name) for name in FIELDS}
  return View(config, dict(_resolve.build_strategy(settings).config))


def export(config: Config, target: str) -> Export:
  """``config`` as ``target`` reads it, with what does not transfer."""
  if target not in TARGETS:
    raise _validate.fail("to", target, "expected one of " +
                         ", ".join(TARGETS) + _validate.suggest(target,
                                                                TARGETS))
  t = TARGETS[target]
  v = view(config)
  if v.c.strategy not in t.strategies:
    raise _validate.fail("strategy", v.c.strategy, f"{target} supports "
                         f"{', '.join(t.strategies)}; nothing of "
                         f"{v.c.strategy} transfers")
  options, used, rows = t.mapping(v)
  rows = rows + _leftovers(v, target, used | {r.setting for r in rows})
  return Export(target, v.c.strategy, t.render(v, options), options, rows)


def _leftovers(v: View, target: str, used: set) -> list:
  """A row for each setting the run reads that the mapping did not use."""
  values = v.c.to_dict()
  rows = []
  for name, value in values.items():
    if name in used or name == "strategy":
      continue
    group = FIELDS[name].group
    if group in _GROUPS:
      if value in (None, False, "none") or _INERT.get(name) == value:
        continue
      rows.append(Row(name, value, _why(name, group, target)))
    elif group.startswith("network") and (
        name in ("bandwidth", "latency") or value != FIELDS[name].default):
      rows.append(Row(name, value, _why(name, group, target)))
  model = [f"{k}={values[k]}" for k in ("model", "data") if k in values]
  if model:
    rows.append(Row("model, data", ", ".join(model), f"{NAMES[target]} "
                    "trains its own model on its own data: set them in its "
                    "config"))
  for name in ("steps", "batch_size"):
    if name not in used:
      rows.append(Row(name, values[name], _why(name, "run", target)))
  return rows


def _why(name: str, group: str, key: str) -> str:
  notes, target = TARGETS[key].notes, NAMES[key]
  if name in notes:
    return notes[name]
  if group == "compression":
    return notes["compression"]
  if group == "optimizers":
    return f"{target} has no option for this setting"
  if group == "strategy":
    return f"a lowbw setting of this strategy with no {target} option"
  if name in _FLEET:
    return ("simulated in lowbw only: in a production run, faults, slow "
            "workers and their mitigation are real")
  if name == "bandwidth":
    return (f"{target} cannot throttle its links; limit them outside it "
            "(Linux tc)")
  if name == "steps":
    return f"{target} is driven by your training loop: run this many steps"
  if name == "batch_size":
    return ("examples per worker and step: set the batch of each replica "
            f"group in {target}'s data-parallel settings")
  return ("the simulated clock's model (links, hardware); a production run "
          "takes the time it takes")


# torchtitan (TOML job config, v0.2.2).


def _titan(v: View) -> tuple[dict, set, list]:
  c, o = v.c, {}
  used, rows = {"workers"}, []
  o["fault_tolerance.enable"] = True
  o["fault_tolerance.group_size"] = c.workers
  o["fault_tolerance.min_replica_size"] = c.workers
  if c.strategy in ("diloco", "streaming_diloco"):
    o["fault_tolerance.semi_sync_method"] = "diloco"
  elif c.strategy == "fedavg":
    o["fault_tolerance.semi_sync_method"] = "local_sgd"
  if c.strategy != "ddp":
    o["fault_tolerance.sync_steps"] = c.H
    used.add("H")
  if c.strategy == "streaming_diloco":
    o["fault_tolerance.num_fragments"] = c.fragments
    o["fault_tolerance.fragment_sync_delay"] = v.built["delay"]
    o["fault_tolerance.fragment_update_alpha"] = v.built["alpha"]
    used |= {"fragments", "delay", "merge_alpha"}
  if c.strategy in ("diloco", "streaming_diloco"):
    rows += _titan_outer(c)
    used |= {"outer", "outer_lr", "outer_momentum"}
  inner, inner_used, inner_rows = _torch_inner(v, "optimizer.", {
      "adamw": "AdamW", "adam": "Adam"}, "name", "torchtitan")
  o.update(inner)
  o.update(_titan_schedule(c))
  o["training.steps"] = c.steps
  if c.max_norm is not None:
    o["training.max_norm"] = c.max_norm
  else:
    rows.append(Row("max_norm", None, "torchtitan clips gradients at its "
                    "training.max_norm (default 1.0): set it very large for "
                    "lowbw's no clipping"))
  used |= inner_used | {"warmup_steps", "schedule", "min_lr_ratio",
                        "steps", "max_norm"}
  return o, used, rows + inner_rows


def _titan_outer(c) -> list:
  kind, lr, momentum = TORCHTITAN_OUTER
  given = (c.outer, c.outer_lr, c.outer_momentum)
  if given == (kind, lr, momentum):
    return []
  return [Row(name, value, "torchtitan v0.2.2 builds the outer optimizer "
              f"in code as SGD lr {lr}, momentum {momentum}, Nesterov "
              "(components/ft/manager.py); edit it there")
          for name, value, fixed in zip(("outer", "outer_lr",
                                         "outer_momentum"), given,
                                        TORCHTITAN_OUTER) if value != fixed]


def _titan_schedule(c) -> dict:
  """Linear warm-up, then constant (a decay to 1x) or cosine."""
  o = {"lr_scheduler.warmup_steps": int(c.warmup_steps)}
  if c.schedule == "cosine":
    o["lr_scheduler.decay_type"] = "cosine"
    o["lr_scheduler.min_lr_factor"] = float(c.min_lr_ratio or 0.0)
  else:
    o["lr_scheduler.decay_type"] = "linear"
    o["lr_scheduler.min_lr_factor"] = 1.0
  return o


def _torch_inner(v: View, prefix: str, names: dict, name_key: str,
                 target: str) -> tuple[dict, set, list]:
  """The inner optimizer as torch's (torchtitan's [optimizer] keys)."""
  c, hp = v.c, v.inner
  used = {"inner", "inner_lr", "b1", "b2", "eps", "weight_decay"}
  if c.inner not in names:
    return {}, used, [Row("inner", c.inner, f"{target} offers "
                          f"{', '.join(names.values())} as inner "
                          "optimizers")]
  o = {prefix + name_key: names[c.inner], prefix + "lr": c.inner_lr,
       prefix + "beta1": hp["b1"], prefix + "beta2": hp["b2"],
       prefix + "eps": hp["eps"],
       prefix + "weight_decay": hp.get("weight_decay", 0.0)}
  return o, used, []


def _titan_render(v: View, options: dict) -> str:
  sections: dict[str, list] = {}
  for key, value in options.items():
    section, name = key.split(".", 1)
    sections.setdefault(section, []).append(f"{name} = {_toml(value)}")
  lines = _header(v, TORCHTITAN, "#") + [
      f"# Launch {v.c.workers} replica groups, each with its own "
      "--fault_tolerance.replica_id (0 to "
      f"{v.c.workers - 1}), with torchft's lighthouse running.", "",
      "[job]", '# the fault_tolerance keys below are this module\'s',
      'custom_config_module = "torchtitan.components.ft.config"']
  for section, entries in sections.items():
    lines += ["", f"[{section}]"] + entries
  return "\n".join(lines) + "\n"


def _toml(value) -> str:
  if isinstance(value, bool):
    return "true" if value else "false"
  if isinstance(value, str):
    return json.dumps(value)
  return repr(value)


# MaxText (YAML overrides of base.yml, or key=value on its command line).


def _maxtext(v: View) -> tuple[dict, set, list]:
  c, o, rows = v.c, {}, []
  used = {"workers", "steps"}
  if c.strategy == "ddp":
    o["dcn_data_parallelism"] = c.workers
  else:
    o["enable_diloco"] = True
    o["dcn_diloco_parallelism"] = c.workers
    o["diloco_sync_period"] = c.H
    used.add("H")
    rows += _maxtext_outer(c, o)
    used |= {"outer", "outer_lr", "outer_momentum"}
  if c.strategy == "streaming_diloco":
    o["enable_streaming_diloco"] = True
    o["num_diloco_fragments"] = c.fragments
    o["use_sequential_layers"] = c.pattern == "sequential"
    o["num_communication_overlapping_steps"] = v.built["delay"]
    o["communication_overlapping_alpha"] = v.built["alpha"]
    used |= {"fragments", "pattern", "delay", "merge_alpha"}
  inner, inner_used, inner_rows = _maxtext_inner(v)
  o.update(inner)
  o["steps"] = c.steps
  o.update(_maxtext_schedule(c))
  o.update(_maxtext_link(c, used))
  used |= inner_used | {"warmup_steps", "schedule", "min_lr_ratio"}
  return o, used, rows + inner_rows


def _maxtext_outer(c, o: dict) -> list:
  """MaxText's outer optimizer is SGD with Nesterov momentum
  (trainers/diloco/diloco.py): its lr and momentum are options. FedAvg is
  DiLoCo with outer SGD at lr 1 without momentum (the mean is the step)."""
  if c.strategy == "fedavg":
    o["diloco_outer_lr"], o["diloco_outer_momentum"] = 1.0, 0.0
    return []
  if c.outer != "sgd":
    return [Row("outer", c.outer, "MaxText's outer optimizer is SGD with "
                "Nesterov momentum (diloco_outer_lr, diloco_outer_momentum)")]
  o["diloco_outer_lr"] = c.outer_lr
  o["diloco_outer_momentum"] = c.outer_momentum
  return []


def _maxtext_inner(v: View) -> tuple[dict, set, list]:
  c, hp = v.c, v.inner
  used = {"inner", "inner_lr", "b1", "b2", "eps", "weight_decay",
          "max_norm"}
  o = {"gradient_clipping_threshold": float(c.max_norm or 0.0)}
  if c.inner not in ("adamw", "adam"):
    return o, used, [Row("inner", c.inner, "exported for adamw and adam "
                         "only (MaxText's opt_type has its own sgd and muon "
                         "settings)")]
  o.update({"opt_type": "adamw", "learning_rate": c.inner_lr,
            "adam_b1": hp["b1"], "adam_b2": hp["b2"], "adam_eps": hp["eps"],
            "adam_weight_decay": hp.get("weight_decay", 0.0)})
  return o, used, []


def _maxtext_schedule(c) -> dict:
  """Warm-up as a share of the steps; a cosine to 1x is constant."""
  final = float(c.min_lr_ratio or 0.0) if c.schedule == "cosine" else 1.0
  return {"lr_schedule_type": "cosine",
          "warmup_steps_fraction": c.warmup_steps / c.steps,
          "learning_rate_final_fraction": final}


def _maxtext_link(c, used: set) -> dict:
  """MaxText throttles each VM's egress (dcn_bandwidth_limit): a worker's
  upload rate where lowbw has one, else its link's."""
  name = "upload_bandwidth" if c.upload_bandwidth is not None else "bandwidth"
  value = getattr(c, name)
  if value is None or "," in str(value):
    return {}  # one rate per worker: left in the table
  used.add(name)
  return {"dcn_bandwidth_limit": _tc_rate(value)}


def _tc_rate(bandwidth) -> str:
  """A bandwidth as Linux tc writes a rate (``1gbit``, ``100mbit``)."""
  bits = network.bandwidth(bandwidth)
  for unit, size in (("gbit", 1e9), ("mbit", 1e6), ("kbit", 1e3)):
    if bits >= size and float(bits / size).is_integer():
      return f"{int(bits / size)}{unit}"
  return f"{int(bits)}bit"


def _maxtext_render(v: View, options: dict) -> str:
  lines = _header(v, MAXTEXT, "#") + [
      "# Overrides of src/maxtext/configs/base.yml; on the command line: "
      + " ".join(f"{k}={_cli(val)}" for k, val in options.items())]
  if "num_diloco_fragments" in options:
    lines.append("# MaxText counts its non-scanned parameters as one fragment "
                 "and splits the decoder layers into the others (its "
                 "num_decoder_layers must divide by num_diloco_fragments - 1)"
                 "; lowbw's fragments are its model's blocks.")
  lines.append("")
  body = yaml.safe_dump(options, sort_keys=False, default_flow_style=False)
  return "\n".join(lines) + "\n" + body


def _cli(value) -> str:
  return str(value).lower() if isinstance(value, bool) else str(value)


# torchft (configured in code: a Python snippet).


def _torchft(v: View) -> tuple[dict, set, list]:
  c, o, rows = v.c, {}, []
  used = {"workers"}
  o["Manager.min_replica_size"] = c.workers
  o["Manager.use_async_quorum"] = c.strategy == "ddp"
  if c.strategy != "ddp":
    wrapper = "LocalSGD" if c.strategy == "fedavg" else "DiLoCo"
    o[wrapper + ".sync_every"] = c.H
    used.add("H")
  if c.strategy == "streaming_diloco":
    o["DiLoCo.fragment_sync_delay"] = v.built["delay"]
    o["DiLoCo.fragment_update_alpha"] = v.built["alpha"]
    o["fragments"] = c.fragments
    used |= {"fragments", "delay", "merge_alpha"}
  if c.strategy in ("diloco", "streaming_diloco", "fedadam"):
    o.update(_torchft_outer(v))
    used |= {"outer", "outer_lr", "outer_momentum", "outer_b1", "outer_b2",
             "outer_eps"}
  inner, inner_used, inner_rows = _torch_inner(v, "inner.", {
      "adamw": "AdamW", "adam": "Adam"}, "class", "torchft")
  o.update(inner)
  if c.max_norm is not None:
    o["clip_grad_norm_.max_norm"] = c.max_norm
  used |= inner_used | {"max_norm"}
  return o, used, rows + inner_rows


def _torchft_outer(v: View) -> dict:
  c = v.c
  if c.outer == "adam":
    hp = v.built["outer"]["hyperparams"]
    return {"outer.class": "Adam", "outer.lr": c.outer_lr,
            "outer.beta1": hp["b1"], "outer.beta2": hp["b2"],
            "outer.eps": hp["eps"]}
  return {"outer.class": "SGD", "outer.lr": c.outer_lr,
          "outer.momentum": c.outer_momentum,
          "outer.nesterov": bool(c.outer_momentum)}


def _torch_optimizer(options: dict, prefix: str, params: str) -> str:
  """``torch.optim.X(params, lr=..., ...)`` from the options."""
  kind = options[prefix + "class"]
  args = [params, f"lr={options[prefix + 'lr']!r}"]
  if prefix + "beta1" in options:
    args.append(f"betas=({options[prefix + 'beta1']!r}, "
                f"{options[prefix + 'beta2']!r})")
    args.append(f"eps={options[prefix + 'eps']!r}")
  for name in ("weight_decay", "momentum", "nesterov"):
    if prefix + name in options:
      args.append(f"{name}={options[prefix + name]!r}")
  return f"torch.optim.{kind}({', '.join(args)})"


def _torchft_render(v: View, options: dict) -> str:
  c, o = v.c, options
  lines = _header(v, TORCHFT, "#") + [
      f"# Run {c.workers} replica groups (torchft_lighthouse --min_replicas "
      f"{c.workers}); each calls build() and trains inside its context.",
      "import torch", "import torchft", "from torchft.local_sgd import "
      "DiLoCo, LocalSGD", "", "",
      "def build(model, model_fragments, pg, load_state_dict, state_dict):",
      '  """The manager, the inner optimizer and the wrapper to train in."""',
      f"  manager = torchft.Manager(pg=pg, load_state_dict=load_state_dict, "
      f"state_dict=state_dict, min_replica_size={o['Manager.min_replica_size']}"
      f", use_async_quorum={o['Manager.use_async_quorum']})"]
  if "inner.class" in o:
    lines.append("  inner = " + _torch_optimizer(o, "inner.",
                                                 "model.parameters()"))
  else:
    lines.append("  inner = ...  # lowbw's inner optimizer has no torch "
                 "counterpart here")
  lines += _torchft_wrapper(c, o)
  return "\n".join(lines) + "\n"


def _torchft_wrapper(c, o: dict) -> list:
  clip = o.get("clip_grad_norm_.max_norm")
  note = ([f"  # before each inner step: torch.nn.utils.clip_grad_norm_("
           f"model.parameters(), max_norm={clip!r})"] if clip else [])
  if c.strategy == "ddp":
    return note + ["  model = torchft.DistributedDataParallel(manager, model)",
                   "  return manager, inner, model"]
  if c.strategy == "fedavg":
    return note + [f"  wrapper = LocalSGD(manager, model, inner, "
                   f"sync_every={o['LocalSGD.sync_every']})",
                   "  return manager, inner, wrapper"]
  fragments = o.get("fragments", 1)
  outer = _torch_optimizer(o, "outer.", "f.parameters()")
  extra = "".join(f", {k.split('.')[1]}={o[k]!r}" for k in (
      "DiLoCo.fragment_sync_delay", "DiLoCo.fragment_update_alpha") if k in o)
  return note + [
      f"  assert len(model_fragments) == {fragments}  # one module per "
      "fragment",
      f"  outer = [{outer} for f in model_fragments]",
      f"  wrapper = DiLoCo(manager, model_fragments, inner, outer, "
      f"sync_every={o['DiLoCo.sync_every']}{extra})",
      "  return manager, inner, wrapper"]


def _header(v: View, source: Source, mark: str) -> list:
  return [f"{mark} lowbw {v.c.strategy}, exported for {source.project} "
          f"{source.version}.",
          f"{mark} Option names as defined in {', '.join(source.files)}.",
          f"{mark} Settings that do not transfer: the table lowbw export "
          "printed (with --out, also in FILE.not-transferred.md)."]


def _show(value) -> str:
  return "none" if value is None else str(value).replace("|", "\\|")


class Target(NamedTuple):
  """A trainer: the strategies it runs, the mapping (a ``View`` -> options,
  the settings used, rows), the text it reads, and why its own settings do
  not transfer where the general reasons say too little."""

  strategies: tuple
  mapping: Callable
  render: Callable
  notes: dict


_FP8 = ("pseudo-gradients go at full precision, or as fp8 with "
        "should_quantize (not set: it is not this codec); lowbw's codecs "
        "and error feedback have no counterpart")
_TITAN_NOTES = {
    "compression": "torchtitan's " + _FP8,
    "pattern": "torchtitan splits the model with its model's fragment_fn "
               "or fault_tolerance.module_fqns_per_model_fragment",
}
_MAXTEXT_NOTES = {
    "compression": "MaxText sends pseudo-gradients at full precision; "
                   "lowbw's codecs and error feedback have no counterpart",
    "latency": "the simulated clock's link latency; MaxText's "
               "dcn_bandwidth_latency is the tc queue's limit, not a delay",
    "bandwidth": "MaxText throttles one egress rate per VM "
                 "(dcn_bandwidth_limit): a download rate beside "
                 "upload_bandwidth, or one rate per worker, does not transfer",
}
_TORCHFT_NOTES = {
    "compression": "torchft's " + _FP8,
    "pattern": "torchft syncs the modules given as model_fragments: split "
               "the model yourself",
    "schedule": "torchft takes the inner optimizer as built: add the "
                "learning-rate schedule in your loop (torch.optim.lr_"
                "scheduler)",
    "warmup_steps": "torchft takes the inner optimizer as built: add the "
                    "warm-up in your loop",
    "min_lr_ratio": "torchft takes the inner optimizer as built: add the "
                    "schedule in your loop",
}


NAMES = {"torchtitan": "torchtitan", "maxtext": "MaxText",
         "torchft": "torchft"}
TARGETS = {
    "torchtitan": Target(("ddp", "fedavg", "diloco", "streaming_diloco"),
                         _titan, _titan_render, _TITAN_NOTES),
    "maxtext": Target(("ddp", "fedavg", "diloco", "streaming_diloco"),
                      _maxtext,
                      _maxtext_render, _MAXTEXT_NOTES),
    "torchft": Target(("ddp", "fedavg", "diloco", "fedadam",
                       "streaming_diloco"), _torchft, _torchft_render,
                      _TORCHFT_NOTES),
}


def add_parser(subparsers) -> None:
  p = subparsers.add_parser(
      "export", help="write a run's configuration for torchtitan, MaxText "
      "or torchft",
      description="Write the configuration a production trainer reads for "
      "a lowbw config or run: torchtitan (a TOML job config, v0.2.2), "
      "MaxText (YAML overrides of its base.yml) or torchft (a Python snippet "
      "building its DiLoCo or LocalSGD). DiLoCo's H, outer and inner "
      "optimizers and workers, Streaming DiLoCo's fragments, delay and "
      "alpha, and a link's bandwidth where the target can throttle it carry "
      "over; a table of every setting that does not (codecs, simulated "
      "faults and stragglers, lowbw-only settings) is printed and written "
      "beside the output (docs/export.md).")
  p.add_argument("source", metavar="CONFIG_OR_RUN", help="a lowbw config "
                 "file (YAML, TOML, JSON) or a lowbw train --out folder")
  p.add_argument("--to", required=True, choices=tuple(TARGETS),
                 help="the trainer to write for")
  p.add_argument("--out", metavar="FILE", help="write the configuration "
                 "here and the table of what does not transfer to "
                 "FILE.not-transferred.md (default: the configuration on "
                 "stdout, the table on stderr)")
  p.set_defaults(run=run)


def run(args) -> int:
  result = export(load(args.source), args.to)
  table = result.table()
  if not args.out:
    sys.stdout.write(result.text)
    sys.stderr.write("\n" + table)
    return 0
  beside = args.out + ".not-transferred.md"
  for path, text in ((args.out, result.text), (beside, table)):
    with open(path, "w") as f:
      f.write(text)
  print(table)
  print(f"wrote {args.out} and {beside}")
  return 0

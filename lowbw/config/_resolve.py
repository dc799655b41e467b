"""A run's settings -> the objects ``lowbw.build`` takes (model, data,
strategy, network) and which settings the chosen options use."""

import math
import os
import re

from lowbw import _validate
from lowbw import data as data_lib
from lowbw.data import _images, _prepared
from lowbw import models as models_lib
from lowbw.models import _stages
from lowbw import network as network_lib
from lowbw import strategies as strategies_lib
from lowbw import transforms
from lowbw.config import _fields
from lowbw.config import _strategy_fields as strategy_fields
from lowbw.strategies._optim import USES
from lowbw.network import _trace
from lowbw.network._units import link_values

def used_by() -> dict[str, dict[str, set[str]]]:
  """Owner kind -> choice -> the settings only that choice uses (read at
  each call: a strategy registered at run time is included)."""
  return {
      **_fields.USED_BY,
      "strategy": strategy_fields.used_by(),
      "inner": {kind: set(names) for kind, names in USES.items()},
      "outer": strategy_fields.outer_uses(),
      "schedule": {"cosine": {"min_lr_ratio"}, "constant": set()},
      # A network object given from Python (it replaces the network's
      # settings, ``used``).
      "network": {"object": {"network"}, "settings": set()},
  }


# The settings that describe the network (``network``: the object instead).
NETWORK_SETTINGS = {f.name for f in _fields.RUN_FIELDS
                    if f.group == _fields.NETWORK_GROUP
                    and f.name != "network"}


def owned_by_strategy(s: dict) -> set[str]:
  """The settings the chosen strategy reads."""
  return used_by()["strategy"].get(choices(s)["strategy"], set())


def _owned(table) -> set[str]:
  return {name for options in table.values() for names in options.values()
          for name in names}


def data_kind(s: dict) -> str:
  """"text", "folder", "prepared", "tokens", "classification" or "object" (a
  ``DataSource`` given directly), from the settings alone."""
  data = s["data"]
  if not isinstance(data, str):
    return "object"
  if data == "text":
    return "text"
  if data == "digits":
    return "classification"
  # Said here, first: the kind guessed for a missing path would otherwise
  # pick the model, whose flags then fail before the data is read.
  _check_exists(data)
  if not (os.path.isfile(data) or os.path.isdir(data)):
    raise _validate.fail("data", data, "is not a regular file or folder (a "
                         "device, pipe or socket)")
  if data.endswith(".npz"):
    return "classification"
  if os.path.isdir(data):
    with os.scandir(data) as entries:
      if next(entries, None) is None:
        raise _validate.fail("data", data, "is an empty folder; expected "
                             "text files, a prepared corpus or images in it")
    if _images.image_kind(data):
      return "classification"
    return "prepared" if _prepared.is_prepared(data) else "folder"
  return "tokens" if data.endswith(".bin") else "classification"


def model_name(s: dict) -> str:
  """The model the settings train: the given name, the strategy's language
  model (SPES: moe_gpt), gpt for text, mlp for classification."""
  if s["model"] is not None:
    return (s["model"] if isinstance(s["model"], str) else
            f"<{type(s['model']).__name__} object>")
  if data_kind(s) == "object":
    lm = s["data"].task == "lm"
  else:
    lm = data_kind(s) != "classification"
  if not lm:
    return "mlp"
  if not isinstance(s["strategy"], str):
    return "gpt"
  return strategy_fields.spec_of(s).model or "gpt"


def choices(s: dict) -> dict:
  """Owner kind -> the option these settings choose."""
  return {"strategy": s["strategy"] if isinstance(s["strategy"], str)
          else f"<{type(s['strategy']).__name__} object>", "inner": s["inner"],
          "outer": s["outer"], "model": model_name(s),
          "data": data_kind(s), "sharding": s["sharding"],
          "topology": s["topology"], "mitigation": s["mitigation"],
          "schedule": s["schedule"],
          "network": "settings" if s.get("network") is None else "object"}


def used(s: dict) -> set[str]:
  """The settings the run reads: every setting no choice owns, and those
  the chosen options use."""
  chosen, table = choices(s), used_by()
  out = (set(s) - _owned(table)) | set().union(*(
      options.get(chosen[kind], set()) for kind, options in table.items()))
  if uncompressed(s.get("codec")):  # compress says what a codec encodes
    out.discard("compress")
  if s.get("network") is not None:  # the object, not the settings
    out -= NETWORK_SETTINGS
  return out


def uncompressed(codec) -> bool:
  """No codec: None or a spec such as 'none' (one for every setting that
  takes a codec spec: codec, lanes' codec=..., boundary codecs)."""
  return codec is None or (isinstance(codec, str) and
                           codec.strip().lower() in transforms.UNCOMPRESSED)


def check_used(s: dict, explicit) -> None:
  """Raises for an explicitly given setting that the chosen run ignores."""
  if "compress" in explicit and uncompressed(s["codec"]) and (
      "compress" in owned_by_strategy(s)):
    raise _validate.fail("compress", s["compress"],
                         "says what codec encodes; give a codec")
  if s["sharding"] in ("dirichlet", "source") and data_kind(s) in (
      "text", "folder", "tokens"):
    raise _validate.fail("sharding", s["sharding"], "needs labelled "
                         "(classification) data or a corpus made by `lowbw "
                         "data prepare` (it records sources); this text has "
                         "neither: expected iid or contiguous")
  chosen, table = choices(s), used_by()
  if s.get("network") is not None:
    for name in sorted(set(explicit) & NETWORK_SETTINGS):
      raise _validate.fail(name, s[name], "not used: the network is given as "
                           "an object (network=...); set it there")
  if s.get("network") is None and s.get("clock") is False:
    for name in sorted(set(explicit) & NETWORK_SETTINGS - {"clock"}):
      raise _validate.fail(name, s[name], "not used: with clock=False the "
                           "run has no network (no simulated clock, no "
                           "stragglers or faults); drop it or give "
                           "clock=True")
  for name in sorted(set(explicit) - used(s)):
    owners = [kind for kind, options in table.items()
              if any(name in names for names in options.values())]
    raise _validate.fail(
        name, s[name], "not used by " + ", ".join(
            f"strategy {chosen['strategy']!r} (it has no outer optimizer)"
            if kind == "outer" and chosen[kind] is None else
            f"{kind} {_named(s, kind, chosen)!r}" for kind in owners))


def _named(s: dict, kind: str, chosen: dict) -> str:
  """The chosen option as the user gave it: the data by its name ('digits',
  'd.npz'), not by the kind of data it is, which they never wrote."""
  if kind == "network" and chosen[kind] == "object":
    return f"<{type(s['network']).__name__} object>"
  if kind != "data":
    return chosen[kind]
  data = s["data"]
  return data if isinstance(data, str) else f"<{type(data).__name__} object>"


def ints(field, text):
  try:
    values = tuple(int(v) for v in str(text).split(",") if v.strip())
  except ValueError:
    values = ()
  if not values or min(values) < 1:
    raise _validate.fail(field, text,
                         "expected positive integers, comma-separated")
  return values


def _check_exists(data: str) -> None:
  if data not in ("text", "digits") and not os.path.exists(data):
    raise _validate.fail("data", data, "no such file or folder; expected "
                         "text, digits, a folder, an .npz file or a .bin "
                         "token file")


def build_data(s: dict):
  """The settings' dataset; a bad file is reported under ``data``."""
  if not isinstance(s["data"], str):  # a DataSource, checked by Config
    return s["data"]
  _check_exists(s["data"])
  try:
    return _build_data(s)
  except _validate.ConfigError as e:
    if e.field in ("data", "data_root", "sharding", "alpha", "seq_len"):
      raise
    allowed = e.allowed if e.field in ("path", "root") else str(e)
    raise _validate.fail("data", s["data"], allowed) from None


def _build_data(s: dict):
  name = s["data"]
  common = {"sharding": s["sharding"]}
  labelled = ({**common, "alpha": s["alpha"]} if s["sharding"] == "dirichlet"
              else common)
  if name == "text":
    return data_lib.text_bytes(seq_len=s["seq_len"], root=s["data_root"],
                               **common)
  if name == "digits":
    return data_lib.digits(**labelled)
  kind = _images.image_kind(name)
  if kind is not None:  # MNIST and Fashion-MNIST share their file names
    return (data_lib.mnist if kind == "mnist" else data_lib.cifar10)(
        name, **labelled)
  if _prepared.is_prepared(name):
    return data_lib.prepared(name, seq_len=s["seq_len"], **labelled)
  if os.path.isdir(name):
    return data_lib.text_bytes(seq_len=s["seq_len"], root=name, **common)
  if name.endswith(".npz"):
    return data_lib.arrays(name, **labelled)
  if name.endswith(".bin"):
    return data_lib.token_file(name, seq_len=s["seq_len"], **common)
  raise _validate.fail("data", name, "expected text, digits, a folder, an "
                       ".npz file or a .bin token file")


# The GPT's block options, as settings and as models.gpt's keywords.
GPT_BLOCK = tuple(models_lib.GPT_OPTIONS)


def build_model(s: dict, source):
  if s["model"] is not None and not isinstance(s["model"], str):
    return s["model"]
  name = model_name(s)
  if name in ("gpt", "moe_gpt"):
    shape = dict(layers=s["layers"], d_model=s["d_model"], heads=s["heads"],
                 seq_len=s["seq_len"], vocab=max(256, source.vocab_size or 0))
    if name == "gpt":
      return staged(models_lib.gpt(**shape, **{k: s[k] for k in GPT_BLOCK}),
                    s)
    return staged(models_lib.moe_gpt(**shape, num_experts=s["experts"],
                                     top_k=s["top_k"],
                                     expert_hidden=s["expert_hidden"]), s)
  num_classes = getattr(source, "num_classes", None) or 10
  if name == "mlp":
    return models_lib.mlp(hidden=ints("hidden", s["hidden"]),
                          num_classes=num_classes)
  if name == "cnn":
    return models_lib.cnn(channels=ints("channels", s["channels"]),
                          num_classes=num_classes)
  return models_lib.get(name)  # raises the registry's error


def staged(model, s: dict):
  """``model`` as a pipeline of ``stages`` stages with codecs at their
  boundaries (``models.split``), or as it is for one stage."""
  stages = _validate.positive_int("stages", s["stages"])
  if stages == 1:
    _one_stage(s)
    return model
  split = models_lib.split(model, stages)
  codecs = _boundary_codecs(s, stages)
  compressed = any(c is not None for c in codecs[0] + codecs[1])
  micro = micro_batches(s)
  mixed = pipeline_workers(s)
  active = (None if mixed is None else
            transforms.pipeline_worker(mixed, s["workers"]))
  return models_lib.staged_model(
      split, transforms.stage_boundary(*codecs, active=active)
      if compressed else None,
      # Without codecs the micro-batches' mean is the batch's loss: the
      # batch goes through whole (and pools under DDP).
      micro if compressed and not s["minibatch_size"] else 1)


def pipeline_workers(s: dict) -> tuple | None:
  """The workers that are pipelines in a mixed fleet, sorted (None: every
  worker, or ``pipeline_workers`` naming them all)."""
  workers = transforms.parse_pipeline_workers(s.get("pipeline_workers"),
                                              s["workers"])
  if workers is None or len(workers) == s["workers"]:
    return None
  return workers


def _one_stage(s: dict) -> None:
  """Refuses the settings of a pipeline given to one stage."""
  forward = s["boundary_codec"] or "none"
  backward = s["boundary_grad_codec"] or forward
  for field, spec in (("boundary_codec", forward),
                      ("boundary_grad_codec", backward)):
    if not uncompressed(spec):
      raise _validate.fail(field, spec, "needs stages >= 2 (a boundary "
                           "between two pipeline stages)")
  for field in ("pipeline_schedule", "stage_bandwidth", "stage_latency",
                "stage_bandwidth_trace", "pipeline_workers"):
    if s.get(field) is not None:
      raise _validate.fail(field, s[field], "needs stages >= 2 (a pipeline)")
  if s["micro_batches"] != 1:
    raise _validate.fail("micro_batches", s["micro_batches"],
                         "needs stages >= 2 (a pipeline); expected 1")


def _boundary_codecs(s: dict, stages: int) -> list:
  """``[forward, backward]``: each boundary's codec (None: as it is)."""
  forward = s["boundary_codec"] or "none"
  backward = s["boundary_grad_codec"] or forward
  return [[transforms.parse_boundary_codec(spec, field, i)
           for i in range(stages - 1)]
          for field, spec in (("boundary_codec", forward),
                              ("boundary_grad_codec", backward))]


def micro_batches(s: dict) -> int:
  """M: ``micro_batches``, checked against the batch; with
  ``minibatch_size`` (which must then leave M at 1), its micro-batches."""
  m = _validate.positive_int("micro_batches", s["micro_batches"])
  batch = s["batch_size"]
  if s["minibatch_size"]:
    if m != 1:
      raise _validate.fail("micro_batches", m, "expected 1 with "
                           f"minibatch_size={s['minibatch_size']}, whose "
                           "micro-batches the pipeline runs")
    return batch // s["minibatch_size"]
  if batch % m:
    raise _validate.fail("micro_batches", m, f"must divide batch_size="
                         f"{batch} (equal micro-batches)")
  return m


def pipeline(s: dict, model) -> "network_lib.Pipeline | None":
  """What the clock needs of each worker's pipeline (``network.Pipeline``),
  or None for a model of one stage (or one lowbw did not split)."""
  if not isinstance(s["model"], (str, type(None))) or model_name(s) not in (
      "gpt", "moe_gpt"):
    return None
  stages = _validate.positive_int("stages", s["stages"])
  if stages == 1:
    return None
  if s.get("network") is None and s.get("clock") is False:
    for field in ("pipeline_schedule", "stage_bandwidth", "stage_latency",
                  "stage_bandwidth_trace"):
      if s[field] is not None:
        raise _validate.fail(field, s[field], "not used: with clock=False "
                             "the run has no simulated clock to time the "
                             "pipeline on; drop it or give clock=True")
  m = micro_batches(s)
  codecs = _boundary_codecs(s, stages)
  config = model.config
  shape = (s["batch_size"] // m, config["seq_len"], config["d_model"])
  sent = [transforms.boundary_bytes(f, b, shape) for f, b in zip(*codecs)]
  traces = _hop_traces(s, stages)
  return network_lib.Pipeline(
      stage_flops=_stages.stage_flops(model, stages),
      micro_batches=m, schedule=s["pipeline_schedule"] or "1f1b",
      forward_bytes=tuple(f for f, _ in sent),
      backward_bytes=tuple(b for _, b in sent),
      workers=pipeline_workers(s),
      bandwidth=tuple(t.values[0][0] for t in traces) if traces else _hops(
          s, "stage_bandwidth", stages, network_lib.bandwidth, math.inf),
      latency=_hops(s, "stage_latency", stages, network_lib.duration, 0.0),
      bandwidth_trace=traces)


def _hop_traces(s: dict, stages: int) -> tuple:
  """Per hop, the ``Trace`` of its bandwidth from ``stage_bandwidth_trace``
  (one file for every hop, or one per hop); empty without one."""
  field = "stage_bandwidth_trace"
  if s[field] is None:
    return ()
  if s["stage_bandwidth"] is not None:
    raise _validate.fail(field, s[field], "give the stage links' bandwidth "
                         "as stage_bandwidth or as a trace, not both")
  paths = link_values(s[field])
  if len(paths) not in (1, stages - 1):
    raise _validate.fail(field, s[field], f"expected one trace file for "
                         f"every hop or one per hop, {stages - 1} "
                         f"(stages={stages}); {len(paths)} given")
  traces = []
  for path in paths:
    t = _trace.trace(path, field, _trace.bandwidth)
    if t.columns != 1:
      raise _validate.fail(field, path, f"the trace has {t.columns} values "
                           "per row; expected one, the hop's bandwidth "
                           "(rows time,bandwidth)")
    traces.append(t)
  return tuple(traces) * (stages - 1 if len(traces) == 1 else 1)


def _hops(s: dict, field: str, stages: int, parse, free: float) -> tuple:
  """One value per hop from a setting: one for all, or S - 1 of them."""
  if s[field] is None:
    return (free,) * (stages - 1)
  values = [parse(v, field) for v in link_values(s[field])]
  if len(values) == 1:
    return tuple(values) * (stages - 1)
  if len(values) != stages - 1:
    raise _validate.fail(field, s[field], f"expected one value for every "
                         f"hop or one per hop, {stages - 1} (stages={stages})")
  return tuple(values)


def build_strategy(s: dict):
  if not isinstance(s["strategy"], str):
    if not isinstance(s["strategy"], strategies_lib.Strategy):
      raise _validate.fail("strategy", s["strategy"], "expected a lowbw."
                           "strategies.Strategy or a registered name")
    return s["strategy"]
  return strategy_fields.build(s)


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
  fault_settings = ("drop_prob", "message_loss", "failures", "windows",
                    "byzantine", "joins")
  if any(s[k] is not None for k in fault_settings):
    faults = network_lib.Faults(
        drop_prob=s["drop_prob"] or 0.0, message_loss=s["message_loss"] or 0.0,
        failures=_pairs("failures", s["failures"], r"(\d+)@(\d+)", 2)
        if s["failures"] else (),
        windows=_pairs("windows", s["windows"], r"(\d+):(\d+)-(\d+)", 3)
        if s["windows"] else (),
        byzantine=s["byzantine"] or (), byzantine_kind=s["byzantine_kind"],
        byzantine_scale=s["byzantine_scale"],
        joins=_pairs("joins", s["joins"], r"(\d+)@(\d+)", 2)
        if s["joins"] else (), leave_shards=s["leave_shards"])
  overlap = s["overlap"]
  if not isinstance(overlap, bool):
    raise _validate.fail("overlap", overlap, "expected true or false")
  return network_lib.network(
      s["bandwidth"], s["latency"], topology=s["topology"],
      group_size=s["group_size"] if s["topology"] == "hierarchical" else None,
      regional_bandwidth=s["regional_bandwidth"],
      regional_latency=s["regional_latency"], hardware=s["hardware"],
      mfu=s["mfu"], speeds=s["speeds"], stragglers=stragglers, faults=faults,
      overlap=overlap, clock_params=s["clock_params"],
      bandwidth_trace=s["bandwidth_trace"], profile=s["network_profile"],
      upload_bandwidth=s["upload_bandwidth"])


def default_eval_every(period: int, steps: int | None = None) -> int:
  """The first multiple of the period H at or after 100 steps, or at or
  after a tenth of a shorter run (``steps``), so that a run shows about ten
  evaluations (a curve), not one or two."""
  every = 100 if steps is None else min(100, -(-steps // 10))
  return period * -(-every // period)


# How the workers compute (devices, precision, memory) and what runs beside
# them (the paired DDP lane), not what they train: what ``lowbw bench``
# takes besides the model, the strategy and the sizes.
COMPUTE_SETTINGS = ("devices", "worker_dtype", "worker_batch",
                    "memory_budget", "minibatch_size", "autocast",
                    "correlation_every", "shadow")

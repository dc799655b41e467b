"""Every setting of a run, once: its name, default, type, help and kind.

``lowbw.Config`` is made from this table and the strategies' specs
(``_strategy_fields``); ``lowbw train``'s flags, their help, the config-file
keys and ``lowbw.study``'s grid names all read it. A new run option is one
``Field`` here plus the code that uses it.

Kinds say what changing a value costs:

* ``shape``: a new compiled program (W, H, a codec's size, the model's size);
* ``traced``: a value of the compiled program (learning rates, momentum,
  bandwidth): runs that differ only so share one program (``knob`` names the
  traced hyperparameter, ``lowbw.simulation``'s ``hparams``);
* ``run``: neither (the seed, where the logs go).
"""

import argparse
import collections.abc
import inspect
from typing import Any, NamedTuple

from lowbw import _validate
from lowbw import models as models_lib
from lowbw import network as network_lib
from lowbw import transforms as transforms_lib
from lowbw.network._units import link_values
from lowbw.config import _checks, _defaults, _resources
from lowbw.telemetry import _cost

SHAPE, TRACED, RUN = "shape", "traced", "run"


class Field(NamedTuple):
  """One setting.

  Attributes:
    name: the setting's name: the ``Config`` attribute, the config-file key
      and (with ``-`` for ``_``) the flag.
    default: used when the setting is not given (None: unset; the run's own
      default, which the help says).
    kind: ``shape``, ``traced`` or ``run`` (see the module docstring).
    group: the ``--help`` section.
    help: one line for ``--help`` and the docs (without the default).
    type: the parser of a flag's text (int, float, str, bool for on/off, or
      a function); its ``config_types`` say what a file may give.
    choices: the allowed values, when there is a fixed set.
    knob: for traced settings, the hyperparameter ``Simulator.run`` takes.
    unit: what the number counts, for the docs ("steps", "bit/s", ...);
      a bare number given to a setting with units is in this unit.
    many: the text is a comma-separated list ("64,64", "1Gbps,100Mbps"):
      a list or tuple of values is accepted too, and joined.
    check: for a setting of ``lowbw.build`` (what a compiled simulator is
      specialised to), its rule (``_checks``): ``check(name, value,
      settings, strategy)`` returns the value the build uses; the build's
      settings are these fields, checked in this table's order.
    python: the setting takes a Python object only (a ``Network``): no
      flag, no file key.
    clock_only: the setting changes only the simulated clock, never the
      training nor the bytes (on a network without stragglers or faults):
      a study re-times a point that differs from another only in such
      settings (``studies._run``), and ``lowbw retime`` takes them.
    repeat: the setting is a list of names, its flag this word given once
      per item (``--lane no_faults --lane codec=none``).
  """

  name: str
  default: Any
  kind: str
  group: str
  help: str
  type: Any = str
  choices: tuple = ()
  knob: str | None = None
  unit: str = ""
  many: bool = False
  check: Any = None
  python: bool = False
  clock_only: bool = False
  repeat: str = ""

  @property
  def flag(self) -> str:
    return "--" + (self.repeat or self.name).replace("_", "-")


def quantity(parse, field: str):
  """The type of a setting with units ("50ms", "100Mbps"): the text, checked
  by ``parse(text, field)`` (which names the accepted forms); a config file
  gives it as a string too, never a bare number."""

  def check(text):
    parse(text, field)  # a ConfigError names what is accepted
    return text

  check.config_types = (str,)
  check.parse = parse
  return check


def _each(parse):
  """``parse`` for one value or a comma-separated list of them, one per
  worker (or region): ``"1Gbps,100Mbps"``."""

  def parse_list(value, field):
    return [parse(v, field) for v in link_values(value)]

  return parse_list


def _count(field):
  check = quantity(network_lib.count, field)
  check.config_types = (int, float, str)
  return check


def _boundary_codec(text, field):
  return transforms_lib.parse_boundary_codec(text, field)


def _pipeline_workers_type():
  """``pipeline_workers``: a count (int or digits) or worker indices (text
  with a comma); checked against the workers at build."""

  def check(value):
    transforms_lib.parse_pipeline_workers(value, None)
    return value

  check.config_types = (int, str)
  return check


def _hardware(text, field):
  return network_lib.hardware(text)


def _profile(text, field):
  return network_lib.profile(text)


def _profile_type():
  check = quantity(_profile, "network_profile")
  check.config_types = (str, dict)  # a name, a file, or a table of terms
  return check


def _budget(text, field):
  return _resources.check_budget(text)



def _memory_budget():
  check = quantity(_budget, "memory_budget")
  check.config_types = (int, float, str)  # a bare number counts bytes
  return check


def _group_size(text: str) -> str:
  """``worker_batch``: kept as given ("auto", "all" or digits; checked at
  build); a config file may give an integer."""
  return text


_group_size.config_types = (int, str)

_CAP_MIB = _resources.CPU_ACTIVATION_CAP // 2 ** 20
_CALIBRATED = network_lib.profile("calibrated")
_STRAGGLERS = network_lib.Stragglers._field_defaults


def _net(name):
  """The network's own default for ``name`` (``lowbw.network.network``)."""
  return inspect.signature(network_lib.network).parameters[name].default


def _gpt(name: str, text: str) -> "Field":
  """A GPT block option: its default and choices are ``models.gpt``'s."""
  default = models_lib.GPT_OPTIONS[name]
  if isinstance(default, bool):
    return Field(name, default, SHAPE, _M, text, bool)
  return Field(name, default, SHAPE, _M, text,
               choices=tuple(sorted(models_lib.GPT_CHOICES[name])))


def text_value(field: "Field", text: str):
  """A value written as text (a grid's or a lane's), typed as its setting:
  '10' for H is 10; 'none' is None for a number; true/false for a flag."""
  text = text.strip()
  if field.type in (int, float) and text.lower() in ("none", "null"):
    return None
  if field.type is bool:
    if text.lower() not in ("true", "false"):
      raise _validate.fail(field.name, text, "expected true or false")
    return text.lower() == "true"
  if field.type in (int, float):
    try:
      return field.type(text)
    except ValueError:
      raise _validate.fail(field.name, text, "expected " + (
          "an integer" if field.type is int else "a number")) from None
  return text


class _Registered(collections.abc.Sequence):
  """Choices read from a registry when they are checked, so that a name
  registered after import (``lowbw.models.register`` in a notebook) is
  one a config file may use."""

  def __init__(self, names):
    self.names = names

  def __getitem__(self, i):
    return self.names()[i]

  def __len__(self):
    return len(self.names())


NETWORK_GROUP = "network (the simulated clock, sim_time_s)"
_M, _D, _N, _R, _C, _H = ("model and data", "devices and hosts",
                          NETWORK_GROUP, "run", "compute", "strategy")

RUN_FIELDS = (
    Field("workers", _defaults.NUM_WORKERS, SHAPE, _H,
          "number of simulated workers W", int, unit="workers",
          check=_checks.positive),
    # -- model and data
    Field("model", None, SHAPE, _M, "default: gpt for text, moe_gpt for "
          "strategy spes, mlp for classification",
          choices=_Registered(models_lib.model_names)),
    Field("layers", 2, SHAPE, _M, "gpt, moe_gpt: transformer blocks", int),
    Field("d_model", 128, SHAPE, _M, "gpt, moe_gpt: width", int),
    Field("heads", 4, SHAPE, _M, "gpt, moe_gpt: attention heads", int),
    _gpt("norm", "gpt: normalisation layer"),
    _gpt("mlp", "gpt: feed-forward block (swiglu: LLaMA's gated SiLU)"),
    _gpt("position", "gpt: positions as a learned table or rotary "
         "embeddings (RoPE)"),
    _gpt("qk_norm", "gpt: RMSNorm of each head's queries and keys"),
    _gpt("tie_embeddings", "gpt: the output layer is the token embedding, "
         "transposed"),
    _gpt("norm_position", "gpt: normalise each sub-layer's input (pre) or "
         "the residual sum after it (post)"),
    Field("stages", 1, SHAPE, _M,
          "gpt, moe_gpt: pipeline stages of each worker's "
          "model, its blocks split evenly; each worker's loss runs through "
          "the stages and their boundary codecs, and the clock times its "
          "schedule (docs/pipelines.md)", int, unit="stages"),
    Field("boundary_codec", "none", SHAPE, _M,
          "gpt, moe_gpt with stages > 1: codec "
          "of the activations sent forward at each stage boundary: a codec "
          "spec, or subspace:R first (a fixed rank-R basis per boundary)",
          quantity(_boundary_codec, "boundary_codec")),
    Field("boundary_grad_codec", None, SHAPE, _M,
          "gpt, moe_gpt with stages > 1: "
          "codec of the activation gradients sent back at each boundary "
          "(default: the boundary codec)",
          quantity(_boundary_codec, "boundary_grad_codec")),
    Field("pipeline_workers", None, SHAPE, _M,
          "gpt, moe_gpt with stages > 1: the "
          "workers that are pipelines, in a mixed fleet: a count N (the "
          "first N) or comma-separated indices (0,2; one index: 3,); the "
          "others train the whole model, without boundary codecs (default: "
          "every worker; docs/pipelines.md)", _pipeline_workers_type()),
    Field("micro_batches", 1, SHAPE, _M, "gpt, moe_gpt with stages > 1: micro-"
          "batches M each worker's batch is split into, each crossing the "
          "boundary codecs on its own (must divide batch_size)", int,
          unit="micro-batches"),
    Field("pipeline_schedule", None, SHAPE, _M,
          "gpt, moe_gpt with stages > 1: the "
          "order each stage runs its micro-batches' forwards and backwards "
          "in, on the simulated clock (default 1f1b)",
          choices=network_lib.PIPELINE_SCHEDULES),
    Field("stage_bandwidth", None, SHAPE, _M,
          "gpt, moe_gpt with stages > 1: the "
          "link of each stage-to-stage hop, e.g. 1Gbps; or one per hop, "
          "comma-separated (default: free, infinite bandwidth)",
          quantity(_each(network_lib.bandwidth), "stage_bandwidth"),
          unit="bit/s", many=True, clock_only=True),
    Field("stage_latency", None, SHAPE, _M,
          "gpt, moe_gpt with stages > 1: one-way "
          "latency of each stage-to-stage hop, e.g. 5ms; or one per hop, "
          "comma-separated (default 0)",
          quantity(_each(network_lib.duration), "stage_latency"),
          unit="s", many=True, clock_only=True),
    Field("stage_bandwidth_trace", None, SHAPE, _M,
          "gpt, moe_gpt with stages > 1: "
          "a CSV file of a stage-to-stage hop's bandwidth over simulated "
          "time (rows time,bandwidth; a trace, as bandwidth_trace), for "
          "every hop; or one per hop, comma-separated (it replaces "
          "stage_bandwidth)", many=True),
    Field("experts", 8, SHAPE, _M, "moe_gpt: experts E", int),
    Field("top_k", 2, SHAPE, _M, "moe_gpt: experts per token", int),
    Field("expert_hidden", 256, SHAPE, _M,
          "moe_gpt: SwiGLU width of each expert", int),
    Field("seq_len", 128, SHAPE, _M, "gpt context and text window", int,
          unit="tokens"),
    Field("hidden", "64", SHAPE, _M, "mlp hidden sizes, comma-separated", many=True),
    Field("channels", "16,32", SHAPE, _M, "cnn channels, comma-separated", many=True),
    Field("data", "text", SHAPE, _M, "text | digits | PATH (a folder made "
          "by `lowbw data prepare`, an MNIST, Fashion-MNIST or CIFAR-10 "
          "folder, .npz arrays, .bin uint16 tokens, or a folder of text "
          "files); text: the Python standard library's sources"),
    Field("data_root", None, SHAPE, _M, "folder of text files for data text"),
    Field("sharding", "iid", SHAPE, _M, "how examples are split over workers",
          choices=("contiguous", "dirichlet", "iid", "source")),
    Field("alpha", 0.5, SHAPE, _M, "dirichlet concentration", float),
    # -- network
    Field("bandwidth", _net("bandwidth"), TRACED, _N,
          "each worker's link, e.g. 100Mbps, 1Gbps; or one per worker, "
          "comma-separated (a ring step waits for its slowest hop)",
          quantity(_each(network_lib.bandwidth), "bandwidth"),
          knob="bandwidth", unit="bit/s", many=True, clock_only=True),
    Field("upload_bandwidth", _net("upload_bandwidth"), SHAPE, _N,
          "each worker's upload rate where it differs from bandwidth, which "
          "is then its download rate (an asymmetric link, e.g. 1Gbps down "
          "and 50Mbps up); or one per worker, comma-separated",
          quantity(_each(network_lib.bandwidth), "upload_bandwidth"),
          unit="bit/s", many=True, clock_only=True),
    Field("latency", _net("latency"), TRACED, _N,
          "one-way latency per message hop, e.g. 50ms; or one per worker, "
          "comma-separated",
          quantity(_each(network_lib.duration), "latency"), knob="latency",
          unit="s", many=True, clock_only=True),
    Field("topology", _net("topology"), SHAPE, _N,
          "the collectives' algorithm",
          choices=("hierarchical", "parameter_server", "ring")),
    Field("group_size", None, SHAPE, _N, "hierarchical: workers per region "
          "(on the regional links)", int),
    Field("regional_bandwidth", _net("regional_bandwidth"), SHAPE, _N,
          "hierarchical: the links inside a region (or one per region, "
          "comma-separated)",
          quantity(_each(network_lib.bandwidth), "regional_bandwidth"),
          unit="bit/s", many=True, clock_only=True),
    Field("regional_latency", _net("regional_latency"), SHAPE, _N,
          "hierarchical: one-way latency inside a region",
          quantity(_each(network_lib.duration), "regional_latency"),
          unit="s", many=True, clock_only=True),
    Field("hardware", _net("hardware"), SHAPE, _N,
          "per worker: a preset (" + ", ".join(sorted(network_lib.PRESETS))
          + "), a peak such as 312TFLOPS, or a time per step such as 0.5s",
          quantity(_hardware, "hardware"), clock_only=True),
    Field("mfu", _net("mfu"), SHAPE, _N, "model-FLOP utilisation", float,
          clock_only=True),
    Field("speeds", _net("speeds"), SHAPE, _N, "per-worker speed "
          "multipliers, comma-separated (one per worker; 0.5 = half as "
          "fast), or a CSV file of them over simulated time (a trace)",
          many=True, clock_only=True),
    Field("bandwidth_trace", None, SHAPE, _N, "a CSV file of each worker's "
          "bandwidth over simulated time (a trace; it replaces bandwidth)"),
    Field("clock_params", _net("clock_params"), SHAPE, _N,
          "time compute and messages as if the model had this many "
          "parameters, e.g. 1B or 350M (FLOPs and bytes scaled from the "
          "model's; the bytes logged stay the model's)",
          _count("clock_params"), clock_only=True),
    Field("clock", True, SHAPE, _N, "simulate the clock (sim_time_s); "
          "--no-clock: bytes and losses only", bool),
    Field("network_profile", "calibrated", SHAPE, _N, "what real links and "
          "collectives cost beyond latency + bytes / bandwidth: "
          "'calibrated' (measured on real runs: link efficiency by "
          f"bandwidth, {_CALIBRATED.per_call_s * 1e3:.2f} ms per collective "
          f"call, {_CALIBRATED.startup_s:.2f} s to set up the first; see "
          "docs/calibration.md), 'ideal' (none of it), or a YAML file of a "
          "profile (lowbw calibrate writes one); in a config file also a "
          "table of its terms",
          _profile_type(), clock_only=True),
    Field("network", None, SHAPE, _N, "a lowbw.network.Network object "
          "(links, topology, hardware, stragglers, faults) in place of the "
          "network settings (bandwidth, latency, ...); default: the network "
          "they describe (none with clock=False)", object, python=True,
          check=_checks.network),
    Field("overlap", _net("overlap"), SHAPE, _N, "overlap sync "
          "communication with the next round's compute (Streaming DiLoCo's "
          "schedule)", bool, clock_only=True),
    Field("jitter", None, TRACED, _N, "stragglers: lognormal sigma of every "
          "step's time (default none)", float, knob="jitter"),
    Field("mitigation", "none", SHAPE, _N, "stragglers",
          choices=("backup", "none", "threshold")),
    Field("keep_fraction", _STRAGGLERS["fraction"], SHAPE, _N, "threshold: "
          "fraction of the workers aggregated, fastest first", float),
    Field("backups", _STRAGGLERS["backups"], SHAPE, _N, "backup: spare "
          "workers, the slowest dropped each round", int),
    Field("drop_prob", None, TRACED, _N, "faults: probability a worker is "
          "down for a round", float, knob="drop_prob"),
    Field("message_loss", None, TRACED, _N, "faults: probability a worker's "
          "message is lost", float, knob="message_loss"),
    Field("failures", None, SHAPE, _N, "faults: permanent failures, "
          "WORKER@STEP,... e.g. 3@500", many=True),
    Field("windows", None, SHAPE, _N, "faults: down windows, "
          "WORKER:START-END,... e.g. 1:100-200", many=True),
    Field("joins", None, SHAPE, _N, "faults: workers joining late, "
          "WORKER@STEP,... e.g. 3@500 (absent before; they download the "
          "global state when they join)", many=True),
    Field("leave_shards", "drop", SHAPE, _N, "faults: the data of a worker "
          "that failed for good: dropped, or redistributed to the others",
          choices=("drop", "redistribute")),
    Field("byzantine", None, SHAPE, _N, "faults: Byzantine workers, "
          "comma-separated indices (their pseudo-gradients corrupted at "
          "every sync; DiLoCo family)", many=True),
    Field("byzantine_kind", "sign_flip", SHAPE, _N, "faults: how a "
          "Byzantine worker corrupts its pseudo-gradient",
          choices=("random", "scale", "sign_flip")),
    Field("byzantine_scale", 10.0, SHAPE, _N, "faults: the factor of "
          "byzantine_kind scale", float),
    # -- run
    Field("steps", _defaults.STEPS, SHAPE, _R, "inner steps per worker", int,
          unit="steps",
          check=_checks.steps),
    Field("batch_size", _defaults.BATCH_SIZE, SHAPE, _R,
          "examples per worker and step", int, unit="examples",
          check=_checks.positive),
    Field("seed", 0, RUN, _R, "seeds initialisation, sharding, sampling and "
          "the strategy's keys", int),
    Field("eval_every", None, SHAPE, _R, "a multiple of H (default: the "
          "first multiple of H >= 100, or >= steps/10 when that is less)", int, unit="steps",
          check=_checks.every_period),
    Field("log_every", None, SHAPE, _R, "default: the power of two giving "
          "200 to 400 rows", int, unit="steps",
          check=_checks.optional_positive),
    Field("init_from", None, RUN, _R, "start every worker (and the DDP "
          "lane) from this finished run's final parameters (its "
          "params.npz), e.g. DiLoCo from a DDP warm-up; optimizer states "
          "start fresh"),
    Field("checkpoint_every", None, RUN, _R, "save a checkpoint every N "
          "steps", int, unit="steps"),
    Field("eval_examples", None, SHAPE, _R, "held-out examples per "
          "evaluation", int,
          check=_checks.optional_positive),
    Field("eval_local", False, SHAPE, _R, "also evaluate every worker's own "
          "parameters (eval_local_loss: their mean; eval_local_loss_std: the "
          "spread)", bool,
          check=_checks.boolean),
    Field("shadow", None, SHAPE, _R, "train a paired DDP lane in the same "
          "program: one replica with the inner optimizer on the union of the "
          "workers' batches, from the same start (shadow_eval_loss; "
          "shadow_gap = eval_loss / shadow_eval_loss - 1); snoo: the same "
          "replica with an outer Nesterov step every H steps (SNOO, arXiv "
          "2510.15830: how much of a gain is the outer step's); costs one "
          "more replica's compute", choices=_checks.SHADOWS,
          check=_checks.shadow),
    Field("lanes", None, SHAPE, _R, "counterfactual lanes: copies of the "
          "run in the same program, on the same batches, initialisation and "
          "keys, each with one cause removed or changed: no_faults, "
          "no_stragglers, no_byzantine, codec=SPEC (codec=none: "
          "uncompressed), SETTING=VALUE (one of the strategy's settings at "
          "another value, e.g. quorum=4), ddp (the method replaced by DDP); "
          "each logs lane/NAME/eval_loss and "
          "lane/NAME/sim_time_s, the summary each cause's cost; each costs "
          "about one more run's state and compute (docs/lanes.md)",
          repeat="lane"),
    Field("wandb_project", None, RUN, _R, "also log to this Weights & Biases "
          "project (pip install 'lowbw[wandb]'; WANDB_MODE=offline needs no "
          "network)"),
    Field("correlation_every", None, SHAPE, _R, "log worker_correlation, the "
          "workers' mean pairwise parameter correlation, every N steps (a "
          "multiple of H)", int, unit="steps",
          check=_checks.every_period),
    Field("out", None, RUN, _R, "log folder (lowbw train's default: "
          "runs/<time>-<strategy>; from Python, none unless given); one "
          "holding another run is refused unless --overwrite"),
    Field("progress", None, RUN, _R, "progress bar (default: on a terminal)",
          bool),
    Field("fail_on_divergence", False, RUN, _R, "fail (exit code 3, after "
          "writing the logs) when the loss ends far above its start or the "
          "accuracy at or below chance; by default a warning says so", bool),
    Field("allow_non_finite", False, RUN, _R, "keep a run whose final "
          "model, final evaluation or simulated time is NaN or infinite "
          "(a warning); by default it fails (exit code 3, after writing the "
          "logs)", bool),
    Field("gpu_price", None, RUN, _R, "dollars per GPU-hour: the summary "
          "adds compute_cost_usd = gpu_hours x this (gpu_hours = workers x "
          "sim_time_s / 3600) and cost_usd", _cost.price_type("gpu_price"),
          unit="$/GPU-hour"),
    Field("egress_price", None, RUN, _R, "dollars per GB sent over the "
          "network: the summary adds traffic_cost_usd = traffic_gb x this "
          "(traffic_gb = sent_bytes / 1e9) and cost_usd",
          _cost.price_type("egress_price"), unit="$/GB"),
    # -- compute
    Field("rounds_per_chunk", None, SHAPE, _R, "rounds per compiled call "
          "(default: about 1/25 of the run; the same results for any value)",
          int, unit="rounds", check=_checks.rounds_per_chunk),
    Field("minibatch_size", None, SHAPE, _C, "gradient accumulation: compute "
          "each worker's batch in micro-batches of this size (must divide "
          "batch_size; the same gradient, one micro-batch's activations in "
          "memory); default the batch", int,
          check=_checks.minibatch_size),
    Field("autocast", None, SHAPE, _C, "run forward and backward passes in "
          "this type, with float32 parameters, gradients and optimizer state "
          "(mixed precision); default float32",
          choices=tuple(_checks.AUTOCAST),
          check=_checks.autocast),
    # -- devices
    Field("devices", None, SHAPE, _D, "spread the workers over N devices "
          "(must divide workers); default: on CPU, one device per core when "
          "the workers are kept apart (not DDP's one replica), else 1; all "
          "devices of a multi-process run", int,
          check=_checks.devices),
    Field("worker_dtype", None, SHAPE, _D, "bfloat16: keep every worker's "
          "parameters and optimizer state in bf16 (half the memory); default "
          "float32",
          check=_checks.worker_dtype),
    Field("worker_batch", "auto", SHAPE, _D, "compute the inner steps of "
          "this many workers at a time (memory for activations and gradients "
          "of one group only; diloco, muloco, fedavg); 'all': every worker "
          "at once; 'auto': all at once while their activations fit "
          f"{_CAP_MIB} MiB (CPU; a quarter of the budget on a GPU) and the "
          "memory budget", _group_size,
          check=_checks.worker_batch),
    Field("memory_budget", None, SHAPE, _D, "memory the run may use: '8GB', "
          "'512MiB' or a share of free memory, '60%' (default 80% of free "
          "memory); a run estimated to need more is refused before compiling",
          _memory_budget(), check=_checks.memory_budget),
    # Checked last: it depends on the network, devices and worker_batch.
    Field("clients", None, SHAPE, _H, "a population of M clients (M >= "
          "workers) sharing the data, of which the workers are a fresh "
          "sample every round, each starting from the global model "
          "(fedavg, diloco, fedadam; docs/clients.md); default: every "
          "worker is a client of its own", int, unit="clients",
          check=_checks.clients),
    Field("availability", None, SHAPE, _H, "with clients: a CSV trace of "
          "0 and 1, one row per client and one column per round of a "
          "repeating period; each round draws its workers among the "
          "clients available (docs/clients.md); default: every client "
          "every round", check=_checks.availability),
)

# Settings that only some choices use: choice kind -> choice -> settings.
# Giving one that the run ignores is an error rather than a silent no-op.
USED_BY = {
    "model": {"gpt": {"layers", "d_model", "heads", "seq_len",
                      *models_lib.GPT_OPTIONS, "stages", "boundary_codec",
                      "boundary_grad_codec", "micro_batches",
                      "pipeline_workers",
                      "pipeline_schedule", "stage_bandwidth",
                      "stage_latency", "stage_bandwidth_trace"},
              "moe_gpt": {"layers", "d_model", "heads", "seq_len", "experts",
                          "top_k", "expert_hidden", "stages",
                          "boundary_codec", "boundary_grad_codec",
                          "micro_batches", "pipeline_workers",
                          "pipeline_schedule", "stage_bandwidth",
                          "stage_latency", "stage_bandwidth_trace"},
              "mlp": {"hidden"},
              "cnn": {"channels"}},
    "data": {"text": {"data_root", "seq_len"}, "tokens": {"seq_len"},
             "folder": {"seq_len"}, "prepared": {"seq_len"},
             "classification": set()},
    "sharding": {"dirichlet": {"alpha"}, "iid": set(), "contiguous": set(),
                 "source": set()},
    "topology": {"hierarchical": {"group_size", "regional_bandwidth",
                                  "regional_latency"},
                 "ring": set(), "parameter_server": set()},
    "mitigation": {"threshold": {"keep_fraction"}, "backup": {"backups"},
                   "none": set()},
}


def flag_kwargs(field: Field) -> dict:
  """``add_argument`` keywords of ``field``'s flag (its help with the
  default)."""
  default = ("" if field.default in (None, False) or "default" in field.help
             else " (default on)" if field.default is True else
             f" (default {field.default})")
  help = (field.help + default).replace("%", "%%")
  if field.type is bool:
    return dict(action=argparse.BooleanOptionalAction, help=help)
  if field.repeat:
    return dict(action="append", dest=field.name, metavar="NAME",
                help=help + " (repeat the flag for several)")
  kwargs = dict(help=help)
  if field.choices:
    kwargs["choices"] = field.choices
  elif field.type is not str:
    kwargs["type"] = field.type
  return kwargs

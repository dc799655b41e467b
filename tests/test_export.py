"""``lowbw export``: each emitted option is one the target documents, and its
value maps back to the lowbw setting it came from.

The documented names below were read in each target's own sources at the
version named beside them (the same versions ``lowbw.cli._export`` cites);
the inverse mappings are written here, by hand, from those sources' meaning
of each option, not taken from the exporter.
"""

import ast
import inspect
import json
import os
import re
import sys
import tomllib
import types

import pytest
import yaml

import lowbw
from lowbw import cli, network
from lowbw.cli import _export

# pytorch/torchtitan v0.2.2 (73a0e6979dd10b6b1904098eb3c8f62c18ab87ce):
# torchtitan/config/job_config.py (JobConfig's sections) and, for the
# semi-synchronous keys, torchtitan/components/ft/config/job_config.py.
TORCHTITAN_KEYS = {
    "job": {"config_file", "dump_folder", "description", "print_config",
            "save_config_file", "custom_config_module"},
    "optimizer": {"name", "lr", "beta1", "beta2", "eps", "weight_decay",
                  "implementation", "early_step_in_backward"},
    "lr_scheduler": {"warmup_steps", "total_steps", "decay_ratio",
                     "decay_type", "min_lr_factor"},
    "training": {"dataset", "dataset_path", "local_batch_size",
                 "global_batch_size", "seq_len", "max_norm", "steps",
                 "enable_cpu_offload", "dtype", "mixed_precision_param",
                 "mixed_precision_reduce", "gc_freq", "gc_debug"},
    "fault_tolerance": {"enable", "process_group", "process_group_timeout_ms",
                        "replica_id", "group_size", "min_replica_size",
                        "semi_sync_method", "sync_steps", "should_quantize",
                        "fragment_sync_delay", "fragment_update_alpha",
                        "module_fqns_per_model_fragment", "num_fragments"},
}
# Values the same files (and components/ft/manager.py,
# components/optimizer.py, components/lr_scheduler.py) accept.
TORCHTITAN_CHOICES = {
    ("fault_tolerance", "semi_sync_method"): {"diloco", "local_sgd"},
    ("optimizer", "name"): {"Adam", "AdamW"},
    ("lr_scheduler", "decay_type"): {"linear", "sqrt", "cosine"},
}

# AI-Hypercomputer/maxtext e591f30cbbf217ed67ef71263ec0538239f9c3b8:
# src/maxtext/configs/base.yml (and its types.py).
MAXTEXT_KEYS = {
    "enable_diloco", "diloco_sync_period", "diloco_outer_lr",
    "diloco_outer_momentum", "dcn_bandwidth_limit", "dcn_bandwidth_burst",
    "dcn_bandwidth_latency", "dcn_bandwidth_interface",
    "enable_streaming_diloco", "num_diloco_fragments",
    "use_sequential_layers", "num_communication_overlapping_steps",
    "communication_overlapping_alpha", "dcn_diloco_parallelism",
    "ici_diloco_parallelism", "dcn_data_parallelism",
    "gradient_clipping_threshold", "opt_type", "learning_rate",
    "lr_schedule_type", "learning_rate_final_fraction",
    "warmup_steps_fraction", "adam_b1", "adam_b2", "adam_eps",
    "adam_weight_decay", "steps", "learning_rate_schedule_steps",
}
MAXTEXT_CHOICES = {"opt_type": {"adamw", "adam_pax", "sgd", "muon"},
                   "lr_schedule_type": {"cosine", "wsd"}}


# pytorch/torchft 73dafea422116b2a713542719c8454efe5444c6c: the signatures
# of torchft/local_sgd.py (DiLoCo, LocalSGD), torchft/manager.py (Manager)
# and torchft/ddp.py (DistributedDataParallel), and torch.optim's; a stub
# binds each call of the snippet to them, so a wrong name fails.
def _diloco(manager, model_fragments, inner_optimizer, outer_optimizer,
            sync_every, backup_device=None, pin_memory=True,
            use_bucketization=False, bucket_cap_mb=None,
            should_quantize=False, fragment_sync_delay=0,
            fragment_update_alpha=0.0): ...


def _local_sgd(manager, model, optimizer, sync_every): ...


def _manager(pg, load_state_dict, state_dict, min_replica_size,
             use_async_quorum=True, timeout=None, quorum_timeout=None,
             connect_timeout=None, rank=None, world_size=None,
             world_size_mode=None, store_addr=None, store_port=None,
             lighthouse_addr=None, replica_id=None, port=None,
             hostname=None, heartbeat_interval=None): ...


def _ddp(manager, module): ...


def _sgd(params, lr=1e-3, momentum=0, dampening=0, weight_decay=0,
         nesterov=False): ...


def _adam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
          amsgrad=False): ...


TORCHFT_SIGNATURES = {"DiLoCo": _diloco, "LocalSGD": _local_sgd,
                      "Manager": _manager, "DistributedDataParallel": _ddp,
                      "SGD": _sgd, "Adam": _adam, "AdamW": _adam}

STREAMING = dict(strategy="streaming_diloco", workers=4, H=40, fragments=4,
                 delay=3, merge_alpha=0.3, inner_lr=1e-3, weight_decay=0.05,
                 b1=0.8, outer_lr=0.6, outer_momentum=0.8, steps=120,
                 bandwidth="100Mbps", pattern="sequential")
DILOCO = dict(strategy="diloco", workers=3, H=25, inner_lr=2e-3,
              outer_lr=0.5, outer_momentum=0.7, max_norm=0.5,
              warmup_steps=10, schedule="cosine", min_lr_ratio=0.1,
              steps=100, bandwidth="10Gbps")


def _config(**settings):
  return lowbw.Config(**settings)


def _inner(c):
  """The inner AdamW's hyperparameters as lowbw resolves them (optax's
  b2 and eps where the config leaves them)."""
  return {"lr": c.inner_lr, "b1": c.b1 if c.b1 is not None else 0.9,
          "b2": c.b2 if c.b2 is not None else 0.999,
          "eps": c.eps if c.eps is not None else 1e-8,
          "weight_decay": c.weight_decay}


# torchtitan


def _titan(text):
  toml = tomllib.loads(text)
  for section, entries in toml.items():
    assert section in TORCHTITAN_KEYS, section
    for name, value in entries.items():
      assert name in TORCHTITAN_KEYS[section], f"[{section}] {name}"
      allowed = TORCHTITAN_CHOICES.get((section, name))
      assert allowed is None or value in allowed, (section, name, value)
  return toml


@pytest.mark.parametrize("settings", [STREAMING, DILOCO],
                         ids=["streaming_diloco", "diloco"])
def test_torchtitan_names_are_documented_and_values_map_back(settings):
  c = _config(**settings)
  t = _titan(_export.export(c, "torchtitan").text)
  ft, opt, sched = t["fault_tolerance"], t["optimizer"], t["lr_scheduler"]
  assert ft["enable"] and ft["semi_sync_method"] == "diloco"
  assert (ft["group_size"], ft["min_replica_size"]) == (c.workers,) * 2
  assert ft["sync_steps"] == c.H
  assert t["job"]["custom_config_module"] == (
      "torchtitan.components.ft.config")
  fragments = ft.get("num_fragments", 1)
  assert fragments == (c.fragments if c.strategy == "streaming_diloco"
                       else 1)
  if fragments > 1:
    assert ft["fragment_sync_delay"] == c.delay
    assert ft["fragment_update_alpha"] == c.merge_alpha
  want = _inner(c)
  assert opt["name"] == "AdamW" and opt["lr"] == want["lr"]
  assert (opt["beta1"], opt["beta2"], opt["eps"], opt["weight_decay"]) == (
      want["b1"], want["b2"], want["eps"], want["weight_decay"])
  assert sched["warmup_steps"] == c.warmup_steps
  assert t["training"]["steps"] == c.steps
  if c.schedule == "cosine":
    assert (sched["decay_type"], sched["min_lr_factor"]) == (
        "cosine", c.min_lr_ratio)
  else:  # a decay from 1x to 1x: constant after the warm-up
    assert sched["min_lr_factor"] == 1.0
  assert t["training"].get("max_norm") == c.max_norm


def test_torchtitan_fixed_outer_optimizer_is_in_the_table():
  e = _export.export(_config(**DILOCO), "torchtitan")
  rows = {r.setting: r for r in e.rows}
  # torchtitan builds SGD(lr=0.7, momentum=0.9, nesterov=True) in code.
  assert rows["outer_lr"].value == 0.5 and "0.7" in rows["outer_lr"].why
  assert rows["outer_momentum"].value == 0.7
  default = _export.export(_config(strategy="diloco"), "torchtitan")
  assert not {"outer", "outer_lr", "outer_momentum"} & {
      r.setting for r in default.rows}


def test_torchtitan_ddp_and_fedavg():
  ddp = _titan(_export.export(_config(strategy="ddp", workers=5),
                              "torchtitan").text)
  assert "semi_sync_method" not in ddp["fault_tolerance"]
  assert ddp["fault_tolerance"]["group_size"] == 5
  fedavg = _titan(_export.export(_config(strategy="fedavg", H=7),
                                 "torchtitan").text)
  assert fedavg["fault_tolerance"]["semi_sync_method"] == "local_sgd"
  assert fedavg["fault_tolerance"]["sync_steps"] == 7


# MaxText


def _tc_bits(rate):
  """Bits per second of a Linux tc rate (``100mbit``)."""
  number, unit = re.fullmatch(r"(\d+)([kmg]?)bit", rate).groups()
  return int(number) * {"": 1, "k": 1e3, "m": 1e6, "g": 1e9}[unit]


def _maxtext(text):
  overrides = yaml.safe_load(text)
  for name, value in overrides.items():
    assert name in MAXTEXT_KEYS, name
    assert value in MAXTEXT_CHOICES.get(name, {value}), (name, value)
  line = next(l for l in text.splitlines() if "on the command line:" in l)
  pairs = dict(w.split("=", 1) for w in line.split(": ", 1)[1].split())
  assert set(pairs) == set(overrides)  # the same overrides, key=value
  return overrides


@pytest.mark.parametrize("settings", [STREAMING, DILOCO],
                         ids=["streaming_diloco", "diloco"])
def test_maxtext_names_are_documented_and_values_map_back(settings):
  c = _config(**settings)
  m = _maxtext(_export.export(c, "maxtext").text)
  assert m["enable_diloco"] and m["dcn_diloco_parallelism"] == c.workers
  assert m["diloco_sync_period"] == c.H
  assert (m["diloco_outer_lr"], m["diloco_outer_momentum"]) == (
      c.outer_lr, c.outer_momentum)
  streaming = c.strategy == "streaming_diloco"
  assert m.get("enable_streaming_diloco", False) == streaming
  if streaming:
    assert m["num_diloco_fragments"] == c.fragments
    assert m["num_communication_overlapping_steps"] == c.delay
    assert m["communication_overlapping_alpha"] == c.merge_alpha
    assert m["use_sequential_layers"] == (c.pattern == "sequential")
  want = _inner(c)
  assert (m["opt_type"], m["learning_rate"]) == ("adamw", want["lr"])
  assert (m["adam_b1"], m["adam_b2"], m["adam_eps"],
          m["adam_weight_decay"]) == (want["b1"], want["b2"], want["eps"],
                                      want["weight_decay"])
  assert m["steps"] == c.steps
  assert m["warmup_steps_fraction"] * c.steps == pytest.approx(
      c.warmup_steps)
  final = c.min_lr_ratio if c.schedule == "cosine" else 1.0
  assert m["learning_rate_final_fraction"] == final
  assert m["gradient_clipping_threshold"] == (c.max_norm or 0.0)  # 0: off
  assert _tc_bits(m["dcn_bandwidth_limit"]) == network.bandwidth(c.bandwidth)


def test_maxtext_ddp_fedavg_and_upload_rate():
  ddp = _maxtext(_export.export(_config(strategy="ddp", workers=6),
                                "maxtext").text)
  assert ddp["dcn_data_parallelism"] == 6 and "enable_diloco" not in ddp
  fedavg = _maxtext(_export.export(_config(strategy="fedavg", H=9),
                                   "maxtext").text)
  # FedAvg is DiLoCo whose outer step is plain SGD at lr 1.
  assert (fedavg["diloco_outer_lr"], fedavg["diloco_outer_momentum"],
          fedavg["diloco_sync_period"]) == (1.0, 0.0, 9)
  e = _export.export(_config(strategy="diloco", bandwidth="1Gbps",
                             upload_bandwidth="50Mbps"), "maxtext")
  assert _tc_bits(yaml.safe_load(e.text)["dcn_bandwidth_limit"]) == 50e6
  assert {r.setting for r in e.rows} >= {"bandwidth", "latency"}


# torchft


class _Stub:
  """A torch/torchft class that binds its arguments to the documented
  signature and records them."""

  calls: list = []

  def __init__(self, name):
    self.name = name

  def __call__(self, *args, **kwargs):
    bound = inspect.signature(TORCHFT_SIGNATURES[self.name]).bind(
        *args, **kwargs)
    _Stub.calls.append((self.name, dict(bound.arguments)))
    return types.SimpleNamespace(kind=self.name)


class _Module:
  def __init__(self, n):
    self.n = n

  def parameters(self):
    return [f"p{self.n}"]


def _run_torchft(text, fragments, monkeypatch):
  """Runs the snippet with stub torch and torchft; the calls it made."""
  torch = types.ModuleType("torch")
  torch.optim = types.SimpleNamespace(**{n: _Stub(n) for n in (
      "SGD", "Adam", "AdamW")})
  torchft = types.ModuleType("torchft")
  torchft.Manager = _Stub("Manager")
  torchft.DistributedDataParallel = _Stub("DistributedDataParallel")
  local_sgd = types.ModuleType("torchft.local_sgd")
  local_sgd.DiLoCo, local_sgd.LocalSGD = _Stub("DiLoCo"), _Stub("LocalSGD")
  for name, module in (("torch", torch), ("torchft", torchft),
                       ("torchft.local_sgd", local_sgd)):
    monkeypatch.setitem(sys.modules, name, module)
  _Stub.calls = []
  namespace = {}
  exec(compile(text, "<export>", "exec"), namespace)
  parts = [_Module(i) for i in range(fragments)]
  namespace["build"](_Module(-1), parts, "pg", None, None)
  calls = {}
  for name, arguments in _Stub.calls:
    calls.setdefault(name, []).append(arguments)
  return calls


@pytest.mark.parametrize("settings", [STREAMING, DILOCO],
                         ids=["streaming_diloco", "diloco"])
def test_torchft_snippet_binds_to_the_signatures_and_maps_back(
    settings, monkeypatch):
  c = _config(**settings)
  text = _export.export(c, "torchft").text
  ast.parse(text)
  fragments = c.fragments if c.strategy == "streaming_diloco" else 1
  calls = _run_torchft(text, fragments, monkeypatch)
  manager, = calls["Manager"]
  assert manager["min_replica_size"] == c.workers
  assert manager["use_async_quorum"] is False  # DiLoCo's synchronous quorum
  diloco, = calls["DiLoCo"]
  assert diloco["sync_every"] == c.H
  assert len(diloco["model_fragments"]) == fragments
  assert diloco.get("fragment_sync_delay", 0) == (
      c.delay if fragments > 1 else 0)
  assert diloco.get("fragment_update_alpha", 0.0) == (
      c.merge_alpha if fragments > 1 else 0.0)
  inner, = calls["AdamW"]
  want = _inner(c)
  assert (inner["lr"], inner["betas"], inner["eps"],
          inner["weight_decay"]) == (want["lr"], (want["b1"], want["b2"]),
                                     want["eps"], want["weight_decay"])
  outers = calls["SGD"]
  assert len(outers) == fragments == len(diloco["outer_optimizer"])
  for outer in outers:
    assert (outer["lr"], outer["momentum"], outer["nesterov"]) == (
        c.outer_lr, c.outer_momentum, True)


def test_torchft_fedadam_fedavg_and_ddp(monkeypatch):
  c = _config(strategy="fedadam", H=12)
  calls = _run_torchft(_export.export(c, "torchft").text, 1, monkeypatch)
  adam, = calls["Adam"]
  assert (adam["lr"], adam["betas"], adam["eps"]) == (
      c.outer_lr, (c.outer_b1 or 0.9, c.outer_b2), c.outer_eps)
  calls = _run_torchft(_export.export(_config(strategy="fedavg", H=6),
                                      "torchft").text, 1, monkeypatch)
  assert calls["LocalSGD"][0]["sync_every"] == 6 and "DiLoCo" not in calls
  calls = _run_torchft(_export.export(_config(strategy="ddp", workers=2),
                                      "torchft").text, 1, monkeypatch)
  assert "DistributedDataParallel" in calls
  assert calls["Manager"][0]["use_async_quorum"] is True


# What does not transfer, errors, the command.


@pytest.mark.parametrize("target", list(_export.TARGETS))
def test_settings_that_do_not_transfer_are_listed(target):
  c = _config(strategy="diloco", codec="topk:0.1", ef=0.9,
              failures="1@50", drop_prob=0.1, steps=100)
  e = _export.export(c, target)
  rows = {r.setting: r for r in e.rows}
  assert rows["codec"].value == "topk:0.1" and rows["ef"].value == 0.9
  assert rows["failures"].value == "1@50" and rows["drop_prob"].value == 0.1
  assert "latency" in rows and "model, data" in rows
  mapped = {"H", "workers", "inner_lr", "outer_lr"}
  assert not mapped & set(rows), "a mapped setting is also in the table"
  table = e.table()
  assert "| codec | topk:0.1 |" in table and "| failures | 1@50 |" in table
  plain = _export.export(_config(strategy="diloco"), target)
  assert "codec" not in {r.setting for r in plain.rows}


def test_streaming_codec_and_pattern_do_not_transfer_to_torch_targets():
  c = _config(strategy="streaming_diloco")  # its paper's 4-bit codec
  for target in ("torchtitan", "torchft"):
    rows = {r.setting for r in _export.export(c, target).rows}
    assert {"codec", "pattern"} <= rows, target
  assert "pattern" not in {r.setting for r in
                           _export.export(c, "maxtext").rows}


@pytest.mark.parametrize("target", list(_export.TARGETS))
def test_a_strategy_the_target_lacks_is_an_error_naming_the_supported(
    target):
  with pytest.raises(ValueError) as e:
    _export.export(_config(strategy="sparta"), target)
  assert e.value.field == "strategy" and e.value.value == "sparta"
  for name in _export.TARGETS[target].strategies:
    assert name in e.value.allowed


def test_unknown_target_and_missing_file(tmp_path, capsys):
  path = tmp_path / "run.yaml"
  path.write_text("strategy: diloco\n")
  assert cli.main(["export", str(path), "--to", "megatron"]) == 2
  err = capsys.readouterr().err
  assert "--to='megatron'" in err and "torchtitan" in err and "maxtext" in err
  with pytest.raises(ValueError) as e:
    _export.export(_config(strategy="diloco"), "megatron")
  assert e.value.field == "to"
  assert cli.main(["export", str(tmp_path / "none.yaml"), "--to",
                   "maxtext"]) == 2
  assert "no such file or folder" in capsys.readouterr().err
  (tmp_path / "empty").mkdir()
  assert cli.main(["export", str(tmp_path / "empty"), "--to",
                   "maxtext"]) == 2
  assert "not a run's folder" in capsys.readouterr().err


def test_a_run_folder_is_read_back(tmp_path):
  """A folder's config.yaml (what lowbw train writes), else the settings in
  its config.json."""
  c = _config(**STREAMING)
  with_yaml = tmp_path / "a"
  with_yaml.mkdir()
  c.save(str(with_yaml / "config.yaml"))
  with_json = tmp_path / "b"
  with_json.mkdir()
  (with_json / "config.json").write_text(json.dumps(
      {"metadata": {"train_args": STREAMING}}))
  want = _export.export(c, "torchtitan").text
  for folder in (with_yaml, with_json):
    assert _export.export(_export.load(str(folder)), "torchtitan").text == (
        want)


def test_command_writes_both_files_and_is_deterministic(tmp_path, capsys):
  path = tmp_path / "run.toml"
  path.write_text('strategy = "streaming_diloco"\nH = 20\ncodec = "e3m0"\n')
  out = tmp_path / "job.toml"
  texts = []
  for _ in range(2):
    assert cli.main(["export", str(path), "--to", "torchtitan", "--out",
                     str(out)]) == 0
    texts.append(out.read_text())
  first = texts[0]
  assert texts[1] == first
  printed = capsys.readouterr().out
  beside = tmp_path / "job.toml.not-transferred.md"
  assert beside.read_text() in printed and "| codec | e3m0 |" in printed
  assert first == _export.export(_export.load(str(path)), "torchtitan").text
  assert _titan(first)["fault_tolerance"]["sync_steps"] == 20
  assert cli.main(["export", str(path), "--to", "maxtext"]) == 0
  std = capsys.readouterr()
  assert _maxtext(std.out)["diloco_sync_period"] == 20
  assert "| codec | e3m0 |" in std.err


@pytest.mark.parametrize("target", list(_export.TARGETS))
def test_an_inner_optimizer_the_target_lacks_is_in_the_table(target,
                                                             monkeypatch):
  e = _export.export(_config(strategy="diloco", inner="sgd"), target)
  assert {r.setting: r.value for r in e.rows}["inner"] == "sgd"
  assert "AdamW" not in e.text and "adam_b1" not in e.text
  if target == "torchft":  # the snippet still runs, the optimizer left to you
    assert "DiLoCo" in _run_torchft(e.text, 1, monkeypatch)

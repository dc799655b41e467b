"""``lowbw train``: runs, config files, resume, the default run's settings, errors."""

import csv
import json
import runpy
import sys

import pytest

import lowbw

from lowbw import cli
from lowbw.cli import _train
from lowbw.simulation._api import engine_config

BASE = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
        "--batch-size", "4", "--steps", "10", "--no-progress"]
TINY = BASE + ["--H", "5", "--eval-every", "5"]  # DiLoCo, the default


def steps_logged(out):
  with open(out / "metrics.csv") as f:
    return [int(r["step"]) for r in csv.DictReader(f)]


def test_train_writes_logs_and_prints_a_summary(tmp_path, capsys):
  assert cli.main(TINY + ["--out", str(tmp_path)]) == 0
  printed = capsys.readouterr().out
  assert "final eval loss" in printed and str(tmp_path) in printed
  for name in ("metrics.csv", "config.json", "summary.json", "tensorboard"):
    assert (tmp_path / name).exists()
  config = json.loads((tmp_path / "config.json").read_text())
  assert config["strategy"]["name"] == "diloco" and config["num_workers"] == 2
  assert config["metadata"]["train_args"]["H"] == 5
  assert steps_logged(tmp_path)[-1] == 10
  # Where the start-up went, in the summary and in one printed line.
  summary = json.loads((tmp_path / "summary.json").read_text())
  startup = summary["startup"]
  parts = [startup[k] for k in ("build_s", "initial_state_s", "trace_s",
                                "compile_load_s", "first_row_s")]
  assert all(v >= 0 for v in parts) and startup["first_row_s"] > 0
  assert startup["trace_s"] + startup["compile_load_s"] == pytest.approx(
      summary["compile_s"])
  assert startup["first_row_s"] <= summary["wall_time_s"]
  if startup["first_row_after_start_s"] is not None:  # Linux
    assert startup["first_row_after_start_s"] > (startup["import_s"]
                                                 + sum(parts))
    assert startup["first_step_after_start_s"] == pytest.approx(
        startup["first_row_after_start_s"] - startup["first_row_s"])
    assert startup["first_step_after_start_s"] > (startup["import_s"]
                                                  + sum(parts[:-1]))
    assert "first step" in printed
  assert "start-up          import" in printed and "first chunk" in printed


def test_config_file_with_flags_overriding(tmp_path):
  cfg = tmp_path / "run.toml"
  cfg.write_text('strategy = "sparta"\np = 0.05\nsteps = 6\nworkers = 3\n')
  out = tmp_path / "out"
  assert cli.main(BASE + ["--config", str(cfg), "--steps", "4", "--out",
                          str(out)]) == 0
  config = json.loads((out / "config.json").read_text())
  assert config["strategy"] == {"name": "sparta", "p": 0.05,
                                "selector": "random", "codec": None,
                                "inner": config["strategy"]["inner"]}
  assert config["steps"] == 4  # the flag wins over the file
  assert config["num_workers"] == 2  # TINY's --workers flag wins too


def test_resume_rejects_changed_training_settings(tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(TINY + ["--warmup-steps", "4", "--checkpoint-every", "5",
                          "--out", str(out)]) == 0
  for flags in (["--inner-lr", "0.5"], ["--warmup-steps", "2"],
                ["--schedule", "cosine"]):
    assert cli.main(["train", "--resume", str(out), "--steps", "20",
                     "--no-progress"] + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("lowbw: error: --" + flags[0][2:]) and "resume" in err


def test_resume_continues_with_more_steps(tmp_path):
  out = tmp_path / "run"
  assert cli.main(TINY + ["--checkpoint-every", "5", "--out", str(out)]) == 0
  assert cli.main(["train", "--resume", str(out), "--steps", "20",
                   "--no-progress"]) == 0
  steps = steps_logged(out)
  assert steps[-1] == 20 and steps == sorted(set(steps))
  assert json.loads((out / "config.json").read_text())["steps"] == 20


def test_no_arguments_means_the_documented_default_run():
  config = _train.settings(cli.build_parser().parse_args(["train"]))
  assert config.given == set()
  s = _train.resolved(config)
  record = engine_config(config)
  source, model, strategy = record.data, record.model, record.strategy
  # The default run syncs every 20 steps: 10 rounds, 10 evaluations.
  assert (strategy.name, strategy.period, s["workers"]) == ("diloco", 20, 8)
  assert s["eval_every"] == 20
  assert model.name == "gpt" and source.task == "lm" and source.seq_len == 128
  assert s["steps"] == 200  # about a minute on a 2-core CPU


@pytest.mark.parametrize("argv, start", [
    (["--workers", "0"], "lowbw: error: --workers=0 is invalid"),
    (["--H", "0"], "lowbw: error: --H=0 is invalid"),
    (["--strategy", "sparta", "--p", "1.5"], "lowbw: error: --p=1.5 is invalid"),
    (["--batch-size", "5000"], "lowbw: error: --batch-size=5000"),
    (["--inner", "lion"], "lowbw: error: --inner='lion' is invalid"),
    (["--data", "/no/such.npz"], "lowbw: error: --data='/no/such.npz' is "
     "invalid: no such file"),
    (["--model", "resnet"], "lowbw: error: --model='resnet' is invalid"),
    (["--strategy", "nope"], "lowbw: error: --strategy='nope' is invalid: "
     "expected one of 'ddp'"),
    (["--config", "/no/such.toml"], "lowbw: error: --config="),
    (["--resume", "/no/such/dir"], "lowbw: error: --resume="),
    (["--strategy", "ddp", "--H", "5"], "lowbw: error: --H=5 is invalid: not used"),
    (["--p", "0.1"], "lowbw: error: --p=0.1 is invalid: not used by strategy 'diloco'"),
    (["--layers", "3"], "lowbw: error: --layers=3 is invalid: not used by model 'mlp'"),
    (["--momentum", "0.5"], "lowbw: error: --momentum=0.5 is invalid: not used"),
    (["--data-root", "/tmp"], "lowbw: error: --data-root='/tmp' is invalid: not used"),
    (["--alpha", "0.3"], "lowbw: error: --alpha=0.3 is invalid: not used by sharding"),
    (["--weight-decay", "-1"], "lowbw: error: --weight-decay=-1.0 is invalid"),
    (["--data", "text", "--sharding", "dirichlet"], "lowbw: error: --sharding="),
    (["--warmup-steps", "-1"], "lowbw: error: --warmup-steps=-1 is invalid"),
    (["--schedule", "linear"], "lowbw: error: --schedule='linear' is invalid"),
    (["--outer-momentum", "1.0"], "lowbw: error: --outer-momentum=1.0 is invalid"),
    (["--inner-lr", "0"], "lowbw: error: --inner-lr=0.0 is invalid"),
    (["--codec", "quant:3"], "lowbw: error: --codec='quant:3' is invalid"),
    (["--codec", "quant:4,topk:0.1"], "lowbw: error: --codec='quant:4,topk"),
    (["--ef", "0.9"], "lowbw: error: --ef=0.9 is invalid: needs a codec"),
    (["--codec", "sign", "--ef", "2"], "lowbw: error: --ef=2.0 is invalid"),
    (["--strategy", "sparta", "--ef", "0.5"],
     "lowbw: error: --ef=0.5 is invalid: not used by strategy 'sparta'"),
    (["--sparse-codec", "cast:bf16"], "lowbw: error: --sparse-codec='cast:bf16'"
     " is invalid: not used"),
    (["--strategy", "demo", "--codec", "none"], "lowbw: error: --codec='none'"),
    (["--strategy", "demo", "--decay", "1.0"], "lowbw: error: --decay=1.0"),
    (["--strategy", "fedavg", "--codec", "topk:0.1", "--compress", "grads"],
     "lowbw: error: --compress='grads' is invalid"),
    (["--strategy", "fedavg", "--compress", "deltas"],
     "lowbw: error: --compress='deltas' is invalid: says what codec"),
    (["--strategy", "fedavg", "--H", "5", "--codec", "topk:0.1",
      "--island-size", "1"],
     "lowbw: error: --island-size=1 is invalid"),
    (["--bandwidth", "fast"], "lowbw: error: --bandwidth='fast' is invalid"),
    (["--latency=-5ms"], "lowbw: error: --latency='-5ms' is invalid"),
    (["--topology", "star"], "lowbw: error: --topology='star' is invalid"),
    (["--topology", "hierarchical"], "lowbw: error: --group-size=None"),
    (["--topology", "hierarchical", "--group-size", "3"],
     "lowbw: error: --group-size=3 is invalid: must divide"),
    (["--group-size", "2"], "lowbw: error: --group-size=2 is invalid: not used"),
    (["--hardware", "abacus"], "lowbw: error: --hardware='abacus' is invalid"),
    (["--mfu", "1.5"], "lowbw: error: --mfu=1.5 is invalid"),
    (["--speeds", "1,2,3"], "lowbw: error: --speeds=(1.0, 2.0, 3.0) is invalid"),
    (["--jitter", "-1"], "lowbw: error: --jitter=-1.0 is invalid"),
    (["--mitigation", "vote"], "lowbw: error: --mitigation='vote' is invalid"),
    (["--keep-fraction", "0.5"], "lowbw: error: --keep-fraction=0.5 is invalid: "
     "not used by mitigation 'none'"),
    (["--mitigation", "threshold", "--keep-fraction", "0"],
     "lowbw: error: --keep-fraction=0.0 is invalid"),
    (["--mitigation", "backup", "--backups", "2"],
     "lowbw: error: --backups=2 is invalid: must be below"),
    (["--drop-prob", "2"], "lowbw: error: --drop-prob=2.0 is invalid"),
    (["--message-loss", "-0.1"], "lowbw: error: --message-loss=-0.1 is invalid"),
    (["--failures", "1-5"], "lowbw: error: --failures='1-5' is invalid"),
    (["--failures", "7@5"], "lowbw: error: --failures=7 is invalid"),
    (["--windows", "1:9-3"], "lowbw: error: --windows=(1, 9, 3) is invalid"),
    (["--memory-budget", "8"], "lowbw: error: --memory-budget='8' is invalid: "
     "a number needs its unit, such as '8GB'"),
    (["--latency", "50"], "lowbw: error: --latency='50' is invalid: a number "
     "needs its unit, such as '50ms'"),
    (["--bandwidth", "100"], "lowbw: error: --bandwidth='100' is invalid: a "
     "number needs its unit, such as '100Mbps'"),
    (["--hardware", "100"], "lowbw: error: --hardware='100' is invalid"),
    (["--seed", "99999999999999999999"], "lowbw: error: --seed=999999999999"
     "99999999 is invalid: expected an integer in [0, 2**32)"),
    (["--seed", "-1"], "lowbw: error: --seed=-1 is invalid"),
    (["--steps", "4"], "lowbw: error: --steps=4 is invalid: the strategy "
     "syncs every 5 steps"),
    (["--memory-budget", "10kB"], "lowbw: error: --memory-budget='10 kB' is "
     "invalid: the run needs about"),
    (["--worker-batch", "three"], "lowbw: error: --worker-batch='three' is "
     "invalid"),
    # the trainer options (gradient clipping, schedules and their floor, ...)
    (["--min-lr-ratio", "0.1"], "lowbw: error: --min-lr-ratio=0.1 is invalid: "
     "not used by schedule 'constant'"),
    (["--max-norm", "-1"], "lowbw: error: --max-norm=-1.0 is invalid: "
     "expected a finite number > 0"),
    (["--sparta-interval", "2"], "lowbw: error: --sparta-interval=2 is "
     "invalid: not used by strategy 'diloco'"),
    (["--minibatch-size", "3"], "lowbw: error: --minibatch-size=3 is "
     "invalid: must divide --batch-size=4"),
    (["--correlation-every", "7"], "lowbw: error: --correlation-every=7 is "
     "invalid"),
    (["--aggregation", "reduce_scatter"], "lowbw: error: --aggregation="
     "'reduce_scatter' is invalid: is for payloads that cannot be summed"),
])
def test_errors_are_one_line_and_a_nonzero_exit(argv, start, capsys, tmp_path):
  base = BASE if "--strategy" in argv else TINY
  assert cli.main(base + argv + ["--out", str(tmp_path / "x")]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith(start), err
  assert "\n" not in err and "Traceback" not in err
  assert not (tmp_path / "x").exists()  # nothing written for a bad run


def test_eval_every_defaults_to_a_multiple_of_H(tmp_path):
  out = tmp_path / "run"
  assert cli.main(BASE + ["--H", "3", "--steps", "9", "--out", str(out)]) == 0
  config = json.loads((out / "config.json").read_text())
  # The first multiple of 3 at or after a tenth of the run (0.9 steps).
  assert config["eval_every"] == 3
  # A run longer than 1,000 steps: the first multiple at or after 100.
  import lowbw
  assert lowbw.Config(data="digits", H=3, steps=2000).eval_every == 102
  assert lowbw.Config(data="digits", H=3, steps=400).eval_every == 42


def test_unknown_config_key_is_named(tmp_path, capsys):
  cfg = tmp_path / "bad.json"
  cfg.write_text(json.dumps({"strategy": "ddp", "wokers": 4}))
  assert cli.main(TINY + ["--config", str(cfg)]) == 2
  assert "wokers" in capsys.readouterr().err


def test_console_script_help(monkeypatch, capsys):
  # ``python -m lowbw`` runs lowbw/__main__.py; run here, it spares a
  # process start (a fresh import is test_imports.py's).
  monkeypatch.setattr(sys, "argv", ["lowbw", "train", "--help"])
  with pytest.raises(SystemExit) as done:
    runpy.run_module("lowbw", run_name="__main__", alter_sys=True)
  assert done.value.code == 0 and "--strategy" in capsys.readouterr().out


@pytest.mark.parametrize("text, message", [
    ('steps = "ten"\n', "--steps='ten' is invalid: expected an integer"),
    ("inner_lr = true\n", "--inner-lr=True is invalid: expected a number"),
    ("[strategy]\nname = 'diloco'\nH = ['x']\n",
     "--H=['x'] is invalid: expected a single value, not a list"),
    ("[H]\nname = 4\n", "--H={'name': 4} is invalid: expected a single "
     "value, not a table"),
    ("latency = 50\n", "--latency='50' is invalid: a number needs its "
     "unit, such as '50ms'"),
    ("bandwidth = 100\n", "--bandwidth='100' is invalid: a number needs "
     "its unit, such as '100Mbps'"),
    ("progress = 1\n", "--progress=1 is invalid: expected true or false"),
])
def test_config_values_of_the_wrong_type_are_named(tmp_path, capsys, text,
                                                   message):
  path = tmp_path / "run.toml"
  path.write_text(text)
  assert cli.main(BASE + ["--config", str(path)]) == 2
  err = capsys.readouterr().err
  assert message in err and len(err.strip().splitlines()) == 1


def test_an_internal_type_error_is_a_bug_with_its_traceback(monkeypatch):
  def broken(args):
    raise TypeError("a bug")
  monkeypatch.setattr(lowbw.simulation, "build", lambda *a, **k: broken(a))
  with pytest.raises(TypeError, match="a bug"):
    cli.main(TINY)


def test_version_and_config_types_of_scale_flags(capsys):
  from lowbw import __version__
  assert cli.main(["--version"]) == 0
  assert capsys.readouterr().out.strip() == f"lowbw {__version__}"
  for ok in ({"worker_batch": 2}, {"worker_batch": "auto"},
             {"memory_budget": "8GB"}):
    config = lowbw.Config(data="digits", **ok)
    assert {k: getattr(config, k) for k in ok} == ok
  with pytest.raises(ValueError, match="^worker_batch=2.5 is invalid: "
                     "expected an integer or a string"):
    lowbw.Config(worker_batch=2.5)

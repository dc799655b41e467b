"""Every failure a user meets is one clear line naming the setting; a run
that diverged says so; the first hour has no surprises (structured errors,
the model contract, divergence, YAML configs, suggestions, defaults,
interruption, a short repr)."""

import inspect
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import cli, data, models, strategies
from lowbw.cli import _train
from lowbw.simulation import _loop

_RUN = dict(data=data.digits(), strategy=strategies.diloco(H=5),
            workers=2, batch_size=4, steps=10, progress=False,
            clock=False)
_TINY = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
         "--batch-size", "4", "--steps", "10", "--H", "5", "--eval-every",
         "5", "--no-progress"]


def _err(capsys) -> str:
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1, err
  return err


# --------------------------------------------------------- structured errors
def test_a_bad_value_is_a_config_error_with_its_parts():
  with pytest.raises(lowbw.ConfigError) as info:
    lowbw.simulate(model=models.mlp(hidden=(8,)), **{**_RUN, "workers": 0})
  e = info.value
  assert isinstance(e, ValueError)
  assert (e.field, e.value) == ("workers", 0) and "integer >= 1" in e.allowed


@pytest.mark.parametrize("old, new", [("num_workers", "workers"),
                                      ("log_dir", "out"),
                                      ("error_feedback", "ef")])
def test_an_earlier_spelling_is_refused_with_the_name_to_use(old, new):
  with pytest.raises(lowbw.ConfigError, match=rf"^config='{old}' is invalid: "
                     rf".*did you mean '{new}'\?"):
    lowbw.simulate(model=models.mlp(hidden=(8,)), **{**_RUN, old: 2})


def test_the_cli_names_the_flag_from_the_error_not_its_wording(
    monkeypatch, capsys, tmp_path):
  # Any wording: the flag comes from the error's field.
  def refuse(*args, **kwargs):
    raise lowbw.ConfigError("workers", 3, "a sentence in other words "
                            "about batch_size=4")
  monkeypatch.setattr(lowbw.simulation, "build", refuse)
  assert cli.main(_TINY + ["--out", str(tmp_path / "r")]) == 2
  assert _err(capsys) == ("lowbw: error: --workers=3 is invalid: a sentence in "
                          "other words about --batch-size=4")


def test_the_cli_reads_no_private_argparse_state_nor_error_text():
  source = "".join(open(os.path.join(os.path.dirname(cli.__file__), f)).read()
                   for f in os.listdir(os.path.dirname(cli.__file__))
                   if f.endswith(".py"))
  assert "._actions" not in source and "invalid choice" not in source


@pytest.mark.parametrize("argv, message", [
    # a strategy parameter sharing a run setting's name: its own flag
    (["--strategy", "streaming_diloco", "--H", "4", "--merge-alpha", "2"],
     "lowbw: error: --merge-alpha=2.0 is invalid: expected a number in [0, 1]"),
    (["--sharding", "iidd"], "lowbw: error: --sharding='iidd' is invalid: "
     "expected one of 'contiguous', 'dirichlet', 'iid', 'source' (did you mean "
     "'iid'?)"),
    (["--strategy", "dilocco"], "(did you mean 'diloco'"),
    # letter case aside, as a paper spells the name
    (["--strategy", "DiLoCo"], "(did you mean 'diloco'"),
    (["--workers", "two"], "lowbw: error: --workers='two' is invalid: "
     "expected an integer"),
    (["--lr", "0.01"], "lowbw train: error: unrecognized arguments --lr 0.01 "
     "(did you mean --inner-lr or --outer-lr"),
    # no prefix matching: another tool's flag is not taken for a setting
    (["--device", "mps"], "lowbw train: error: unrecognized arguments "
     "--device mps (did you mean --devices?)"),
    (["--minibatch-size", "3"], "--minibatch-size=3 is invalid: must divide "
     "--batch-size=4"),
    # named as the user gave it, not by its kind ('classification')
    (["--data-root", "nowhere"], "lowbw: error: --data-root='nowhere' is "
     "invalid: not used by data 'digits'"),
    # the settings of the methods of 2025-26
    (["--b2", "1.5"], "lowbw: error: --b2=1.5 is invalid: expected a decay "
     "in [0, 1)"),
    (["--inner", "sgd", "--b1", "0.9"], "lowbw: error: --b1=0.9 is invalid: "
     "not used by inner 'sgd'"),
    (["--outer-momentum-final", "1.0"], "lowbw: error: "
     "--outer-momentum-final=1.0 is invalid: expected a number in [0, 1)"),
    (["--outer-lr-warmup", "-2"], "--outer-lr-warmup=-2.0 is invalid"),
    (["--strategy", "fedavg", "--outer-momentum-warmup", "3"], "lowbw: "
     "error: --outer-momentum-warmup=3.0 is invalid: not used by strategy "
     "'fedavg'"),
    (["--strategy", "noloco", "--workers", "3"], "--workers=3 is invalid: "
     "noloco pairs the workers"),
    (["--codec", "topk:0.1:block=0"], "block=0 is invalid"),
    (["--strategy", "sparseloco", "--robust", "sparse"], "--robust='sparse' "
     "is invalid: expected 'mean', 'median'"),
])
def test_flag_errors_name_the_flag_and_suggest(argv, message, capsys,
                                               tmp_path):
  assert cli.main(_TINY + argv + ["--out", str(tmp_path / "r")]) == 2
  err = _err(capsys)
  assert message in err, err
  if "unrecognized" in message:
    assert "lowbw train --help" in err


def test_an_unknown_command_suggests_the_nearest(capsys):
  assert cli.main(["trian"]) == 2
  assert "did you mean 'train'?" in _err(capsys)


def test_help_shows_no_python_false_for_strategies_without_the_setting():
  help_text = cli.build_parser().commands["train"].format_help()
  assert "False" not in help_text
  sweep_help = " ".join(cli.build_parser().commands["sweep"].format_help(
      ).split())
  assert "False" not in sweep_help and "any setting" in sweep_help


# ------------------------------------------- sweeps: names before compiling
def test_grid_names_are_checked_before_anything_compiles(monkeypatch, capsys,
                                                         tmp_path):
  def no_build(*a, **k):
    raise AssertionError("built before the grid was checked")
  monkeypatch.setattr(lowbw.studies._run, "build_config", no_build)
  argv = ["sweep", "--data", "digits", "--steps", "3", "--out",
          str(tmp_path / "s")]
  assert cli.main(argv + ["--grid", "inner_lrr=1e-3"]) == 2
  assert "did you mean 'inner_lr'" in _err(capsys)
  # Every point's config is checked first: H=4 > steps=3 at one point.
  assert cli.main(argv + ["--grid", "H=1,4"]) == 2
  assert "--steps=3 is invalid" in _err(capsys)


def test_the_api_sweep_checks_grid_names_before_building(monkeypatch):
  from lowbw.simulation import _sweep as sweep_module
  monkeypatch.setattr(sweep_module, "_build", lambda args: 1 / 0)
  with pytest.raises(lowbw.ConfigError, match="grid='learning_rate' is "
                     "invalid: not a traced"):
    lowbw.sweep(dict(model=models.mlp(hidden=(8,)), **_RUN),
                grid={"learning_rate": [1e-3]})


# ------------------------------------------------------------ model contract
def _init(key, batch):
  return {"w": jnp.zeros((64, 10))}


def _logits(p, b):
  return b["x"].reshape(b["x"].shape[0], -1) @ p["w"]


@pytest.mark.parametrize("model, said", [
    ((_init, lambda p, b, k: (_logits(p, b).mean(-1), {})),
     "its loss is float32[4] (take the mean over the batch)"),
    ((_init, lambda p, b, k: ({"a": _logits(p, b).mean()},
                              _logits(p, b).mean())),
     "in the wrong order?"),
    ((_init, lambda p, b, k: _logits(p, b).mean()), "it returned float32[]"),
    ((_init, lambda p, b, k: (_logits(p, b).mean(), [1.0])),
     "its metrics are (float32[],)"),
    ((lambda k, b: {"w": jnp.zeros((64, 10), jnp.int32)},
      lambda p, b, k: (_logits(p, b).mean(), {})),
     "init returned parameter ['w'] of dtype int32"),
    ((lambda k, b: {"w": jnp.zeros((64, 10)), "s": 1.0},
      lambda p, b, k: (_logits(p, b).mean() * p["s"], {})),
     "init returned parameter ['s'] as a Python float"),
    ((lambda k, b: {}, lambda p, b, k: (b["x"].mean(), {})),
     "init returned no parameters"),
    ((_init, lambda p, b, k: (_logits(p, b).mean(), {"acc": "x"})),
     "its metric 'acc' is a Python str; expected a numeric scalar"),
    ((lambda k, b: {"w": jnp.zeros((64, 10), jnp.float16)},
      lambda p, b, k: (_logits(p, b).astype(jnp.float32).mean(), {})),
     "float16 parameters are not supported"),
])
def test_the_model_contract_is_checked_at_build(model, said):
  with pytest.raises(lowbw.ConfigError) as info:
    lowbw.build(model=model, **{k: v for k, v in _RUN.items()
                                if k != "progress"}, compile=False)
  assert info.value.field == "model" and said in str(info.value), info.value
  assert "expected" in str(info.value) or "must" in str(info.value)


def test_an_npz_without_features_is_one_line(capsys, tmp_path):
  path = tmp_path / "z.npz"
  np.savez(path, x=np.zeros((100, 0), np.float32), y=np.arange(100) % 3)
  argv = [*_TINY, "--data", str(path), "--out", str(tmp_path / "r")]
  assert cli.main(argv) == 2
  assert _err(capsys) == (
      f"lowbw: error: --data='{path}' is invalid: x='<array float32 "
      "(100, 0)>' is invalid: expected at least 1 feature (every axis after "
      "the first must be non-empty)")


def test_a_bug_in_the_models_own_code_keeps_its_traceback_with_a_note():
  with pytest.raises(ZeroDivisionError) as info:
    lowbw.build(model=(lambda k, b: 1 / 0, lambda p, b, k: (0.0, {})),
                **{k: v for k, v in _RUN.items() if k != "progress"},
                compile=False)
  assert "model='custom''s init(key, batch)" in " ".join(
      info.value.__notes__)


def test_a_model_with_no_metrics_trains():
  model = (_init, lambda p, b, k: (
      optax.softmax_cross_entropy_with_integer_labels(
          _logits(p, b), b["y"]).mean(), {}))
  result = lowbw.simulate(model=model, **_RUN)
  assert np.isfinite(result.summary["final_eval_loss"])


# ----------------------------------------------------------------- divergence
@pytest.fixture(scope="module")
def diverged():
  return dict(model=models.mlp(hidden=(16,)), data=data.digits(),
              strategy=strategies.ddp(inner=optax.sgd(1e3)), workers=2,
              batch_size=16, steps=60, eval_every=20, progress=False,
              clock=False)


def test_a_diverged_run_warns_with_the_step_it_turned(diverged, tmp_path):
  with pytest.warns(lowbw.RunWarning, match="the run diverged: train_loss "
                    "rose from .* it turned at step"):
    result = lowbw.simulate(**diverged, out=str(tmp_path / "d"))
  loss = result.history["train_loss"]
  turned = result.summary["diverged_at_step"]
  steps = list(result.history["step"])
  assert loss[steps.index(turned)] == np.nanmin(loss)  # the lowest point
  saved = json.loads((tmp_path / "d" / "summary.json").read_text())
  assert any("diverged" in w for w in saved["warnings"])


def test_fail_on_divergence_raises_after_keeping_the_logs(diverged, tmp_path):
  with pytest.raises(lowbw.DivergenceError, match="logs are kept") as info:
    lowbw.simulate(**diverged, out=str(tmp_path / "d"),
                   fail_on_divergence=True)
  assert (tmp_path / "d" / "summary.json").exists()
  assert info.value.summary["diverged_at_step"] == info.value.step


def test_fail_on_divergence_on_the_command_line(capsys, tmp_path):
  argv = ["train", "--data", "digits", "--hidden", "16", "--workers", "2",
          "--batch-size", "16", "--steps", "60", "--strategy", "ddp",
          "--inner", "sgd", "--inner-lr", "1000", "--eval-every", "20",
          "--no-progress", "--out", str(tmp_path / "d")]
  assert cli.main(argv + ["--fail-on-divergence"]) == 3
  err = capsys.readouterr().err
  assert "lowbw: error: the run diverged" in err and "\n" == err[-1]
  assert (tmp_path / "d" / "metrics.csv").exists()


def test_accuracy_falling_to_chance_is_divergence():
  from lowbw.simulation import _divergence
  history = {"step": np.array([10, 20, 30]),
             "eval_loss": np.array([2.0, 1.9, 2.2]),
             "eval_accuracy": np.array([0.5, 0.6, 0.09])}
  found = _divergence.check(history, num_classes=10)
  assert found.step == 20 and "at or below chance (0.1)" in found.text
  history["eval_accuracy"] = np.array([0.1, 0.12, 0.09])  # never learned
  assert _divergence.check(history, num_classes=10) is None


# ------------------------------------------------------------- config files
def test_yaml_toml_and_json_configs_mean_the_same(tmp_path):
  files = {"a.yaml": "strategy: sparta\np: 0.05\ninner_lr: 1e-3\n",
           "a.toml": 'strategy = "sparta"\np = 0.05\ninner_lr = 1e-3\n',
           "a.json": '{"strategy": "sparta", "p": 0.05, "inner_lr": 0.001}'}
  seen = []
  for name, text in files.items():
    path = tmp_path / name
    path.write_text(text)
    args = cli.build_parser().parse_args(["train", "--config", str(path)])
    seen.append(_train.resolved(_train.settings(args)))
  assert seen[0] == seen[1] == seen[2]
  assert seen[0]["inner_lr"] == 1e-3 and seen[0]["strategy"] == "sparta"


@pytest.mark.parametrize("name, text, said", [
    ("a.yml", "strategy: [sparta\n", "not valid YAML"),
    ("a.ini", "strategy = sparta\n", "expected a file ending in .yaml"),
    ("a.yaml", "wokers: 3\n", "did you mean 'workers'"),
])
def test_bad_config_files_are_one_line(tmp_path, capsys, name, text, said):
  path = tmp_path / name
  path.write_text(text)
  assert cli.main(_TINY + ["--config", str(path)]) == 2
  err = _err(capsys)
  assert err.startswith("lowbw: error: --config=") and said in err, err


# ------------------------------------------------------ results and defaults
def test_a_result_has_a_short_repr_and_an_evaluations_view():
  result = lowbw.simulate(model=models.mlp(hidden=(8,)),
                          **{**_RUN, "steps": 20}, eval_every=10)
  text = repr(result)
  assert len(text) < 400 and "diloco" in text and "final_eval_loss" in text
  evals = result.evals()
  assert list(evals["step"]) == [10, 20]
  assert not np.isnan(evals["eval_loss"]).any()
  assert "train_loss" not in evals or not np.isnan(evals["train_loss"]).any()


def test_to_pandas_names_the_missing_package(monkeypatch):
  import builtins
  result = lowbw.simulate(model=models.mlp(hidden=(8,)), **_RUN)
  real = builtins.__import__

  def no_pandas(name, *a, **k):
    if name == "pandas":
      raise ModuleNotFoundError(name)
    return real(name, *a, **k)
  monkeypatch.setattr(builtins, "__import__", no_pandas)
  with pytest.raises(ModuleNotFoundError, match="pip install pandas"):
    result.to_pandas()


def test_the_api_and_the_command_line_share_their_defaults():
  # simulate(**fields) makes the Config the command line makes from the
  # same settings: the same defaults, the same network.
  from lowbw.simulation._api import config_of
  api = config_of("simulate", (), {"data": "digits"})
  args = cli.build_parser().parse_args(["train", "--data", "digits"])
  flags = _train.settings(args)
  assert api == flags
  assert api.built().checked["network"] == lowbw.network.network(
      _train.DEFAULTS["bandwidth"], _train.DEFAULTS["latency"],
      hardware=_train.DEFAULTS["hardware"], mfu=_train.DEFAULTS["mfu"])


def test_a_python_run_has_a_clock_by_default():
  args = {k: v for k, v in _RUN.items() if k != "clock"}
  result = lowbw.simulate(model=models.mlp(hidden=(8,)), **args)
  assert result.summary["sim_time_s"] > 0


# --------------------------------------------------------------- interruption
def test_ctrl_c_keeps_the_rows_and_writes_the_summary_of_what_ran(tmp_path):
  def interrupt(row):
    if row["step"] >= 5:
      raise KeyboardInterrupt
  with pytest.raises(KeyboardInterrupt):
    lowbw.simulate(model=models.mlp(hidden=(8,)), **_RUN, callback=interrupt,
                   out=str(tmp_path / "r"))
  summary = json.loads((tmp_path / "r" / "summary.json").read_text())
  assert summary["interrupted_at_step"] >= 5
  assert (tmp_path / "r" / "metrics.csv").read_text().count("\n") >= 2


def test_chunks_are_bounded_in_wall_time(monkeypatch):
  """Ctrl-C is seen between chunks: with no time to spare, every chunk is
  one round, and the run is the same to the bit."""
  model = models.mlp(hidden=(8,))
  args = {**_RUN, "steps": 40, "strategy": strategies.diloco(H=2)}
  base = lowbw.simulate(model=model, **args)
  sizes = []
  real = _loop._Pace.rounds
  monkeypatch.setattr(_loop, "CHUNK_SECONDS", 0.0)
  monkeypatch.setattr(_loop._Pace, "rounds",
                      lambda self: sizes.append(real(self)) or sizes[-1])
  paced = lowbw.simulate(model=model, **args)
  assert sizes and max(sizes) == 1
  for a, b in zip(jax.tree.leaves(base.params), jax.tree.leaves(paced.params)):
    np.testing.assert_array_equal(a, b)


def test_the_cli_says_what_it_does_before_the_first_row(capsys, tmp_path):
  argv = [a for a in _TINY if a != "--no-progress"]
  assert cli.main(argv + ["--out", str(tmp_path / "r")]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert lines[0].startswith("lowbw: loading data (digits)")
  assert lines[1].startswith("lowbw: compiling") and lines[2].startswith(
      "step ")


# ------------------------------------------------------------ small messages
@pytest.mark.parametrize("out", ["runs/a\nb", "runs/\ta", " "])
def test_a_log_folder_with_control_characters_is_refused(out):
  with pytest.raises(lowbw.ConfigError, match="out=.* is invalid: "
                     "(contains the control character|expected a folder)"):
    lowbw.simulate(model=models.mlp(hidden=(8,)), **_RUN, out=out)
  assert not os.path.exists("runs/a\nb") and not os.path.exists("runs/\ta")


def test_tiny_durations_read_in_their_own_unit():
  from lowbw.network._units import format_duration
  assert format_duration(3.70071e-05) == "37.01us"
  assert format_duration(7.26823e-3) == "7.268ms"
  assert format_duration(3.7e-11) == "0.037ns"
  assert format_duration(90.0) == "90s" and format_duration(0) == "0s"


def test_train_draws_its_plot_and_says_where(capsys, tmp_path):
  out = tmp_path / "r"
  assert cli.main(_TINY + ["--out", str(out)]) == 0
  printed = capsys.readouterr().out
  assert f"plot              {out}/plot.png (train and eval loss against " \
      "steps and against simulated time" in printed
  assert (out / "plot.png").stat().st_size > 0
  assert cli.main(_TINY + ["--out", str(tmp_path / "q"), "--no-plot"]) == 0
  assert not (tmp_path / "q" / "plot.png").exists()


def test_a_sweep_prints_each_points_warnings(capsys, tmp_path):
  argv = ["sweep", "--data", "digits", "--hidden", "16", "--workers", "2",
          "--batch-size", "16", "--steps", "60", "--strategy", "ddp",
          "--inner", "sgd", "--eval-every", "20", "--no-progress",
          "--grid", "inner_lr=0.1,1000", "--out", str(tmp_path / "s")]
  assert cli.main(argv) == 0
  err = capsys.readouterr().err
  assert "lowbw: warning: inner_lr=1000, seed 0: the run diverged" in err
  assert "inner_lr=0.1," not in err


def test_fail_on_divergence_must_be_a_boolean():
  sim = lowbw.build(model=models.mlp(hidden=(8,)),
                    **{k: v for k, v in _RUN.items() if k != "progress"},
                    compile=False)
  with pytest.raises(lowbw.ConfigError, match="fail_on_divergence='yes' is "
                     "invalid: expected True or False"):
    sim.run(fail_on_divergence="yes")

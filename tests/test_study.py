"""lowbw.Config and lowbw.study: a run as a value, and grids over any field.

Each study point is compared with a plain single run of the same config
(``lowbw.simulate(point.config)``); a killed study resumes and skips what
finished; irregular grids work from the API and from ``--grid-file``.
"""

import json
import os
import re
import signal
import subprocess
import sys

import numpy as np
import pytest

import lowbw
from lowbw import cli, strategies
from lowbw.simulation import _sweep
from lowbw.studies import _files

TINY = dict(data="digits", hidden="8", workers=2, batch_size=4, steps=8,
            eval_examples=32, eval_every=4)


@pytest.fixture(scope="module")
def base():
  return lowbw.Config(**TINY, H=2)


@pytest.fixture(scope="module")
def small_study(base, tmp_path_factory):
  out = tmp_path_factory.mktemp("study")
  grid = [{"H": [2, 4], "outer_lr": [0.5, 0.7]},
          {"strategy": ["ddp"]},
          {"strategy": ["sparta"], "p": [0.05]}]
  return lowbw.study(base, grid, seeds=[0, 1], out=str(out), progress=False)


# ------------------------------------------------------------------ Config
def test_a_config_round_trips_through_yaml(tmp_path):
  for name in sorted(strategies.SPECS):
    config = lowbw.Config(strategy=name, data="digits")
    path = config.save(str(tmp_path / f"{name}.yaml"))
    again = lowbw.Config.load(path)
    assert again == config and again.to_dict() == config.to_dict()


def test_defaults_follow_the_strategy_and_unused_settings_are_errors():
  config = lowbw.Config(strategy="diloco", H=50, data="digits")
  assert (config.outer_lr, config.H, config.model) == (0.7, 50, "mlp")
  assert config.without("H").H == strategies.spec("diloco").params[0].default
  with pytest.raises(lowbw.ConfigError, match="^H=50 is invalid: not used "
                     "by strategy 'sparta'"):
    config.replace(strategy="sparta")
  sparta = lowbw.Config(strategy="sparta", data="digits")
  assert sparta.to_dict()["p"] == sparta.p and "H" not in sparta.to_dict()


@pytest.mark.parametrize("kwargs, message", [
    ({"wokers": 3}, r"^config='wokers' is invalid: not a setting \(did you "
                    r"mean 'workers'"),
    ({"lr": 0.1}, "did you mean 'inner_lr'"),
    ({"steps": "ten"}, "^steps='ten' is invalid: expected an integer"),
    ({"bandwidth": "fast"}, "^bandwidth='fast' is invalid"),
    ({"strategy": "dilocco"}, "^strategy='dilocco' is invalid"),
    ({"sharding": "dirichlett"}, "did you mean 'dirichlet'"),
    ({"layers": 3, "data": "digits"}, "not used by model 'mlp'"),
    ({"H": 0}, "^H=0 is invalid"),
])
def test_bad_configs_are_one_clear_error(kwargs, message):
  with pytest.raises(lowbw.ConfigError, match=message):
    lowbw.Config(**kwargs)


def test_a_config_with_a_python_object_runs_but_is_not_written(tmp_path):
  tiny = {k: v for k, v in TINY.items() if k != "hidden"}
  config = lowbw.Config(**tiny, model=lowbw.models.mlp(hidden=(8,)), H=2,
                        out=str(tmp_path / "r"))
  with pytest.raises(lowbw.ConfigError, match="^hidden='8' is invalid: not "
                     "used by model '<Model object>'"):
    config.replace(hidden="8")
  with pytest.raises(lowbw.ConfigError, match="^model='Model' is invalid: a "
                     "Python object cannot be written"):
    config.to_yaml()
  result = lowbw.simulate(config)
  assert result.summary["steps"] == 8
  assert not (tmp_path / "r" / "config.yaml").exists()


def test_a_run_repeats_bit_for_bit_from_its_written_config(tmp_path, capsys):
  first, again = tmp_path / "first", tmp_path / "again"
  argv = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
          "--H", "2", "--steps", "8", "--eval-every", "4", "--eval-examples",
          "32", "--strategy", "sparta_diloco", "--no-progress", "--no-plot"]
  assert cli.main(argv + ["--out", str(first)]) == 0
  assert cli.main(["train", "--config", str(first / "config.yaml"), "--out",
                   str(again), "--no-plot"]) == 0
  capsys.readouterr()
  a = _files.read_history(str(first / "metrics.csv"))
  b = _files.read_history(str(again / "metrics.csv"))
  for column in ("train_loss", "eval_loss", "payload_bytes", "wire_bytes",
                 "sim_time_s"):
    np.testing.assert_array_equal(a[column], b[column])
  # --print-config writes what --config reads back.
  assert cli.main(["train", "--config", str(first / "config.yaml"),
                   "--print-config"]) == 0
  printed = capsys.readouterr().out
  (tmp_path / "printed.yaml").write_text(printed)
  assert lowbw.Config.load(str(tmp_path / "printed.yaml")) == \
      lowbw.Config.load(str(first / "config.yaml"))


# ------------------------------------------------------------------- study
def test_each_study_point_equals_its_single_run(small_study):
  points = small_study.points
  assert len(points) == 12 and small_study.summary["groups"] == 3
  # A traced value (outer_lr), the seeds and DiLoCo's H (a build with a
  # traced H) share a build; the strategy and SPARTA's p do not.
  assert small_study.summary["builds"] == 3
  for point in (points[2], points[5], points[9], points[11]):
    single = lowbw.simulate(point.config.replace(out=None))
    for key in ("final_eval_loss", "final_train_loss", "wire_bytes",
                "payload_bytes", "sim_time_s"):
      np.testing.assert_allclose(point.summary[key], single.summary[key],
                                 rtol=1e-6, err_msg=key)
    np.testing.assert_allclose(point.history["train_loss"],
                               single.history["train_loss"], rtol=1e-6)


def test_points_of_a_build_batched_as_a_vmapped_axis_equal_the_study(
    base, small_study, tmp_path, monkeypatch):
  """points_per_batch=3 runs a build's points as one vmapped program (what
  an accelerator does by default), the last batch padded; each point
  equals the point of the one-at-a-time study, and its folder holds its
  own logs and config."""
  grid = [{"H": [2], "outer_lr": [0.5, 0.7]}, {"strategy": ["ddp"]}]
  out = tmp_path / "batched"
  sizes, run_batch = [], _sweep.run_batch
  monkeypatch.setattr(_sweep, "run_batch", lambda sim, points, *a, **k:
                      sizes.append(len(points))
                      or run_batch(sim, points, *a, **k))
  batched = lowbw.study(base, grid, seeds=[0, 1], out=str(out),
                        progress=False, plots=False, points_per_batch=3)
  by_key = {(tuple(sorted(p.values.items())), p.seed): p
            for p in small_study.points}
  assert len(batched.points) == 6
  assert sizes == [3, 3, 3]  # 4 DiLoCo points in 2 batches, 2 DDP in 1
  for point in batched.points:
    one = by_key[(tuple(sorted(point.values.items())), point.seed)]
    for key in ("final_eval_loss", "final_train_loss", "wire_bytes",
                "sim_time_s"):
      np.testing.assert_allclose(point.summary[key], one.summary[key],
                                 rtol=1e-5, err_msg=key)
    np.testing.assert_allclose(point.history["train_loss"],
                               one.history["train_loss"], rtol=1e-5)
    assert lowbw.Config.load(os.path.join(point.log_dir, "config.yaml")) == \
        point.config.replace(out=point.log_dir)
  # Each batch's compiling is its first point's; its loop's wall time is
  # shared by its three points.
  assert batched.summary["compile_s"] > 0
  assert [p.summary["compile_s"] > 0 for p in batched.points].count(True) >= 1
  for point in batched.points:
    assert point.summary["batch"]["points"] == 3
    assert point.summary["wall_time_s"] == pytest.approx(
        point.summary["batch"]["wall_time_s"] / 3)
  again = lowbw.studies.load(str(out))  # read back from the folder
  assert [p.summary["final_eval_loss"] for p in again.points] == \
      [p.summary["final_eval_loss"] for p in batched.points]
  with pytest.raises(lowbw.ConfigError, match="^points_per_batch=0"):
    lowbw.study(base, grid, points_per_batch=0)


def test_a_study_writes_its_tables_and_plots(small_study):
  out = small_study.summary["out"]
  names = set(os.listdir(out))
  assert {"study.json", "study.csv", "final.csv", "points.csv", "points",
          "loss_vs_bytes.png", "loss_vs_time.png", "loss_vs_H.png",
          "loss_vs_strategy.png"} <= names
  final = small_study.final(frame=False)
  assert len(final["seeds"]) == 6 and list(final["seeds"]) == [2] * 6
  diloco = [i for i in range(6) if final["strategy"][i] is None]
  assert len(diloco) == 4  # the base's strategy: the first sub-grid
  tidy = small_study.table(frame=False)
  assert set(tidy["point"]) == set(range(12))
  # every point can be run again from its own written config
  point = small_study.points[3]
  written = lowbw.Config.load(os.path.join(point.log_dir, "config.yaml"))
  assert written.replace(out=None) == point.config.replace(out=None)


def test_lowbw_plot_draws_a_study_folder(small_study, capsys, tmp_path):
  assert cli.main(["plot", small_study.summary["out"], "--out",
                   str(tmp_path)]) == 0
  assert "loss_vs_bytes.png" in os.listdir(tmp_path)


def test_a_grid_value_the_point_does_not_use_names_the_point(base):
  with pytest.raises(lowbw.ConfigError, match=r"^H=10 is invalid: not used "
                     r"by strategy 'ddp' \(at grid point strategy='ddp', "
                     "H=10\\)"):
    lowbw.study(base, {"strategy": ["ddp"], "H": [10]})
  with pytest.raises(lowbw.ConfigError, match="seeds=\\[0, 0\\]"):
    lowbw.study(base, {"H": [2]}, seeds=[0, 0])
  with pytest.raises(lowbw.ConfigError, match="seeds are not a grid field"):
    lowbw.study(base, {"seed": [1, 2]})
  with pytest.raises(lowbw.ConfigError, match="^grid='foo' is invalid: not "
                     "a setting"):
    lowbw.study(base, [{"foo": [1]}])


_KILLED = r'''
import os, signal, sys
import lowbw
base = lowbw.Config(data="digits", hidden="8", workers=2, batch_size=4,
                    steps=8, eval_examples=32, H=2)
def die(point):
  if point.index == 1:   # two points finished: kill -9 the study
    os.kill(os.getpid(), signal.SIGKILL)
lowbw.study(base, {"H": [2, 4]}, seeds=[0, 1], out=sys.argv[1],
            progress=False, on_point=die)
'''


def test_a_killed_study_resumes_and_skips_finished_points(tmp_path, capsys):
  out = tmp_path / "killed"
  proc = subprocess.run([sys.executable, "-c", _KILLED, str(out)],
                        capture_output=True, text=True)
  assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
  done = sorted(os.listdir(out / "points"))
  assert all((out / "points" / d / "point.json").exists()
             for d in done[:2])
  # A point killed mid-run leaves no point.json: it runs again.
  (out / "points" / "0002").mkdir()
  (out / "points" / "0002" / "metrics.csv").write_text("step\n1\n")
  assert cli.main(["sweep", "--data", "digits", "--hidden", "8", "--workers",
                   "2", "--batch-size", "4", "--steps", "8",
                   "--eval-examples", "32", "--H", "2", "--grid", "H=2,4",
                   "--seeds", "0,1", "--out", str(out), "--no-progress"]) == 0
  text = capsys.readouterr().out
  # H is traced: both H share one compiled shape.
  assert "4 points (2 seeds, 1 compiled shapes, 2 resumed)" in text
  record = json.loads((out / "study.json").read_text())
  assert record["summary"]["resumed"] == 2
  study = lowbw.studies.load(str(out))
  assert [p.index for p in study.points] == [0, 1, 2, 3]
  # The resumed and the new points are the same runs as single runs.
  single = lowbw.simulate(study.points[0].config.replace(out=None))
  np.testing.assert_allclose(study.points[0].summary["final_eval_loss"],
                             single.summary["final_eval_loss"], rtol=1e-6)
  # Another grid in the same folder is refused.
  assert cli.main(["sweep", "--data", "digits", "--grid", "H=3", "--out",
                   str(out)]) == 2
  assert "holds another study" in capsys.readouterr().err


def test_an_irregular_grid_file(tmp_path, capsys):
  grid = tmp_path / "grid.yaml"
  grid.write_text("- strategy: [ddp]\n- strategy: [diloco]\n  H: [2, 4]\n")
  out = tmp_path / "irregular"
  assert cli.main(["sweep", "--data", "digits", "--hidden", "8", "--workers",
                   "2", "--batch-size", "4", "--steps", "8",
                   "--eval-examples", "32", "--H", "4", "--grid-file",
                   str(grid), "--out", str(out), "--no-progress"]) == 0
  text = capsys.readouterr().out
  # DDP, and DiLoCo's two H on one build (a traced H).
  assert "3 points (1 seeds, 2 compiled shapes, 0 resumed)" in text
  rows = (out / "points.csv").read_text().splitlines()
  assert rows[0].startswith("point,seed,strategy,H,")
  assert [r.split(",")[2:4] for r in rows[1:]] == [
      ["ddp", ""], ["diloco", "2"], ["diloco", "4"]]


def test_the_base_need_only_be_valid_with_each_points_values(tmp_path,
                                                             capsys):
  # --steps 8 alone is below DiLoCo's default H of 100; every point sets H.
  assert cli.main(["sweep", "--data", "digits", "--hidden", "8", "--workers",
                   "2", "--steps", "8", "--eval-examples", "32", "--grid",
                   "H=2,8", "--out", str(tmp_path / "s"), "--no-progress"]
                  ) == 0
  # Both H on one build (a traced H).
  assert "2 points (1 seeds, 1 compiled shapes" in capsys.readouterr().out
  assert cli.main(["sweep", "--data", "digits", "--steps", "8", "--grid",
                   "H=2,16", "--out", str(tmp_path / "t")]) == 2
  assert "(at grid point --H=16)" in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--grid", "H"], "--grid='H' is invalid: expected NAME=V1"),
    (["--grid", "lr=0.1"], "did you mean 'inner_lr'"),
    (["--grid", "H=1", "--grid", "H=2"], "is given twice"),
    (["--grid", "H=x"], "--H='x' is invalid: expected an integer"),
    (["--seeds", "0,x"], "--seeds='0,x' is invalid"),
    (["--checkpoint-every", "2", "--H", "2"],
     "--checkpoint-every=2 is invalid: a sweep"),
    (["--points-per-batch", "0", "--grid", "H=2"],
     "--points-per-batch=0 is invalid: expected an integer >= 1"),
])
def test_sweep_errors_are_one_line(argv, message, capsys, tmp_path):
  code = cli.main(["sweep", "--data", "digits", "--out", str(tmp_path / "x"),
                   *argv])
  err = capsys.readouterr().err
  assert code == 2 and message in err and len(err.strip().splitlines()) == 1


def test_simulate_and_build_take_a_config_and_only_run_arguments(base):
  with pytest.raises(lowbw.ConfigError, match="^steps=3 is invalid: simulate "
                     r"takes one lowbw.Config and no settings beside it"):
    lowbw.simulate(base, steps=3)
  with pytest.raises(lowbw.ConfigError, match="takes one lowbw.Config"):
    lowbw.build(base, 3)
  strategy = strategies.diloco(H=2)
  config = lowbw.Config(**TINY, strategy=strategy)
  with pytest.raises(lowbw.ConfigError, match="not used by strategy "
                     "'<Strategy object>'"):
    config.replace(H=4)
  sim = lowbw.build(config, compile=False)
  assert sim.config.strategy is strategy and sim.config.workers == 2


def test_simulate_of_fields_is_simulate_of_their_config():
  """One call style: simulate(**fields) runs Config(**fields), bit for bit,
  and its keywords are the config's fields (an unknown one is refused with
  the nearest field's name)."""
  fields = dict(TINY, strategy="diloco", H=2, progress=False)
  by_fields = lowbw.simulate(**fields)
  by_config = lowbw.simulate(lowbw.Config(**fields))
  for name in ("train_loss", "eval_loss", "sim_time_s"):
    np.testing.assert_array_equal(by_fields.history[name],
                                  by_config.history[name])
  with pytest.raises(lowbw.ConfigError, match=r"^config='num_worker' is "
                     r"invalid: not a setting \(did you mean 'workers'"):
    lowbw.simulate(model="mlp", data="digits", strategy="ddp", num_worker=2)
  with pytest.raises(TypeError, match="multiple values for argument 'data'"):
    lowbw.build("mlp", "digits", data="digits")


def test_each_tier_of_outer_optimizers_is_traced_where_the_strategy_says():
  """Hierarchical DiLoCo declares where its two outer optimizers live
  (Strategy.outer_places): outer_lr sets the regional tier only,
  global_outer_lr the wide-area tier only. A study of both shares one
  build, and each point equals a single run built with its values; a
  strategy without the tier says so."""
  tiers = dict(**TINY, strategy="hierarchical_diloco", group_size=1, H=2,
               global_every=1)
  base = lowbw.Config(**tiers)
  study = lowbw.study(base, {"outer_lr": [0.5, 0.7],
                             "global_outer_lr": [0.3, 1.0]}, progress=False)
  assert study.summary["builds"] == 1
  losses = set()
  for point in study.points:
    single = lowbw.simulate(point.config)
    np.testing.assert_allclose(point.summary["final_train_loss"],
                               single.summary["final_train_loss"], rtol=1e-6)
    losses.add(round(point.summary["final_train_loss"], 7))
  assert len(losses) == 4  # each tier's value changes the run
  diloco = lowbw.build(lowbw.Config(**TINY, H=2), compile=False)
  with pytest.raises(lowbw.ConfigError, match="^global_outer_lr=0.1 is "
                     "invalid: strategy 'diloco' has no global outer"):
    lowbw.sweep(diloco, grid={"global_outer_lr": [0.1]})



def test_a_reloaded_study_pairs_each_point_with_its_own_settings(
    base, tmp_path):
  # The grid's fields out of alphabetical order: study.json stores the grid
  # with sorted keys, so re-enumerating it on reload ran the product in
  # another order than the points were run in.
  out = str(tmp_path / "study")
  grid = {"outer_lr": [0.5, 0.7], "inner_lr": [1e-3, 3e-3]}
  ran = lowbw.study(base, grid, seeds=[0], out=out, progress=False,
                    plots=False)
  assert [p.values for p in ran.points] == [
      {"outer_lr": a, "inner_lr": b} for a in (0.5, 0.7) for b in (1e-3, 3e-3)]
  loaded = lowbw.studies.load(out)
  for before, after in zip(ran.points, loaded.points):
    assert (after.index, after.values, after.seed) == (
        before.index, before.values, before.seed)
    assert after.config.replace(out=None) == before.config.replace(out=None)
    assert after.summary["final_eval_loss"] == before.summary[
        "final_eval_loss"]
  assert loaded.final(frame=False) == ran.final(frame=False)
  # Each point's record names its settings, and final.csv reads the same.
  for p in loaded.points:
    with open(os.path.join(p.log_dir, "point.json")) as f:
      assert json.load(f)["values"] == p.values
  rows = (tmp_path / "study" / "final.csv").read_text().splitlines()
  assert rows[0].startswith("outer_lr,inner_lr,")
  assert [r.split(",")[:2] for r in rows[1:]] == [
      ["0.5", "0.001"], ["0.5", "0.003"], ["0.7", "0.001"], ["0.7", "0.003"]]
  # The same study with its fields in another order is another order of
  # points: refused, not resumed with each folder's results under another
  # point's settings.
  with pytest.raises(lowbw.ConfigError, match=re.escape(
      f"out='{out}' is invalid: its point 1 ran inner_lr=0.003, "
      "outer_lr=0.5 (seed 0) but this grid puts inner_lr=0.001, outer_lr=0.7 "
      "(seed 0) there")):
    lowbw.study(base, {"inner_lr": [1e-3, 3e-3], "outer_lr": [0.5, 0.7]},
                seeds=[0], out=out, progress=False, plots=False)


# ------------------------------------------- comparing methods, said so
def test_a_study_comparing_methods_at_one_shared_rate_says_so(small_study):
  """The small study sweeps the outer rate but compares DiLoCo, DDP and
  SPARTA at one inner rate: its summary and printed table say which."""
  from lowbw.cli._sweep import format_table
  note = small_study.summary["shared_rates"]
  inner = {p.config.inner_lr for p in small_study.points} - {None}
  shared = inner.pop() if inner else strategies.spec("ddp").inner.lr
  assert f"inner_lr {shared:g}" in note and "outer_lr" not in note
  assert "lowbw.studies.tune" in note
  assert format_table(small_study).endswith(f"note: {note}")


def test_shared_rates_names_each_methods_default_and_stays_quiet_when_swept(
    base):
  from lowbw.studies._result import PointResult, shared_rates

  def points(*configs):
    return [PointResult(i, {}, 0, {}, {}, None, c)
            for i, c in enumerate(configs)]

  ddp = lowbw.Config(**TINY, strategy="ddp")
  muon = lowbw.Config(**TINY, strategy="muloco", H=2)
  note = shared_rates(["strategy"], points(base, ddp, muon))
  lrs = sorted({strategies.spec(n).inner.lr
                for n in ("diloco", "ddp", "muloco")})
  assert f"inner_lr {'/'.join(f'{x:g}' for x in lrs)}" in note
  assert shared_rates(["strategy", "inner_lr", "outer_lr"],
                      points(base, ddp)) is None
  assert shared_rates(["H"], points(base, base.replace(H=4))) is None

"""``lowbw train`` with a network, and ``lowbw plot``."""

import csv
import json

import pytest

from lowbw import cli
from test_cli import TINY


def rows(out):
  with open(out / "metrics.csv") as f:
    return list(csv.DictReader(f))


def test_every_run_has_a_clock_and_the_flags_reach_it(tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(TINY + [
      "--bandwidth", "100Mbps", "--latency", "20ms", "--hardware", "0.5s",
      "--speeds", "1,0.5", "--mitigation", "backup", "--backups", "1",
      "--drop-prob", "0.1", "--failures", "1@8", "--out", str(out)]) == 0
  printed = capsys.readouterr().out
  assert "simulated time" in printed and "100Mbps" in printed
  config = json.loads((out / "config.json").read_text())
  net = config["network"]
  assert net["bandwidth_bps"] == 1e8 and net["latency_s"] == 0.02
  assert net["hardware"]["speeds"] == [1.0, 0.5]
  assert net["stragglers"]["mitigation"] == "backup"
  assert net["faults"]["failures"] == [[1, 8]]
  table = rows(out)
  times = [float(r["sim_time_s"]) for r in table]
  assert times == sorted(times) and times[-1] > 0
  # One backup of two workers: each sync averages the faster one only.
  synced = {r["sync_workers"] for r in table if r["sync_workers"]}
  assert synced <= {"1", "1.0", "0", "0.0"} and synced


def test_default_clock_is_a_1gbps_ring_of_h100s(tmp_path):
  out = tmp_path / "run"
  assert cli.main(TINY + ["--out", str(out)]) == 0
  net = json.loads((out / "config.json").read_text())["network"]
  assert (net["topology"], net["bandwidth_bps"], net["latency_s"]) == (
      "flat", 1e9, 0.05)
  assert net["hardware"]["name"] == "h100" and net["stragglers"] is None


def test_hierarchical_and_overlap_flags(tmp_path):
  out = tmp_path / "run"
  assert cli.main(TINY + ["--workers", "4", "--topology", "hierarchical",
                          "--group-size", "2", "--overlap", "--out",
                          str(out)]) == 0
  config = json.loads((out / "config.json").read_text())
  assert config["network"]["group_size"] == 2 and config["network"]["overlap"]
  assert config["channels"]["pseudo_gradients"]["collective"] == (
      "hierarchical_allreduce")


def test_plot_loss_against_simulated_time(tmp_path, capsys):
  pytest.importorskip("matplotlib")
  out = tmp_path / "run"
  assert cli.main(TINY + ["--out", str(out)]) == 0
  image = tmp_path / "p.png"
  assert cli.main(["plot", str(out), str(out / "metrics.csv"), "--x",
                   "sim_time_s", "--out", str(image), "--log-x"]) == 0
  assert image.stat().st_size > 1000
  assert "against simulated time (ms)" in capsys.readouterr().out


@pytest.mark.parametrize("argv, start", [
    (["--x", "sim_time"], "lowbw: error: --x='sim_time' is invalid: run"),
    (["--y", "nope"], "lowbw: error: --y='nope' is invalid"),
])
def test_plot_errors_name_the_flag(argv, start, tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(TINY + ["--out", str(out)]) == 0
  capsys.readouterr()
  assert cli.main(["plot", str(out)] + argv) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith(start) and "\n" not in err


def test_plot_of_a_missing_run(tmp_path, capsys):
  assert cli.main(["plot", str(tmp_path / "none")]) == 2
  assert "no metrics.csv" in capsys.readouterr().err


def test_overlap_from_a_config_file_must_be_a_boolean(tmp_path, capsys):
  cfg = tmp_path / "run.toml"
  cfg.write_text('overlap = "yes"\n')
  assert cli.main(TINY + ["--config", str(cfg), "--out",
                          str(tmp_path / "x")]) == 2
  err = capsys.readouterr().err.strip()
  assert err.startswith("lowbw: error: --overlap='yes' is invalid") and (
      "\n" not in err)

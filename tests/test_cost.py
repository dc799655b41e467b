"""What a run costs: ``gpu_hours``, ``traffic_gb`` and, with ``gpu_price`` and
``egress_price``, dollars, in every run's summary and in ``lowbw plan``.

Expected figures are computed here by hand from the summary's own
``sim_time_s`` and ``sent_bytes`` (and from the plan's outputs), never copied
from the code's output.
"""

import json

import pytest

import lowbw
from lowbw import cli
from lowbw.network import plan

SMALL = dict(model="mlp", data="digits", hidden=8, workers=2, steps=8,
             batch_size=8, strategy="diloco", H=4, eval_examples=64,
             progress=False)
COST_KEYS = ("compute_cost_usd", "traffic_cost_usd", "cost_usd")


@pytest.fixture(scope="module")
def sim():
  """One compiled small DiLoCo run, priced differently by each test."""
  return lowbw.build(**SMALL)


def _hand(summary, gpu_price, egress_price):
  hours = summary["num_workers"] * summary["sim_time_s"] / 3600
  gb = summary["sent_bytes"] / 1e9
  return hours, gb, hours * gpu_price, gb * egress_price


def test_summary_figures_are_the_hand_computation(sim):
  s = sim.run(seed=0, gpu_price=2.5, egress_price=0.09).summary
  assert s["sim_time_s"] > 0 and s["sent_bytes"] > 0  # something to price
  # sent_bytes counts every worker's bytes: the per-worker ones sum to it.
  assert s["sent_bytes"] == sum(s["sent_bytes_per_worker"])
  hours, gb, compute, traffic = _hand(s, 2.5, 0.09)
  assert s["gpu_hours"] == pytest.approx(hours, rel=1e-12)
  assert s["traffic_gb"] == pytest.approx(gb, rel=1e-12)
  assert s["compute_cost_usd"] == pytest.approx(compute, rel=1e-12)
  assert s["traffic_cost_usd"] == pytest.approx(traffic, rel=1e-12)
  assert s["cost_usd"] == pytest.approx(compute + traffic, rel=1e-12)


def test_without_prices_no_dollars(sim):
  s = sim.run(seed=0).summary
  hours, gb, _, _ = _hand(s, 0, 0)
  assert s["gpu_hours"] == pytest.approx(hours, rel=1e-12)
  assert s["traffic_gb"] == pytest.approx(gb, rel=1e-12)
  assert not set(COST_KEYS) & set(s)


def test_one_price_prices_its_part_only(sim):
  s = sim.run(seed=0, egress_price=0.12).summary
  assert "compute_cost_usd" not in s
  assert s["traffic_cost_usd"] == pytest.approx(
      s["sent_bytes"] / 1e9 * 0.12, rel=1e-12)
  assert s["cost_usd"] == s["traffic_cost_usd"]


def test_simulate_passes_the_config_prices_and_writes_them(tmp_path):
  out = tmp_path / "run"
  r = lowbw.simulate(**SMALL, gpu_price=4.0, out=str(out))
  written = json.loads((out / "summary.json").read_text())
  hours = 2 * written["sim_time_s"] / 3600
  assert written["compute_cost_usd"] == pytest.approx(4.0 * hours, rel=1e-12)
  assert r.summary["cost_usd"] == written["cost_usd"]
  assert "gpu_price: 4.0" in (out / "config.yaml").read_text()


def test_without_the_clock_traffic_only(tmp_path):
  r = lowbw.simulate(**SMALL, clock=False, egress_price=1.0)
  s = r.summary
  assert s["sim_time_s"] is None and s["gpu_hours"] is None
  assert s["cost_usd"] == pytest.approx(s["sent_bytes"] / 1e9, rel=1e-12)


@pytest.mark.parametrize("field,value,text", [
    ("gpu_price", -1.0, "gpu_price=-1.0 is invalid: expected a price in "
     "dollars per GPU-hour: a finite number >= 0"),
    ("egress_price", -0.01, "egress_price=-0.01 is invalid: expected a price "
     "in dollars per GB sent"),
    ("gpu_price", "cheap", "gpu_price='cheap' is invalid: expected a price"),
    ("gpu_price", "2.5", "gpu_price='2.5' is invalid: expected a number"),
    ("egress_price", float("inf"), "egress_price=inf is invalid"),
    ("egress_price", float("nan"), "egress_price=nan is invalid"),
    ("gpu_price", [1.0], "gpu_price=[1.0] is invalid"),
])
def test_bad_prices_are_one_line_errors_naming_the_field(field, value, text):
  with pytest.raises(lowbw.ConfigError) as e:
    lowbw.Config(**{field: value})
  assert str(e.value).startswith(text) and "\n" not in str(e.value)
  assert e.value.field == field


def test_gpu_price_needs_the_clock():
  with pytest.raises(lowbw.ConfigError, match="gpu_price=2.0 is invalid: "
                     "needs the simulated clock"):
    lowbw.Config(**SMALL, clock=False, gpu_price=2.0)


def test_simulator_run_checks_its_prices(sim):
  with pytest.raises(lowbw.ConfigError, match="egress_price=-3 is invalid"):
    sim.run(seed=0, egress_price=-3)
  with pytest.raises(lowbw.ConfigError, match="gpu_price=True is invalid"):
    sim.run(seed=0, gpu_price=True)


def test_cli_train_prints_the_cost_line(tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(["train", "--model", "mlp", "--data", "digits",
                   "--hidden", "8", "--workers", "2", "--steps", "8",
                   "--batch-size", "8", "--strategy", "diloco", "--H", "4",
                   "--eval-examples", "64", "--no-plot", "--out", str(out),
                   "--gpu-price", "3", "--egress-price", "0.5"]) == 0
  printed = capsys.readouterr().out
  s = json.loads((out / "summary.json").read_text())
  hours, gb, compute, traffic = _hand(s, 3.0, 0.5)
  line = next(l for l in printed.splitlines() if l.startswith("  cost "))
  assert f"{hours:.4g} GPU-hours at $3.00/GPU-hour" in line
  assert f"{gb:.4g} GB sent at $0.50/GB" in line
  assert s["cost_usd"] == pytest.approx(compute + traffic, rel=1e-12)


@pytest.mark.parametrize("flags,err", [
    (["--gpu-price", "-1"], "--gpu-price='-1' is invalid: expected a price"),
    (["--egress-price", "free"], "--egress-price='free' is invalid"),
    (["--no-clock", "--gpu-price", "1"], "--gpu-price=1.0 is invalid: needs "
     "the simulated clock"),
])
def test_cli_train_bad_prices(flags, err, capsys):
  assert cli.main(["train", "--model", "mlp", "--data", "digits",
                   "--strategy", "ddp", "--steps", "8", *flags]) == 2
  text = capsys.readouterr().err
  assert text.startswith("lowbw: error: " + err) and text.count("\n") == 1


# ------------------------------------------------------------------- plan


def _plan_traffic(out, s):
  """The plan's bytes sent, from its own outputs: each model copy uploads
  sync_bits per sync, pipelines move activation_bits across each stage
  boundary per inner step; all stretched by 1 / efficiency."""
  mode = out["mode"]
  copies = {"diloco": s["num_nodes"], "pp_group_diloco": out["groups"],
            "pp_over_wan": 0,
            "hierarchical_diloco": s["num_nodes"] * s["regional_steps"]
            + s["num_nodes"] / s["nodes_per_group"]}[mode]
  sent = out["outer_steps"] * copies * out["sync_bits"] / 8
  if out["pipeline_stages"] > 1:
    sent += (out["replicas"] * (out["pipeline_stages"] - 1)
             * out["total_steps"] * out["activation_bits"] / 8)
  return sent / out["efficiency"]


@pytest.mark.parametrize("inputs,mode", [
    ({}, "diloco"),
    ({"hierarchical": True}, "hierarchical_diloco"),
    ({"parameters": 300}, "pp_group_diloco"),
    ({"parameters": 300, "num_nodes": 4}, "pp_over_wan"),
])
def test_plan_figures_are_the_hand_computation(inputs, mode):
  out = plan(**inputs, gpu_price=2.0, egress_price=0.05)
  s = {"num_nodes": 72, "regional_steps": 16, "nodes_per_group": 8,
       **inputs}
  assert out["mode"] == mode
  hours = s["num_nodes"] * out["total_days"] * 24
  gb = _plan_traffic(out, s) / 1e9
  assert out["gpu_hours"] == pytest.approx(hours, rel=1e-12)
  assert out["traffic_gb"] == pytest.approx(gb, rel=1e-12) and gb > 0
  assert out["compute_cost_usd"] == pytest.approx(2.0 * hours, rel=1e-12)
  assert out["traffic_cost_usd"] == pytest.approx(0.05 * gb, rel=1e-12)
  assert out["cost_usd"] == pytest.approx(2.0 * hours + 0.05 * gb,
                                          rel=1e-12)


def test_plan_default_traffic_from_the_documented_numbers():
  # 72 nodes each send 144e9 parameters x 16 bits / 16 = 18 GB per sync,
  # D / (B N H) syncs, over the efficiency.
  out = plan()
  syncs = 12e12 / (131072 * 72 * 128)
  assert out["traffic_gb"] == pytest.approx(
      72 * syncs * 18 / out["efficiency"], rel=1e-12)
  assert not set(COST_KEYS) & set(out)


def test_plan_bad_prices():
  with pytest.raises(ValueError, match=r"^gpu_price=-2 is invalid: "
                     "expected a price"):
    plan(gpu_price=-2)
  with pytest.raises(ValueError, match="egress_price='x' is invalid"):
    plan(egress_price="x")


def test_cli_plan_prints_the_cost(capsys):
  assert cli.main(["plan", "--gpu-price", "2", "--egress-price",
                   "0.09"]) == 0
  text = capsys.readouterr().out
  out = plan(gpu_price=2.0, egress_price=0.09)
  assert text.splitlines()[0].endswith(f", ${out['cost_usd']:,.2f}")
  for key in ("gpu_hours", "traffic_gb", "compute_cost_usd",
              "traffic_cost_usd", "cost_usd"):
    assert f"  {key} " in text
  assert cli.main(["plan", "--json", "--gpu-price", "2"]) == 0
  data = json.loads(capsys.readouterr().out)
  assert data["inputs"]["gpu_price"] == 2.0
  assert data["outputs"]["cost_usd"] == pytest.approx(
      2.0 * 72 * out["total_days"] * 24, rel=1e-12)
  assert cli.main(["plan", "--sweep", "num_nodes=8,72", "--gpu-price",
                   "1"]) == 0
  assert capsys.readouterr().out.splitlines()[0].split()[-1] == "cost_usd"


@pytest.mark.parametrize("flags,err", [
    (["--gpu-price", "-1"], "--gpu-price='-1' is invalid: expected a price"),
    (["--egress-price", "lots"], "--egress-price='lots' is invalid"),
])
def test_cli_plan_bad_prices(flags, err, capsys):
  assert cli.main(["plan", *flags]) == 2
  text = capsys.readouterr().err
  assert text.startswith("lowbw: error: " + err) and text.count("\n") == 1


@pytest.mark.parametrize("points_per_batch", [1, 2])
def test_study_points_are_priced(points_per_batch, tmp_path):
  # One point at a time runs as lowbw.simulate; two at once as one vmapped
  # program: each point's summary (and its summary.json) priced the same.
  base = lowbw.Config(**SMALL, gpu_price=1.5, egress_price=0.2)
  result = lowbw.study(base, {"inner_lr": [1e-3, 3e-3]}, out=str(tmp_path),
                       points_per_batch=points_per_batch)
  written = sorted(tmp_path.glob("**/summary.json"))
  assert len(written) == len(result.points) == 2
  for s in [p.summary for p in result.points] + [
      json.loads(w.read_text()) for w in written]:
    _, _, compute, traffic = _hand(s, 1.5, 0.2)
    assert s["cost_usd"] == pytest.approx(compute + traffic, rel=1e-12)

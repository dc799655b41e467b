"""A network or hardware whose run the simulated clock cannot count is
refused when the run is built, naming the setting; a clock that overflows
anyway is a warning of the run, never a silent infinite sim_time_s."""

import math

import numpy as np
import pytest

import lowbw
from lowbw import cli, data, models, network, strategies
from lowbw.network import _clock

_RUN = dict(model=models.mlp(hidden=(8,)), data=data.digits(),
            strategy=strategies.diloco(H=5), workers=2, batch_size=4,
            steps=10)
_TINY = ["train", "--data", "digits", "--hidden", "8", "--workers", "2",
         "--batch-size", "4", "--steps", "10", "--H", "5", "--eval-every",
         "5", "--no-progress"]


def _build(net, **changes):
  return lowbw.build(**{**_RUN, **changes}, network=net, compile=False)


def _trace(tmp_path, name, row):
  path = tmp_path / name
  path.write_text("time,a,b\n0," + ",".join(row) + "\n")
  return str(path)


@pytest.mark.parametrize("make, field", [
    (lambda _: network.network("1e-300bps", "10ms", hardware="1s"),
     "bandwidth"),
    (lambda _: network.network("1Gbps", "1e300s", hardware="1s"), "latency"),
    (lambda _: network.network("1Gbps", "10ms", hardware="1e300s"),
     "hardware"),
    (lambda _: network.network("1Gbps", "10ms", hardware="1s",
                               speeds=[1, 1e-300]), "speeds"),
    (lambda p: network.network("1Gbps", "10ms", hardware="1s",
                               speeds=_trace(p, "s.csv", ["1", "1e-300"])),
     "speeds"),
    (lambda p: network.network(latency="10ms", hardware="1s",
                               bandwidth_trace=_trace(
                                   p, "b.csv", ["1Gbps", "1e-300bps"])),
     "bandwidth_trace"),
], ids=["bandwidth", "latency", "hardware", "speeds", "speed_trace",
        "bandwidth_trace"])
def test_a_clock_beyond_float32_is_refused_at_build(tmp_path, make, field):
  with pytest.raises(ValueError, match=f"^{field}=.*simulated time would "
                     r"reach .* over 10 steps.*below 1e\+30 s") as e:
    _build(make(tmp_path))
  assert "\n" not in str(e.value)


def test_the_bound_is_on_the_whole_run():
  """1e-20 bit/s is slow but countable over 10 steps; 1e10 steps of it
  are not."""
  net = network.network("1e-20bps", "10ms", hardware="1s")
  sim = _build(net)
  pricing = sim.pricing(sim.config.network)
  per_step = pricing.step_s + sum(c.seconds
                                  for c in pricing.clock_costs.values())
  assert 10 * per_step <= _clock.MAX_RUN_S < 1e10 * per_step
  _clock.check_clock_range(sim.config.network, pricing, 10)
  with pytest.raises(ValueError, match="^bandwidth="):
    _clock.check_clock_range(sim.config.network, pricing, 10 ** 10)


def test_a_swept_bandwidth_beyond_the_clock_is_refused():
  sim = _build(network.network("1Gbps", "10ms", hardware="1s"))
  with pytest.raises(ValueError, match="^bandwidth=.*simulated time"):
    sim.run(0, hparams={"bandwidth": "1e-300bps"})


def test_the_command_line_names_the_flag_and_exits_2(tmp_path, capsys):
  out = tmp_path / "run"
  assert cli.main(_TINY + ["--bandwidth", "1e-300bps", "--out",
                           str(out)]) == 2
  err = capsys.readouterr().err
  assert "--bandwidth='1e-300bps' is invalid: the run's simulated time" in err
  assert not out.exists()


def test_a_clock_that_overflows_anyway_is_an_error_or_a_warning(monkeypatch):
  """With the build's check switched off, the float32 clock of a 1e-300
  bit/s link overflows: the run says so instead of ending in silence (an
  error, NonFiniteModelError, unless allow_non_finite keeps the run)."""
  monkeypatch.setattr(_clock, "check_clock_range", lambda *a: None)
  net = network.network("1e-300bps", "10ms", hardware="1s")
  with pytest.raises(lowbw.NonFiniteModelError,
                     match="a non-finite simulated time"):
    lowbw.simulate(**_RUN, network=net, progress=False)
  with pytest.warns(lowbw.RunWarning, match="simulated time is inf"):
    result = lowbw.simulate(**_RUN, network=net, progress=False,
                            allow_non_finite=True)
  assert not math.isfinite(result.summary["sim_time_s"])
  assert any("clock overflowed" in w for w in result.summary["warnings"])
  assert np.isfinite(result.summary["final_train_loss"])


def test_an_absurd_message_size_shows_in_the_link_error(capsys):
  # A clock-only model of 1e30 billion parameters makes a sound 1 Gbit/s
  # link "too slow"; the error says how many bytes it was given, so the
  # size, not the link, is seen to be wrong.
  assert cli.main(_TINY + ["--clock-params", "1e30B"]) == 2
  err = capsys.readouterr().err
  assert "--bandwidth=" in err and "sending 4e+39 bytes per worker" in err


@pytest.mark.parametrize("where, says", [
    ("folder", "is a folder"), ("/dev/null", "is not a regular file"),
    ("notes.txt", "is a file without the .csv suffix a trace needs")])
def test_speeds_naming_a_path_that_is_no_trace_says_what_is_there(
    tmp_path, where, says):
  path = {"folder": str(tmp_path), "/dev/null": "/dev/null",
          "notes.txt": str(tmp_path / "notes.txt")}[where]
  (tmp_path / "notes.txt").write_text("1,2\n")
  with pytest.raises(ValueError, match=f"^speeds=.* {says}; expected "
                     "comma-separated numbers > 0, one per worker, or a "
                     r"\.csv trace file"):
    network.hardware("a100", speeds=path)


@pytest.mark.parametrize("flags, says", [
    (["--mfu", "1e-300"], "--mfu='1e-300' is invalid"),
    (["--hardware", "1e-300TFLOPS"], "--hardware='1e-300TFLOPS' is invalid"),
    (["--speeds", "1e-300,1"], "--speeds='1e-300' is invalid")])
def test_a_compute_beyond_the_clock_names_the_value_given(flags, says,
                                                         capsys):
  # The setting the user typed, with the step time it makes in the message
  # (an MFU of 1e-300 was reported as hardware='1.5e+289 s per step').
  assert cli.main(_TINY + flags) == 2
  err = capsys.readouterr().err
  assert says in err and " s per step, beyond what the simulated clock" in err


def test_an_evaluation_that_is_not_finite_is_an_error_or_a_warning():
  # Training stops on a non-finite training loss; an evaluation's NaN used
  # to end the run with exit 0 in silence. Rows without an evaluation leave
  # its column out, so only an evaluation's own NaN is reported.
  import jax.numpy as jnp
  mlp = models.mlp(hidden=(8,))

  def loss(params, batch, key):
    value, metrics = mlp.loss(params, batch, key)
    # The evaluation batch (eval_examples=32) is the only one of 32 rows.
    return (jnp.where(batch["x"].shape[0] == 32, jnp.nan, value),
            metrics)

  run = dict(**{**_RUN, "model": (mlp.init, loss)}, eval_every=5,
             eval_examples=32, progress=False)
  with pytest.raises(lowbw.NonFiniteModelError,
                     match="a non-finite final evaluation loss"):
    lowbw.simulate(**run)
  with pytest.warns(lowbw.RunWarning, match="eval_loss is nan from step 5"):
    result = lowbw.simulate(**run, allow_non_finite=True)
  assert np.isfinite(result.summary["final_train_loss"])

"""A run that ends with a broken model never passes in silence: a
non-finite final model, final evaluation or simulated time is an error
(exit code 3, after the logs) unless asked to keep it; every way a run
ends writes a summary.json saying how."""

import json

import pytest

import lowbw
from lowbw import cli

BASE = dict(data="digits", workers=2, batch_size=4, hidden="8", steps=4,
            eval_every=4, eval_examples=32, devices=1, progress=False)
# DDP with SGD at a rate of 1e38 for one step: the training loss of that
# step is finite, the model after it is not.
BLOWN_DDP = dict(BASE, strategy="ddp", inner="sgd", inner_lr=1e38, steps=1,
                 eval_every=1)
# DiLoCo whose last sync, at the last step, takes an outer rate of 1e38.
BLOWN_SYNC = dict(BASE, strategy="diloco", H=2, steps=2, eval_every=2,
                  outer_lr=1e38)


@pytest.mark.parametrize("settings", [BLOWN_DDP, BLOWN_SYNC],
                         ids=["ddp_last_step", "diloco_last_sync"])
def test_a_non_finite_final_model_is_an_error_with_its_summary(settings,
                                                               tmp_path):
  out = tmp_path / "run"
  with pytest.raises(lowbw.NonFiniteModelError,
                     match="the run ended with a non-finite final "
                     "(model|evaluation loss).*allow_non_finite") as e:
    lowbw.simulate(lowbw.Config(**settings, out=str(out)))
  summary = json.loads((out / "summary.json").read_text())
  assert summary["ended"] == "non_finite_model"
  assert e.value.summary["ended"] == "non_finite_model"
  assert (out / "metrics.csv").exists() and (out / "params.npz").exists()
  # Asked to keep it: a warning, and the summary says it completed.
  with pytest.warns(lowbw.RunWarning, match="non-finite final"):
    kept = lowbw.simulate(lowbw.Config(**settings, allow_non_finite=True))
  assert kept.summary["ended"] == "completed"
  assert "ended with a non-finite final" in kept.summary["warnings"][-1]


def test_the_command_line_exits_3_with_one_line(tmp_path, capsys):
  out = tmp_path / "run"
  code = cli.main(["train", "--strategy", "ddp", "--data", "digits",
                   "--hidden", "8", "--workers", "2", "--batch-size", "4",
                   "--steps", "1", "--eval-every", "1", "--inner", "sgd",
                   "--inner-lr", "1e38", "--no-progress", "--out", str(out)])
  err = capsys.readouterr().err
  assert code == 3 and err.count("\n") == 1, err
  assert err.startswith("lowbw: error: the run ended with a non-finite "
                        "final")
  assert "--allow-non-finite" in err


def test_a_run_stopped_by_a_non_finite_loss_writes_its_summary(tmp_path):
  out = tmp_path / "run"
  with pytest.raises(lowbw.NonFiniteLossError):
    lowbw.simulate(lowbw.Config(**{**BASE, "steps": 6, "eval_every": 2},
                                strategy="ddp", inner="sgd", inner_lr=1e38,
                                out=str(out)))
  summary = json.loads((out / "summary.json").read_text())
  assert summary["ended"] == "non_finite_loss"
  assert summary["stopped_at_step"] >= 2


def test_a_healthy_run_says_it_completed(tmp_path):
  out = tmp_path / "run"
  lowbw.simulate(lowbw.Config(**BASE, strategy="diloco", H=2, out=str(out)))
  assert json.loads((out / "summary.json").read_text())["ended"] == (
      "completed")


def test_allow_non_finite_takes_true_or_false_only():
  with pytest.raises(ValueError, match="^allow_non_finite='yes' is invalid: "
                     "expected true or false"):
    lowbw.Config(**BASE, strategy="ddp", allow_non_finite="yes")
  sim = lowbw.build(lowbw.Config(**BASE, strategy="ddp"), compile=False)
  with pytest.raises(ValueError, match="^allow_non_finite="):
    sim.run(seed=0, allow_non_finite=1)

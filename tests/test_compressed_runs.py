"""MuLoCo and DeMo end to end on the default GPT (Python API and CLI), and a
compressed run's logged bytes."""

import json

import jax

import numpy as np
import pytest

import lowbw
from lowbw import cli, data, models, strategies, transforms

GPT_RUNS = {"muloco": dict(steps=30, eval_every=30),  # H = 30: one sync
            "demo": dict(steps=4, eval_every=2)}
# The API runs on the default GPT: MuLoCo's period only says when its one
# sync comes (its channel is the model's and the codec's), so H = 2 and two
# steps of the default GPT make the same sync as 30 steps of H = 30.
API_RUNS = {"muloco": (dict(H=2), dict(steps=2, eval_every=2)),
            "demo": ({}, GPT_RUNS["demo"])}


@pytest.mark.parametrize("name", sorted(GPT_RUNS))
def test_runs_on_the_default_gpt(name):
  settings, run = API_RUNS[name]
  strategy = strategies.get(name, **settings)
  result = lowbw.simulate(model=models.gpt(), data=data.text_bytes(),
                          strategy=strategy, workers=2, batch_size=2,
                          eval_examples=4, progress=False, **run)
  h = result.history
  assert np.all(np.isfinite(h["train_loss"]))
  assert np.isfinite(result.summary["final_eval_loss"])
  (channel,) = strategy.channels(result.params, 2).values()
  events = 1 if name == "muloco" else run["steps"]
  assert h["payload_bytes"][-1] == events * channel.payload_bytes
  assert h["wire_bytes"][-1] == pytest.approx(events * channel.wire_bytes)
  assert channel.collective == "all_gather"


@pytest.mark.parametrize("name", sorted(GPT_RUNS))
def test_cli_runs_on_a_small_model(name, tmp_path, capsys):
  run = GPT_RUNS[name]
  out = tmp_path / name
  # A small MLP: the API test above trains the default GPT; this one
  # checks what the command line passes on.
  assert cli.main(["train", "--strategy", name, "--workers", "2",
                   "--data", "digits", "--hidden", "8",
                   "--batch-size", "2", "--steps", str(run["steps"]),
                   "--eval-every", str(run["eval_every"]),
                   "--eval-examples", "4", "--no-progress",
                   "--out", str(out)]) == 0
  printed = capsys.readouterr().out
  assert "all_gather" in printed and "final eval loss" in printed
  config = json.loads((out / "config.json").read_text())
  expected = {"muloco": "quant:2:statistical:muloco", "demo": "dct:64:32"}[name]
  assert config["strategy"]["codec"] == expected
  if name == "muloco":
    assert config["strategy"]["error_feedback"] == 0.9
    assert config["strategy"]["H"] == 30
    # The paper's warm-up and cosine: the rate is set every step from the
    # peak, which config.json records.
    hyper = config["strategy"]["inner"]["hyperparams"]
    assert hyper["peak_lr"] == pytest.approx(2.6827e-3)
    assert hyper["learning_rate"] == 0.0


def test_cli_codec_and_feedback_reach_the_strategy(tmp_path):
  out = tmp_path / "run"
  assert cli.main(["train", "--data", "digits", "--hidden", "8", "--workers",
                   "2", "--batch-size", "4", "--steps", "10", "--H", "5",
                   "--eval-every", "5", "--codec", "topk:0.1,quant:4",
                   "--ef", "0.7", "--no-progress", "--out", str(out)]) == 0
  config = json.loads((out / "config.json").read_text())
  assert config["strategy"]["codec"] == "topk:0.1,quant:4"
  assert config["strategy"]["error_feedback"] == 0.7
  summary = json.loads((out / "summary.json").read_text())
  params = models.mlp(hidden=(8,)).init(jax.random.PRNGKey(0),
                                        data.digits().example_batch(2))
  codec = transforms.parse_codec("topk:0.1,quant:4")
  assert summary["payload_bytes"] == 2 * transforms.payload_nbytes(codec,
                                                                   params)

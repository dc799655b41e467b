"""A trained model back out: prepare -> train -> ``lowbw.load`` ->
``lowbw generate`` / ``lowbw eval``, on a small text fixture (one training
run for the module)."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowbw
from lowbw import cli, data
from lowbw.models._generate import generate

STORY = ("The little robot rolled into the garden. It saw a red flower and "
         "a blue bird. The bird sang a song and the robot listened.")
TINY = ["--layers", "1", "--d-model", "32", "--heads", "2", "--seq-len", "16"]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
  root = tmp_path_factory.mktemp("roundtrip")
  corpus = root / "stories.txt"
  corpus.write_text("\n\n".join(f"{STORY} Day {i}." for i in range(40)))
  assert cli.main(["data", "prepare", str(corpus), "--out",
                   str(root / "data"), "--vocab-size", "300",
                   "--no-progress"]) == 0
  run = root / "run"
  assert cli.main(["train", "--data", str(root / "data"), "--steps", "20",
                   "--H", "10", "--workers", "2", "--batch-size", "4",
                   "--out", str(run), "--no-plot", "--checkpoint-every", "10",
                   *TINY]) == 0
  return root, run


def test_load_gives_the_model_its_final_params_history_and_tokenizer(
    trained):
  _, run_dir = trained
  run = lowbw.load(run_dir)
  assert run.model.name == "gpt" and run.model.config["vocab"] == 300
  assert run.step == 20 and run.history["step"][-1] == 20
  assert np.isfinite(run.history["train_loss"]).all()
  assert run.summary["steps"] == 20  # summary.json came along
  text = "The bird sang."
  assert run.tokenizer.decode_ids(run.tokenizer.encode_ids(text)) == text
  tokens = np.asarray([run.tokenizer.encode_ids(STORY)[:16]], np.int32)
  logits = run.model.apply(run.params, tokens)
  assert logits.shape == (1, 16, 300) and np.isfinite(logits).all()


def test_a_checkpointed_step_loads_other_params(trained):
  _, run_dir = trained
  final, middle = lowbw.load(run_dir), lowbw.load(run_dir, step=10)
  assert middle.step == 10
  diff = [float(np.abs(a - b).max()) for a, b in zip(
      _leaves(final.params), _leaves(middle.params))]
  assert max(diff) > 0
  with pytest.raises(ValueError, match="kept steps"):
    lowbw.load(run_dir, step=7)


def _leaves(tree):
  return [np.ravel(x) for x in jax.tree.leaves(tree)]


def test_greedy_generation_matches_a_plain_loop(trained):
  _, run_dir = trained
  run = lowbw.load(run_dir)
  prompt = run.tokenizer.encode_ids("The little robot")
  got = generate(run.model, run.params, prompt, max_tokens=20,
                 temperature=0)
  ids = list(prompt)
  apply = jax.jit(run.model.apply)
  for _ in range(20):  # the reference: the whole context, argmax, append
    window = np.asarray([ids[-16:]], np.int32)
    ids.append(int(jnp.argmax(apply(run.params, window)[0, -1])))
  assert got == ids[len(prompt):]


def test_sampling_is_seeded_and_respects_top_k(trained):
  _, run_dir = trained
  run = lowbw.load(run_dir)
  prompt = run.tokenizer.encode_ids("The bird")
  a = generate(run.model, run.params, prompt, 12, temperature=1.0, seed=5)
  b = generate(run.model, run.params, prompt, 12, temperature=1.0, seed=5)
  c = generate(run.model, run.params, prompt, 12, temperature=1.0, seed=6)
  assert a == b and a != c
  one = generate(run.model, run.params, prompt, 12, temperature=1.0,
                 top_k=1, seed=9)
  assert one == generate(run.model, run.params, prompt, 12, temperature=0)


def test_the_generate_command_continues_the_prompt(trained, capsys):
  _, run_dir = trained
  assert cli.main(["generate", str(run_dir), "--prompt", "The little",
                   "--max-tokens", "10", "--seed", "1"]) == 0
  first = capsys.readouterr().out
  assert first.startswith("The little") and len(first) > len("The little")
  assert cli.main(["generate", str(run_dir), "--prompt", "The little",
                   "--max-tokens", "10", "--seed", "1"]) == 0
  assert capsys.readouterr().out == first


def test_a_long_generation_shows_its_pace_on_a_terminal(trained, capsys,
                                                        monkeypatch):
  # One token at a time, for as many as asked: on a terminal a bar on
  # stderr counts them (a billion tokens used to wait without a word);
  # stdout keeps only the text, the same as without the bar.
  from lowbw.telemetry import _progress
  _, run_dir = trained
  argv = ["generate", str(run_dir), "--prompt", "The little",
          "--max-tokens", "6", "--seed", "1"]
  assert cli.main(argv) == 0
  plain = capsys.readouterr()
  monkeypatch.setattr(_progress, "is_terminal", lambda: True)
  assert cli.main(argv) == 0
  shown = capsys.readouterr()
  assert shown.out == plain.out and "generate" not in plain.err
  assert "generate" in shown.err and "6/6" in shown.err


def test_eval_scores_the_run_on_a_prepared_dataset(trained, capsys):
  root, run_dir = trained
  assert cli.main(["eval", str(run_dir), "--data", str(root / "data"),
                   "--json"]) == 0
  out = json.loads(capsys.readouterr().out)
  assert out["eval_loss"] > 0
  assert out["eval_perplexity"] == pytest.approx(np.exp(out["eval_loss"]))
  summary = json.loads((run_dir / "summary.json").read_text())
  # The run's own evaluation at its end scored the same held-out windows.
  assert out["eval_loss"] == pytest.approx(summary["final_eval_loss"],
                                           rel=1e-5)


def test_eval_refuses_data_of_another_tokenizer_or_task(trained, tmp_path,
                                                        capsys):
  root, run_dir = trained
  other = tmp_path / "other.txt"
  other.write_text("\n\n".join(f"Other words entirely, number {i}." * 5
                               for i in range(30)))
  data.prepare(other, tmp_path / "other", vocab_size=290)
  assert cli.main(["eval", str(run_dir), "--data",
                   str(tmp_path / "other")]) == 2
  assert "tokenizer.json" in capsys.readouterr().err
  assert cli.main(["eval", str(run_dir), "--data", "digits"]) == 2
  assert "classification data" in capsys.readouterr().err


def test_generate_refuses_a_classifier_and_bad_settings(tmp_path, capsys):
  lowbw.simulate(lowbw.Config(data="digits", strategy="ddp", steps=3,
                              workers=2, out=str(tmp_path / "mlp")))
  run = lowbw.load(tmp_path / "mlp")
  assert run.tokenizer is None and run.model.apply(
      run.params, np.zeros((2, 8, 8, 1), np.float32)).shape == (2, 10)
  assert cli.main(["generate", str(tmp_path / "mlp")]) == 2
  assert "not a language model" in capsys.readouterr().err
  assert cli.main(["generate", str(tmp_path)]) == 2
  assert "config.json" in capsys.readouterr().err


def test_the_api_run_saves_what_load_reads(tmp_path):
  result = lowbw.simulate(lowbw.Config(data="digits", strategy="ddp",
                                       steps=3, workers=2,
                                       out=str(tmp_path / "r")))
  run = lowbw.load(tmp_path / "r")
  for a, b in zip(jax.tree.leaves(result.params), jax.tree.leaves(run.params)):
    np.testing.assert_array_equal(np.asarray(a), b)


@pytest.mark.parametrize("kwargs, words", [
    ({"max_tokens": 0}, "max_tokens"),
    ({"temperature": -1.0}, "temperature"),
    ({"top_k": 0}, "top_k"),
    ({"prompt_ids": [300]}, "vocabulary"),
    ({"prompt_ids": []}, "at least one"),
])
def test_generation_settings_are_checked_before_anything_runs(trained,
                                                              kwargs, words):
  _, run_dir = trained
  run = lowbw.load(run_dir)
  args = {"prompt_ids": [1, 2], **kwargs}
  prompt = args.pop("prompt_ids")
  with pytest.raises(ValueError, match=words):
    generate(run.model, run.params, prompt, **args)


def test_generate_names_a_truncated_or_foreign_params_file(trained, tmp_path,
                                                           capsys):
  _, run_dir = trained
  copy = tmp_path / "run"
  shutil.copytree(run_dir, copy)
  whole = (run_dir / "params.npz").read_bytes()
  (copy / "params.npz").write_bytes(whole[:len(whole) // 2])
  for argv in (["generate", str(copy)],
               ["eval", str(copy), "--data", str(trained[0] / "data")]):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"lowbw: error: run_dir={str(copy)!r} is invalid: "
                          "its params.npz is not a readable .npz"), err
  np.savez(copy / "params.npz", **{"['Dense_0']['kernel']": np.ones((3, 2))})
  assert cli.main(["generate", str(copy)]) == 2
  err = capsys.readouterr().err.strip()
  assert "its params.npz does not fit the model in its config.json" in err
  assert len(err.splitlines()) == 1

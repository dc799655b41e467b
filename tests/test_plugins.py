"""A user's codec, model and strategy, registered once in a module named by
LOWBW_PLUGINS, are names like the built-in ones: in lowbw.Config, a config
file, lowbw train and lowbw sweep (whose processes inherit the variable)."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

import lowbw

PLUGIN = pathlib.Path(__file__).with_name("plugin_parts.py")
SETTINGS = dict(strategy="my_avg", shrink=0.5, codec="absmax8",
                model="tiny_mlp", data="digits", workers=2, steps=8,
                batch_size=4, eval_examples=16, devices=1)

# Runs in a fresh process with LOWBW_PLUGINS set: the API, a config file,
# lowbw train and lowbw sweep; prints what the test compares.
SCRIPT = """
import json, sys, numpy as np, yaml
import lowbw
from lowbw import cli, telemetry
settings, out = json.loads(sys.argv[1]), sys.argv[2]
api = lowbw.simulate(lowbw.Config(**settings, progress=False))
with open(out + "/run.yaml", "w") as f:
  yaml.safe_dump(settings, f)
from_file = lowbw.simulate(lowbw.Config.load(out + "/run.yaml", progress=False))
flags = ["--" + k.replace("_", "-") + "=" + str(v) for k, v in settings.items()]
assert cli.main(["train", *flags, "--no-progress", "--out", out + "/cli"]) == 0
from_cli = telemetry.load_params(out + "/cli", like=api.params)
assert cli.main(["sweep", *flags, "--grid", "codec=absmax8,topk:0.5",
                 "--no-progress", "--out", out + "/sweep"]) == 0
import jax
same = all(bool((np.asarray(a) == np.asarray(b)).all())
           for other in (from_file.params, from_cli)
           for a, b in zip(jax.tree.leaves(api.params), jax.tree.leaves(other)))
print(json.dumps({"same": same,
                  "payload": float(api.history["payload_bytes"][-1]),
                  "strategy": repr(lowbw.strategies.get("my_avg", shrink=0.5))}))
"""


def _run(code, tmp_path, *args, plugins=str(PLUGIN)):
  env = dict(os.environ, LOWBW_PLUGINS=plugins, JAX_PLATFORMS="cpu")
  return subprocess.run([sys.executable, "-c", code, *args], env=env,
                        capture_output=True, text=True, timeout=600,
                        cwd=str(tmp_path))


def test_registered_parts_run_from_the_api_a_file_train_and_sweep(tmp_path):
  done = _run(SCRIPT, tmp_path, json.dumps(SETTINGS), str(tmp_path))
  assert done.returncode == 0, done.stderr[-3000:]
  got = json.loads(done.stdout.strip().splitlines()[-1])
  assert got["same"], "the API, the file and lowbw train differ"
  # absmax8: one int8 per parameter and a float32 scale per tensor, each
  # of the 2 syncs; tiny_mlp has 64*4+4 + 4*10+10 parameters in 4 tensors.
  params, tensors = 64 * 4 + 4 + 4 * 10 + 10, 4
  assert got["payload"] == 2 * (params + 4 * tensors)
  written = (tmp_path / "cli" / "config.yaml").read_text()
  for line in ("strategy: my_avg", "codec: absmax8", "model: tiny_mlp",
               "shrink: 0.5"):
    assert line in written, written
  table = (tmp_path / "sweep" / "study.csv").read_text()
  assert "absmax8" in table and "topk:0.5" in table


def test_a_plugin_that_cannot_be_imported_is_one_line_naming_the_variable(
    tmp_path):
  done = _run("import lowbw", tmp_path, plugins="no_such_module_here")
  assert done.returncode != 0
  assert ("LOWBW_PLUGINS='no_such_module_here' is invalid: could not be "
          "imported") in done.stderr, done.stderr[-2000:]


@pytest.mark.parametrize("call, words", [
    (lambda: lowbw.transforms.register_codec("topk", lambda a: None),
     "built-in codec stage"),
    (lambda: lowbw.transforms.register_codec("bad name", lambda a: None),
     "letters, digits and _"),
    (lambda: lowbw.transforms.register_codec("mine", 3), "a Codec or a func"),
    (lambda: lowbw.models.register("gpt", lambda: None), "built-in model"),
    (lambda: lowbw.models.register("mine", 3), "a function returning"),
    (lambda: lowbw.strategies.register(lowbw.strategies.spec("diloco")),
     "built-in strategy"),
    (lambda: lowbw.strategies.register("diloco"), "lowbw.strategies.Spec"),
])
def test_registering_over_a_built_in_or_a_wrong_thing_is_refused(call,
                                                                 words):
  with pytest.raises(lowbw.ConfigError, match=words):
    call()

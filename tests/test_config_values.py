"""``lowbw.Config`` takes the natural Python and YAML forms of a setting
where they are unambiguous: a list or tuple for a comma-separated setting, a
bare number for a text setting (in the field's unit for a quantity), and
keeps one form of each, so that files, tables and equality agree."""

import pytest

import lowbw

MLP = dict(data="digits", model="mlp")


@pytest.mark.parametrize("given, kept", [
    (dict(MLP, hidden=32), dict(hidden="32")),
    (dict(MLP, hidden=(32,)), dict(hidden="32")),
    (dict(MLP, hidden=[64, 64]), dict(hidden="64,64")),
    (dict(data="digits", model="cnn", channels=(8, 16)),
     dict(channels="8,16")),
    (dict(workers=2, bandwidth=["1Gbps", "100Mbps"]),
     dict(bandwidth="1Gbps,100Mbps")),
    (dict(workers=2, latency=("5ms", "80ms")), dict(latency="5ms,80ms")),
    (dict(workers=2, speeds=[1, 0.5]), dict(speeds="1,0.5")),
    (dict(byzantine=1), dict(byzantine="1")),
    (dict(byzantine=(0, 1)), dict(byzantine="0,1")),
    (dict(failures=["1@4", "2@8"]), dict(failures="1@4,2@8")),
])
def test_natural_values_are_kept_in_one_form(given, kept):
  config = lowbw.Config(**given)
  assert {k: getattr(config, k) for k in kept} == kept
  # The kept form means the same run: the config made from it is equal.
  assert lowbw.Config(**{**given, **kept}) == config


def test_a_list_of_bandwidths_is_the_same_links_as_their_text():
  def network(bandwidth):
    config = lowbw.Config(**MLP, workers=2, bandwidth=bandwidth)
    return config.built().checked["network"].topology

  assert (network(["1Gbps", "100Mbps"]) == network("1Gbps,100Mbps") !=
          network("1Gbps,1Gbps"))


def test_yaml_gives_natural_values(tmp_path):
  path = tmp_path / "run.yaml"
  path.write_text("data: digits\nmodel: mlp\nhidden: 32\nworkers: 2\n"
                  "bandwidth: [1Gbps, 100Mbps]\nspeeds: [1, 0.5]\n")
  config = lowbw.Config.load(str(path))
  assert (config.hidden, config.bandwidth, config.speeds) == (
      "32", "1Gbps,100Mbps", "1,0.5")


@pytest.mark.parametrize("given, field, words", [
    (dict(MLP, hidden=[]), "hidden", "at least one value"),
    (dict(MLP, hidden=[[1]]), "hidden", "a number or a string"),
    (dict(MLP, hidden=True), "hidden", "expected a string"),
    (dict(MLP, hidden=(0,)), "hidden", "positive integers"),
    (dict(H=[1]), "H", "not a list"),
    (dict(hardware=0.5), "hardware", "a preset"),
    # A bare number with no unit is ambiguous (50: seconds or ms?).
    (dict(latency=50), "latency", "needs its unit"),
    (dict(bandwidth=1e9), "bandwidth", "needs its unit"),
    (dict(workers=2, bandwidth=[1e9, "1Gbps"]), "bandwidth", "needs its unit"),
    (dict(strategy=["diloco"]), "strategy", "not a list"),
    (dict(H={"x": 1}), "H", "not a table"),
    (dict(strategy={"name": "diloco", "HH": 3}), "config",
     "did you mean 'strategy.H'"),
])
def test_values_that_are_not_natural_forms_are_refused(given, field, words):
  with pytest.raises(lowbw.ConfigError) as e:
    lowbw.Config(**given)
  assert e.value.field == field and words in str(e.value), str(e.value)


def test_a_study_grid_takes_natural_values_and_tables_one_form(tmp_path):
  base = lowbw.Config(**MLP, hidden=8, workers=2, steps=4, H=4, batch_size=4,
                      eval_examples=16, progress=False, devices=1)
  study = lowbw.study(base, grid={"hidden": [(16,), [8, 8], 32]},
                      out=str(tmp_path / "study"), progress=False)
  final = study.final(frame=False)
  assert list(final["hidden"]) == ["16", "8,8", "32"]
  assert list(final["failed"]) == [0, 0, 0]
  with pytest.raises(lowbw.ConfigError, match="given twice"):
    lowbw.study(base, grid={"hidden": [(16,), "16"]},
                out=str(tmp_path / "twice"), progress=False)


def test_train_help_lists_every_codec_stage_the_parser_takes(capsys):
  from lowbw import cli
  from lowbw.transforms import _codec_spec
  try:
    cli.main(["train", "--help"])
  except SystemExit:
    pass
  text = " ".join(capsys.readouterr().out.split())
  for name, stage in _codec_spec.STAGES.items():
    assert " ".join(stage.form.split()) in text, name
    # The form is what the parser takes: its example arguments parse.
  for spec in ("topk:0.1:chunk=64", "randk:0.1", "quant:4:statistical:muloco",
               "int8:chunk=64", "lowrank:2", "sign", "e3m0:chunk=32",
               "cast:e5m2", "dct:64:8"):
    assert lowbw.transforms.parse_codec(spec).name.split(":")[0] in (
        _codec_spec.STAGES), spec


@pytest.mark.parametrize("name", sorted(lowbw.strategies.SPECS))
def test_every_strategy_prints_the_call_it_describes(name):
  text = repr(lowbw.strategies.get(name))
  assert text.startswith(name + "(") and "function" not in text, text
  assert "<" not in text, text  # no object addresses


@pytest.mark.parametrize("old, new", [("num_workers", "workers"),
                                      ("log_dir", "out"),
                                      ("error_feedback", "ef")])
def test_a_setting_has_one_name_and_old_spellings_say_it(old, new, tmp_path):
  with pytest.raises(lowbw.ConfigError, match=f"did you mean {new!r}"):
    lowbw.Config(**{old: 1})
  path = tmp_path / "run.yaml"
  path.write_text(f"{old}: 1\n")
  with pytest.raises(lowbw.ConfigError, match=f"did you mean {new!r}"):
    lowbw.Config.load(str(path))


NESTED = """
strategy:
  name: diloco
  H: 4
  outer: {kind: adam, lr: 0.01}
model: {name: mlp, hidden: [8]}
data: digits
network: {bandwidth: 100Mbps}
workers: 2
"""
FLAT = dict(strategy="diloco", H=4, outer="adam", outer_lr=0.01,
            model="mlp", hidden="8", data="digits", bandwidth="100Mbps",
            workers=2)


def test_settings_have_paths_in_their_parts_and_files_may_nest_them(tmp_path):
  by_path = lowbw.Config(**{"strategy.name": "diloco", "strategy.H": 4,
                            "strategy.outer.kind": "adam",
                            "strategy.outer.lr": 0.01, "model.name": "mlp",
                            "model.hidden": (8,), "data.name": "digits",
                            "network.bandwidth": "100Mbps", "workers": 2})
  path = tmp_path / "nested.yaml"
  path.write_text(NESTED)
  nested = lowbw.Config.load(str(path))
  flat = lowbw.Config(**FLAT)
  assert by_path == nested == flat and by_path.values() == flat.values()
  # Short paths of the optimizers, and a factory's own keyword names.
  assert lowbw.Config(**{"outer.lr": 0.3}).outer_lr == 0.3
  assert lowbw.Config(**{"strategy.error_feedback": 0.5,
                         "codec": "quant:4"}).ef == 0.5
  with pytest.raises(lowbw.ConfigError, match="H is given twice"):
    lowbw.Config(**{"H": 4, "strategy.H": 8})


def test_a_grid_addresses_settings_by_path(tmp_path):
  base = lowbw.Config(**MLP, hidden=8, workers=2, steps=4, H=2, batch_size=4,
                      eval_examples=16, progress=False, devices=1)
  study = lowbw.study(base, grid={"strategy.H": [2, 4],
                                  "strategy.outer.lr": [0.5]},
                      out=str(tmp_path / "study"), progress=False)
  final = study.final(frame=False)
  assert sorted(final["H"]) == [2, 4] and set(final["outer_lr"]) == {0.5}


def test_lowbw_train_reads_a_nested_config_file(tmp_path):
  from lowbw import cli
  path = tmp_path / "nested.yaml"
  path.write_text(NESTED + "steps: 8\nbatch_size: 4\neval_examples: 16\n")
  assert cli.main(["train", "--config", str(path), "--H", "8",
                   "--no-progress", "--out", str(tmp_path / "run")]) == 0
  import yaml
  written = yaml.safe_load((tmp_path / "run" / "config.yaml").read_text())
  assert (written["H"], written["outer"], written["bandwidth"]) == (
      8, "adam", "100Mbps")  # the flag overrides the file's strategy.H

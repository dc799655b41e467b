"""Each strategy's spec is the one source of its parameters and defaults: the
factories, ``lowbw train`` and ``lowbw bench`` agree, and a new strategy is
one spec away from the command line."""

import json
import math

import jax.numpy as jnp
import numpy as np
import optax
import pytest

import lowbw
from lowbw import cli, strategies, transforms
from lowbw.config import _strategy_fields
from lowbw.cli import _bench, _train
from lowbw.strategies import _optim, _spec


def cli_strategy(*argv):
  args = cli.build_parser().parse_args(["train", *argv])
  s = _train.resolved(_train.settings(args))
  return _strategy_fields.build(s), s


@pytest.mark.parametrize("name", sorted(strategies.SPECS))
def test_the_command_line_builds_the_factory_defaults(name):
  """The factory's defaults, with its paper's inner schedule over the run's
  steps (which only the command line knows)."""
  spec = strategies.spec(name)
  from_cli, s = cli_strategy("--strategy", name)
  from_api = strategies.get(
      name, inner=strategies.paper_inner(name, s["steps"]),
      **{p.name: p.cli_default for p in spec.params
         if p.cli_default != p.default})
  assert from_cli.period == from_api.period
  assert json.dumps(from_cli.config, sort_keys=True) == json.dumps(
      from_api.config, sort_keys=True)


def test_the_bench_reads_the_same_defaults():
  args = cli.build_parser().parse_args(["bench", "--strategy", "muloco"])
  s = _bench._settings(args)
  assert _strategy_fields.build(s).config == strategies.muloco(
      inner=strategies.paper_inner("muloco", s["steps"])).config


def test_flags_override_the_spec_and_reach_the_factory():
  strategy, s = cli_strategy("--strategy", "sparta_diloco", "--H", "7",
                             "--p", "0.25", "--selector", "partitioned",
                             "--inner-lr", "0.01", "--outer-lr", "0.5",
                             "--codec", "quant:4", "--ef", "0.5")
  want = strategies.sparta_diloco(
      _optim.inner(_optim.Optimizer("adamw", 0.01, weight_decay=0.1)),
      _optim.outer(_optim.Optimizer("sgd", 0.5, momentum=0.9)), H=7, p=0.25,
      selector="partitioned", codec=transforms.quantize(4),
      error_feedback=0.5)
  assert strategy.config == want.config


def test_streaming_sends_the_papers_4_bit_floats_by_default():
  """Python's and the command line's default is E3M0 (the paper's
  outer-gradient format) with tau = 1; codec None / --codec none turns the
  codec off."""
  assert strategies.streaming_diloco().config["codec"] == "e3m0"
  assert strategies.streaming_diloco().config["delay"] == 1
  assert strategies.streaming_diloco(codec=None).config["codec"] is None
  # tau = 1 needs H/P >= 2; with one step per fragment there is no overlap.
  assert strategies.streaming_diloco(H=2, fragments=2).config["delay"] == 0
  strategy, _ = cli_strategy("--strategy", "streaming_diloco")
  assert strategy.config["codec"] == "e3m0"
  strategy, _ = cli_strategy("--strategy", "streaming_diloco", "--codec",
                             "none")
  assert strategy.config["codec"] is None


def test_hierarchical_flags_reach_both_outer_optimizers(capsys):
  strategy, s = cli_strategy(
      "--strategy", "hierarchical_diloco", "--group-size", "4",
      "--global-every", "3", "--outer-lr", "0.5", "--global-outer-lr", "0.9",
      "--global-outer-momentum", "0.5")
  want = strategies.hierarchical_diloco(
      _optim.inner(_optim.DILOCO_INNER),
      _optim.outer(_optim.Optimizer("sgd", 0.5, momentum=0.9)),
      _optim.outer(_optim.Optimizer("sgd", 0.9, momentum=0.5)),
      group_size=4, global_every=3)
  assert strategy.config == want.config
  assert want.config["global_outer"]["hyperparams"]["learning_rate"] == 0.9
  assert cli.main(["train", "--global-outer-lr", "0.9"]) == 2
  assert ("--global-outer-lr=0.9 is invalid: not used by strategy 'diloco'"
          in capsys.readouterr().err)


def test_codec_specs_are_accepted_by_the_factories():
  assert (strategies.diloco(codec="topk:0.1,quant:4").config ==
          strategies.diloco(codec=transforms.top_k(0.1) |
                            transforms.quantize(4)).config)
  with pytest.raises(ValueError, match="^codec='topk' is invalid"):
    strategies.diloco(codec="topk")
  with pytest.raises(ValueError, match="^codec=3 is invalid: expected a lowbw "
                     "codec"):
    strategies.ddp(codec=3)


def test_a_codec_only_default_is_dropped_without_a_codec():
  assert strategies.muloco().config["error_feedback"] == 0.9
  assert strategies.muloco(codec=None).config["error_feedback"] is None
  strategy, s = cli_strategy("--strategy", "muloco", "--codec", "none")
  assert strategy.config["error_feedback"] is None and s["ef"] is None
  # Built from settings, the error names the setting (--ef), not the keyword.
  with pytest.raises(ValueError, match="^ef=0.5 is invalid: needs a codec"):
    cli_strategy("--strategy", "muloco", "--codec", "none", "--ef", "0.5")


def test_a_setting_the_strategy_does_not_take_is_an_error(capsys):
  assert cli.main(["train", "--p", "0.1"]) == 2
  err = capsys.readouterr().err
  assert "--p=0.1 is invalid: not used by strategy 'diloco'" in err


def toy(inner: optax.GradientTransformation | None = None,
        outer: optax.GradientTransformation | None = None,
        H: int = 7, codec: transforms.Codec | str | None = None):
  """A strategy outside the library: DiLoCo under another name."""
  return strategies.diloco(inner, outer, H=H, codec=codec)


def test_a_new_strategy_is_one_spec_away_from_the_command_line(monkeypatch,
                                                                capsys):
  spec = _spec.spec(toy, inner=_optim.DILOCO_INNER, outer=_optim.DILOCO_OUTER,
                    paper="none", help={"H": "steps", "codec": "a codec"})
  monkeypatch.setitem(strategies.SPECS, "toy", spec)
  strategy, s = cli_strategy("--strategy", "toy")
  assert strategy.period == 7 and s["outer_lr"] == 0.7
  strategy, _ = cli_strategy("--strategy", "toy", "--H", "3")
  assert strategy.period == 3
  assert cli.main(["train", "--strategy", "toy", "--selector", "random"]) == 2
  assert "not used by strategy 'toy'" in capsys.readouterr().err


def test_a_parameter_without_help_fails_at_import():
  with pytest.raises(TypeError, match="parameter 'codec' has no help"):
    _spec.spec(toy, inner=_optim.DILOCO_INNER, outer=_optim.DILOCO_OUTER,
               paper="none", help={"H": "steps"})
  with pytest.raises(TypeError, match="outer= and the outer default"):
    _spec.spec(toy, inner=_optim.DILOCO_INNER, outer=None, paper="none",
               help={"H": "steps", "codec": "a codec"})


def test_an_unknown_strategy_is_an_error():
  with pytest.raises(ValueError, match="^strategy='nope' is invalid: expected "
                     "one of"):
    strategies.get("nope")


def test_the_docs_defaults_table_is_the_specs():
  import pathlib
  text = (pathlib.Path(__file__).parent.parent / "docs" / "strategies" /
          "README.md").read_text()
  assert _spec.defaults_table(strategies.SPECS) in text


def test_muloco_keeps_an_explicit_feedback_next_to_a_custom_chain():
  chain = transforms.error_feedback(transforms.quantize(2), 0.5)
  custom = strategies.muloco(message=chain)  # its default 0.9 steps aside
  assert custom.config["error_feedback"] is None
  assert custom.config["message"] == "custom chain"
  with pytest.raises(ValueError, match="^error_feedback=0.9 is invalid: put "
                     "error_feedback"):
    strategies.muloco(error_feedback=0.9, message=chain)


@pytest.mark.parametrize("argv, start", [
    (["--strategy", "demo", "--k", "0"], "lowbw: error: --k=0 is invalid"),
    (["--strategy", "demo", "--chunk", "0"],
     "lowbw: error: --chunk=0 is invalid"),
    (["--strategy", "fedavg", "--compress", "grads"],
     "lowbw: error: --compress='grads' is invalid"),
])
def test_spec_generated_flags_fail_with_one_line(argv, start, capsys):
  assert cli.main(["train", *argv]) == 2
  err = capsys.readouterr().err
  assert err.startswith(start) and err.count("\n") == 1, err


@pytest.mark.parametrize("name, schedule, warmup, floor", [
    ("muloco", "cosine", round(1000 / 13740 * 400), 0.1),  # Table 4
    ("spes", "cosine", 16, 0.1),      # 2,000 of 50,000 steps: 4 %
    ("diloco", "constant", 0, 0.0),
])
def test_the_papers_schedules_are_the_configs_defaults(name, schedule, warmup,
                                                       floor):
  config = lowbw.Config(strategy=name, steps=400)
  assert (config.schedule, config.warmup_steps, config.min_lr_ratio) == (
      schedule, warmup, floor)
  # Given settings win over the paper's.
  assert lowbw.Config(strategy=name, steps=400,
                      warmup_steps=3).warmup_steps == 3


def test_paper_inner_is_the_papers_schedule_over_the_run():
  """SPES's inner optimizer over 100 steps: betas (0.9, 0.95), a 4-step
  linear warm-up, then cosine to 0.1x; the learning rate it applies at each
  step equals the schedule written out by hand."""
  steps, peak = 100, 5e-4
  tx = strategies.paper_inner("spes", steps)
  by_hand = strategies.inner_optimizer(
      "adamw", peak, weight_decay=0.1, b2=0.95, max_norm=1.0,
      schedule="cosine", warmup_steps=4, steps=steps, min_lr_ratio=0.1)
  params = {"w": jnp.ones((3,))}
  grads = {"w": jnp.asarray([1.0, -2.0, 0.5])}
  s1, s2 = tx.init(params), by_hand.init(params)
  for t in range(12):
    u1, s1 = tx.update(grads, s1, params)
    u2, s2 = by_hand.update(grads, s2, params)
    np.testing.assert_array_equal(u1["w"], u2["w"])
  shape = strategies.unit_schedule("cosine", 4, steps, 0.1)
  for t in (0, 2, 4, 50, 99, 100):
    want = t / 4 if t < 4 else 0.1 + 0.9 * 0.5 * (
        1 + math.cos(math.pi * (t - 4) / (steps - 4)))
    assert float(shape(t)) == pytest.approx(want, abs=1e-6), t
  with pytest.raises(ValueError, match="^steps=0 is invalid"):
    strategies.paper_inner("spes", 0)
  with pytest.raises(ValueError, match="^strategy='nope' is invalid"):
    strategies.paper_inner("nope", 10)


@pytest.mark.parametrize("warmup", [-0.1, 1.0, "x"])
def test_a_bad_warmup_fraction_names_the_field(warmup):
  spec = _optim.Optimizer("adamw", 1e-3, schedule="cosine", warmup=warmup)
  with pytest.raises(ValueError, match=r"^warmup=.* is invalid"):
    _optim.paper_inner(spec, 100)


def _optimizers_of_every_spec():
  """Each strategy's default inner and outer optimizers as the config
  builds them for a 1,000-step run (schedules included), and plain optax
  ones."""
  out = {}
  for name in strategies.SPECS:
    s = lowbw.Config(strategy=name, data="digits", workers=4,
                     steps=1000).built().strategy
    out[name] = s.inner
  out.update({kind: _optim.outer(_optim.Optimizer(kind, 0.3, momentum=0.9))
              for kind in _optim.OUTER_KINDS})
  out["plain adam"] = optax.adam(1e-3)           # hyperparameters hidden
  out["muon inner"] = _optim.inner_optimizer("muon", 1e-3,
                                             schedule="cosine",
                                             warmup_steps=10, steps=100)
  return {k: v for k, v in out.items() if v is not None}


@pytest.mark.parametrize("name, tx", sorted(
    _optimizers_of_every_spec().items()))
def test_an_optimizer_is_described_as_its_init_says_without_running_it(
    name, tx):
  """``describe`` reads the hyperparameters from ``init``'s trace (no
  program compiled), running ``init`` only where one is computed: the
  description is the run's, for every default optimizer."""
  from lowbw.strategies import _base
  run = _base._describe_with(tx, (_base._init_run,))
  assert _base._describe(tx) == run, name

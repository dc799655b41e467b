"""``lowbw.studies.tune``: each method tuned on its own grid (extended when
its best is at an end), then compared at its best with paired seeds; the
figures checked against the studies' own points by hand."""

import numpy as np
import pytest

import lowbw
from lowbw.studies import _tune

BASE = dict(data="digits", hidden="8", workers=2, steps=4, eval_every=4,
            eval_examples=32)


@pytest.fixture(scope="module")
def tuned(tmp_path_factory):
  out = str(tmp_path_factory.mktemp("tune"))
  return out, lowbw.studies.tune(BASE, {
      "ddp": ({"strategy": "ddp"}, {"inner_lr": [1e-5, 3e-5, 1e-4]}),
      "diloco": ({"strategy": "diloco", "H": 2},
                 {"inner_lr": [1e-3, 3e-3, 1e-2, 3e-2]}),
  }, seeds=[0, 1], extend=1, out=out, progress=False)


def test_each_method_at_its_best_by_hand(tuned):
  out, t = tuned
  for name, m in t.methods.items():
    # Every point the method ran, read back from its studies' folders.
    means = {}
    for round_ in range(2):
      try:
        s = lowbw.studies.load(f"{out}/{name}/round{round_}")
      except lowbw.ConfigError:
        continue
      for p in s.points:
        means.setdefault(p.values["inner_lr"], []).append(
            p.summary["final_eval_loss"])
    best = min(means, key=lambda lr: np.mean(means[lr]))
    assert m["best"] == {"inner_lr": best}
    assert m["mean"] == pytest.approx(np.mean(means[best]))
    assert sorted(means) == m["grid"]["inner_lr"]


def test_an_optimum_at_an_edge_extends_the_grid(tuned):
  _, t = tuned
  ddp = t.methods["ddp"]  # 4 steps of tiny rates: the largest is best
  assert ddp["extended"] == {"inner_lr": [pytest.approx(1e-4 * 1e-4 / 3e-5)]}
  assert ddp["points"] == 4 * 2
  assert ddp["at_edge"] == ["inner_lr"]  # one extension allowed: still there


def test_the_comparison_pairs_seeds(tuned):
  _, t = tuned
  rows = {r["method"]: r for r in t.table()}
  ref, other = t.methods["ddp"]["by_seed"], t.methods["diloco"]["by_seed"]
  diffs = [other[s] - ref[s] for s in (0, 1)]
  assert rows["diloco"]["diff_mean"] == pytest.approx(np.mean(diffs))
  low, high = lowbw.studies.paired_interval(diffs)
  assert (rows["diloco"]["diff_low"], rows["diloco"]["diff_high"]) == (
      pytest.approx(low), pytest.approx(high))
  assert rows["ddp"]["diff_mean"] == 0.0


def test_at_edge_by_hand():
  grid = {"inner_lr": [1e-3, 1e-2, 1e-1], "H": [5, 10, 20], "codec":
          ["a", "b", "c"], "outer_lr": [0.5, 0.7]}
  assert _tune._at_edge(grid, {"inner_lr": 1e-1, "H": 5, "codec": "c",
                               "outer_lr": 0.7}) == [
      ("inner_lr", pytest.approx(1.0)), ("H", 2)]
  assert _tune._at_edge(grid, {"inner_lr": 1e-2, "H": 10}) == []


@pytest.mark.parametrize("methods, kw, match", [
    ({}, {}, "^methods={} is invalid"),
    ({"a": ({"strategy": "ddp"},)}, {}, r"^methods\['a'\]=.* expected "
     r"\(settings, grid\)"),
    ({"a": ({}, {"inner_lr": [1e-3]})}, {"reference": "b"},
     "^reference='b' is invalid: expected one of a"),
    ({"a": ({}, {"inner_lr": [1e-3]})}, {"extend": -1}, "^extend=-1"),
])
def test_bad_input_is_named(methods, kw, match):
  with pytest.raises(lowbw.ConfigError, match=match):
    lowbw.studies.tune(BASE, methods, **kw)

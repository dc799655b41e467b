"""Errors that name the field, the value and what is allowed, where a bad
input used to surface as something else (a huge memory estimate, numpy's
pickle text, a silently clamped codec) and plan's units."""

import json
import math

import jax
import numpy as np
import pytest

from lowbw import cli, data
from lowbw.data._source import DataSource
from lowbw.network import _planner, plan
from lowbw.transforms import dct_top_k, parse_codec


def _npz(tmp_path, name="d.npz", **arrays):
  path = str(tmp_path / name)
  np.savez(path, **arrays)
  return path


def _x(n=20):
  return np.random.default_rng(0).normal(size=(n, 3)).astype(np.float32)


# ------------------------------------------------------------------ labels


def test_an_absurd_label_names_the_label_and_the_allowed_range(tmp_path):
  y = np.arange(20) % 3
  y[5] = 10 ** 9
  with pytest.raises(ValueError) as info:
    data.arrays(_npz(tmp_path, x=_x(), y=y))
  text = str(info.value)
  assert text.startswith("y=")
  assert "1000000000" in text and "example 5" in text
  assert "[0, 2**20)" in text


def test_a_negative_label_is_refused(tmp_path):
  y = np.arange(20) % 3
  y[7] = -2
  with pytest.raises(ValueError, match=r"^y=.*-2.*\[0, 2\*\*20\).*"
                     r"example 7\) is negative"):
    data.arrays(_npz(tmp_path, x=_x(), y=y))


def test_the_cli_reports_the_label_not_a_memory_estimate(tmp_path, capsys):
  y = np.arange(20) % 3
  y[0] = 10 ** 9
  path = _npz(tmp_path, x=_x(), y=y)
  assert cli.main(["train", "--data", path, "--steps", "1", "--H", "1",
                   "--out", str(tmp_path / "run")]) == 2
  err = capsys.readouterr().err
  assert "1000000000" in err and "[0, 2**20)" in err
  assert "GB" not in err


def test_a_data_source_built_by_hand_checks_its_labels_too():
  x = np.zeros((4, 2), np.float32)
  with pytest.raises(ValueError, match=r"^train\['y'\]=.*2\*\*20"):
    DataSource(name="toy", task="classification",
               train={"x": x, "y": np.array([0, 1, 2, 2 ** 20])},
               eval={"x": x, "y": np.arange(4)})


def test_whole_float_labels_are_labels(tmp_path):
  y = (np.arange(20) % 4).astype(np.float64)
  source = data.arrays(_npz(tmp_path, x=_x(), y=y))
  assert source.train["y"].dtype == np.int32
  assert source.num_classes == int(y.max()) + 1


def test_a_fractional_label_is_named(tmp_path):
  y = (np.arange(20) % 3).astype(np.float32)
  y[4] = 1.5
  with pytest.raises(ValueError, match=r"^y=.*not whole numbers, the first "
                     r"is 1\.5 \(example 4\)"):
    data.arrays(_npz(tmp_path, x=_x(), y=y))
  y[4] = np.nan
  with pytest.raises(ValueError, match=r"^y=.*the first is nan"):
    data.arrays(_npz(tmp_path, x=_x(), y=y))


def test_non_finite_features_name_the_example(tmp_path):
  x = _x()
  x[3, 1] = np.inf
  with pytest.raises(ValueError, match=r"^x=.*finite features.*example 3"):
    data.arrays(_npz(tmp_path, x=x, y=np.arange(20) % 3))


# -------------------------------------------------------------- .npz keys


def test_a_ragged_key_is_named_with_its_dtype(tmp_path):
  ragged = np.array([np.zeros(2), np.zeros(3)], dtype=object)
  path = _npz(tmp_path, x=ragged, y=np.arange(2))
  with pytest.raises(ValueError) as info:
    data.arrays(path)
  text = str(info.value)
  assert text.startswith(f"path={path!r} is invalid: key 'x'")
  assert "dtype object" in text and "expected a numeric array" in text
  assert "allow_pickle" not in text


def test_a_string_key_is_named(tmp_path):
  path = _npz(tmp_path, x=_x(), y=np.array(["cat", "dog"] * 10))
  with pytest.raises(ValueError, match=r"key 'y' is an array \(20,\) of "
                     r"dtype <U3; expected a numeric array"):
    data.arrays(path)


def test_an_object_npy_names_its_dtype(tmp_path):
  path = str(tmp_path / "x.npy")
  np.save(path, np.array([[1], [1, 2]], dtype=object), allow_pickle=True)
  with pytest.raises(ValueError, match=r"^path=.*dtype object; expected a "
                     "numeric array"):
    data.arrays(path, np.arange(2))


def test_an_unknown_npz_key_is_not_dropped_silently(tmp_path):
  path = _npz(tmp_path, x=_x(), y=np.arange(20) % 3, x_val=_x())
  with pytest.raises(ValueError, match=r"unknown key\(s\) \['x_val'\]"):
    data.arrays(path)


# ------------------------------------------------------------------ codecs


def test_dct_k_above_the_block_is_refused_not_clamped():
  with pytest.raises(ValueError, match=r"^k=100 is invalid: expected at most "
                     r"chunk\*\*2 = 9"):
    dct_top_k(3, 100)
  with pytest.raises(ValueError, match=r"^codec='dct:3:100' is invalid: "
                     r"stage 'dct:3:100': k=100 .* at most chunk\*\*2 = 9"):
    parse_codec("dct:3:100")
  assert dct_top_k(3, 9).config["k"] == 9  # every coefficient: allowed


def test_cli_codec_dct_k_above_the_block(capsys):
  assert cli.main(["train", "--strategy", "demo", "--codec", "dct:3:100",
                   "--steps", "1"]) == 2
  err = capsys.readouterr().err
  assert "dct:3:100" in err and "chunk**2 = 9" in err


def test_float32_excess_compares_with_plain_byte_counts():
  from lowbw.transforms._codec_spec import float32_excess
  params = {"w": np.zeros((16, 16), np.float32), "b": np.zeros(16, np.float32)}
  # top-k of everything: float32 values + uint8 indices for <= 256 entries
  sent = 256 * (4 + 1) + 16 * (4 + 1)
  note = float32_excess(parse_codec("topk:1"), params)
  assert f"{sent:,} bytes" in note and f"{4 * 272:,} bytes" in note
  assert float32_excess(parse_codec("topk:0.1"), params) is None
  assert float32_excess(None, params) is None
  shapes = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype),
                        params)
  assert float32_excess(parse_codec("topk:1"), shapes) == note


# -------------------------------------------------------------------- plan


def test_plan_takes_trains_units_with_one_way_latency():
  out = plan(bandwidth="1Gbps", latency="25ms")
  f72 = 1 + 0.05 * math.log2(72)
  bits = 144e9 * 16 / 16
  # a sync: the payload up and down, plus a round trip of twice the latency
  assert out["t_sync_s"] == pytest.approx((2 * bits / 1e9 + 2 * 0.025) * f72)
  assert plan(bandwidth=1e9, latency=0.025) == out  # Python numbers: bit/s, s


def test_plan_defaults_are_a_100ms_round_trip():
  f72 = 1 + 0.05 * math.log2(72)
  assert plan()["t_sync_s"] == pytest.approx((2 * 144e9 / 100e6 + 0.1) * f72)
  assert _planner.PLAN_DEFAULTS["latency"] == "50ms"


def test_plan_old_names_still_work_and_warn():
  old = plan(bandwidth_mbps=1000, latency_ms=50)
  new = plan(bandwidth="1Gbps", latency="25ms")
  assert old["t_sync_s"] == new["t_sync_s"]
  assert any("latency_ms" in w and "deprecated" in w and "25ms" in w
             for w in old["warnings"])
  with pytest.raises(ValueError, match="^bandwidth_mbps=10 is invalid: give "
                     "bandwidth only"):
    plan(bandwidth_mbps=10, bandwidth="1Gbps")


def test_cli_plan_units_and_hidden_old_flags(capsys):
  assert cli.main(["plan", "--json", "--bandwidth", "1Gbps", "--latency",
                   "25ms"]) == 0
  new = capsys.readouterr().out
  assert cli.main(["plan", "--json", "--bandwidth-mbps", "1000",
                   "--latency-ms", "50"]) == 0
  old = capsys.readouterr().out
  assert '"t_sync_s"' in new
  assert (json.loads(new)["outputs"]["t_sync_s"] ==
          json.loads(old)["outputs"]["t_sync_s"])
  try:
    cli.main(["plan", "--help"])
  except SystemExit:
    pass
  text = capsys.readouterr().out
  assert "--bandwidth-mbps" not in text and "--latency-ms" not in text
  assert "one-way" in text
  assert cli.main(["plan", "--bandwidth", "100"]) == 2
  assert capsys.readouterr().err.startswith(
      "lowbw: error: --bandwidth='100' is invalid: a number needs its unit")


def test_cli_plan_prints_every_number_with_its_unit(capsys):
  assert cli.main(["plan"]) == 0
  lines = capsys.readouterr().out.splitlines()
  body = lines[lines.index("inputs (* given)") + 1:lines.index("warnings")]
  rows = dict(line.split(None, 1) for line in body if line.startswith("  "))
  assert rows["parameters"] == "144 billion"
  assert rows["tokens"] == "12 trillion"
  assert rows["bandwidth"] == "100Mbps"
  assert rows["latency"] == "50ms one-way"
  assert rows["total_days"].endswith(" days")
  for name, value in rows.items():
    words = value.split()
    if any(c.isdigit() for c in words[0]) and len(words) == 1:
      assert not words[0][0].isdigit() or words[0][-1].isalpha(), (
          name, value)  # a bare number

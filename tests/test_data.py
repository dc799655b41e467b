"""Tests for lowbw.data: sharding, the on-device sampler and the factories."""

import dataclasses
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import lowbw
from lowbw import data
from lowbw._random import random_bijection
from lowbw.data import _sampler
from lowbw.data import _sharding
from lowbw.data import _text

_SAMPLE = jax.jit(lambda sampler, key, step: sampler.sample(key, step))
_BIJECTION = jax.jit(random_bijection, static_argnums=3)


def _toy(n=103, num_classes=10, sharding="iid", alpha=0.5, features=3):
  """x[i] = i (every feature), so a batch tells which examples it holds."""
  x = np.repeat(np.arange(n, dtype=np.float32)[:, None], features, axis=1)
  y = np.arange(n) % num_classes
  return data.DataSource(
      name="toy", task="classification", train={"x": x, "y": y},
      eval={"x": x[:5], "y": y[:5]}, sharding=sharding, alpha=alpha)


def _lm(num_tokens=2001, seq_len=8, sharding="iid"):
  tokens = (np.arange(num_tokens) * 7 % 251).astype(np.uint8)
  return data.DataSource(
      name="lm", task="lm", train={"tokens": tokens},
      eval={"tokens": tokens[:300]}, sharding=sharding, seq_len=seq_len,
      vocab_size=256)


def _shared_sampler():
  """4 shards of 25, b = 7: batches straddle epochs (one compile, reused)."""
  return _toy(103).build(4, 7, seed=0)


def _examples(batch_W):
  return np.asarray(batch_W["x"][..., 0]).astype(np.int64)


def _shards(sampler):
  idx, lengths = np.asarray(sampler.shard_idx_W), np.asarray(sampler.shard_len_W)
  return [idx[w, : lengths[w]] for w in range(len(lengths))]


def _reference_sample(sampler, key, step):
  """A plain per-worker loop over the stream, one full permutation per epoch."""
  b = sampler.batch_size
  batches = []
  for w, shard in enumerate(_shards(sampler)):
    n = len(shard)
    orders = {}
    rows = []
    for position in range(step * b, step * b + b):
      epoch, i = divmod(position, n)
      if epoch not in orders:
        epoch_key = jax.random.fold_in(jax.random.fold_in(key, w), epoch)
        orders[epoch] = np.asarray(_BIJECTION(
            epoch_key, jnp.arange(n), n, sampler.max_shard))
      rows.append(shard[orders[epoch][i]])
    batches.append(rows)
  return np.array(batches)


# Sharding.


@pytest.mark.parametrize("sharding", ["iid", "contiguous"])
def test_equal_shards_partition_the_kept_examples(sharding):
  sampler = _toy(103, sharding=sharding).build(4, 5, seed=3)
  shards = _shards(sampler)
  assert [len(s) for s in shards] == [25] * 4
  everything = np.concatenate(shards)
  assert len(np.unique(everything)) == 100
  assert everything.min() >= 0 and everything.max() < 103
  if sharding == "contiguous":
    for w, shard in enumerate(shards):
      np.testing.assert_array_equal(shard, np.arange(25 * w, 25 * (w + 1)))


def test_iid_sharding_depends_on_seed_only():
  first = _sharding.shard_indices("iid", 100, 4, seed=1)
  again = _sharding.shard_indices("iid", 100, 4, seed=1)
  other = _sharding.shard_indices("iid", 100, 4, seed=2)
  assert all(np.array_equal(a, b) for a, b in zip(first, again))
  assert not all(np.array_equal(a, b) for a, b in zip(first, other))


def test_dirichlet_covers_every_example_once_and_skews_labels():
  labels = np.arange(2000) % 10
  skewed = _sharding.shard_indices("dirichlet", 2000, 8, seed=0,
                                   labels=labels, alpha=0.05)
  everything = np.sort(np.concatenate(skewed))
  np.testing.assert_array_equal(everything, np.arange(2000))

  def top_class_share(shards):
    shares = [np.bincount(labels[s], minlength=10).max() / len(s)
              for s in shards if len(s)]
    return np.mean(shares)

  balanced = _sharding.shard_indices("iid", 2000, 8, seed=0)
  assert top_class_share(balanced) < 0.2
  assert top_class_share(skewed) > 0.6


# Sampling.


def test_batch_equal_to_shard_is_the_whole_shard_every_step():
  sampler = _toy(40, sharding="contiguous").build(4, 10, seed=0)
  key = jax.random.key(1)
  orders = []
  for step in range(4):
    batch_W = _examples(_SAMPLE(sampler, key, step))
    for w in range(4):
      np.testing.assert_array_equal(np.sort(batch_W[w]),
                                    np.arange(10 * w, 10 * (w + 1)))
    orders.append(batch_W)
  assert not np.array_equal(orders[0], orders[1])


def test_one_epoch_has_no_repeats_and_next_epoch_reorders():
  sampler = _toy(96, sharding="iid").build(2, 8, seed=0)  # 48 per worker
  key = jax.random.key(5)
  shards = _shards(sampler)
  epoch_0 = np.concatenate([_examples(_SAMPLE(sampler, key, s))
                            for s in range(6)], axis=1)
  epoch_1 = np.concatenate([_examples(_SAMPLE(sampler, key, s))
                            for s in range(6, 12)], axis=1)
  for w in range(2):
    np.testing.assert_array_equal(np.sort(epoch_0[w]), shards[w])
    np.testing.assert_array_equal(np.sort(epoch_1[w]), shards[w])
    assert not np.array_equal(epoch_0[w], epoch_1[w])


def test_matches_per_worker_reference_across_epoch_boundaries():
  sampler = _shared_sampler()
  key = jax.random.key(2)
  for step in (0, 3, 7, 11):
    np.testing.assert_array_equal(_examples(_SAMPLE(sampler, key, step)),
                                  _reference_sample(sampler, key, step))


def test_workers_draw_different_orders():
  # Identical shards on every worker, so only the per-worker key differs.
  sampler = _shared_sampler()
  same = jnp.broadcast_to(sampler.shard_idx_W[:1], sampler.shard_idx_W.shape)
  sampler = dataclasses.replace(sampler, shard_idx_W=same)
  batch_W = _examples(_SAMPLE(sampler, jax.random.key(0), 0))
  assert len({tuple(row) for row in batch_W}) == 4


def test_same_key_and_step_give_same_batch_and_jit_compiles_once():
  sampler = _shared_sampler()
  key = jax.random.key(7)
  batches = [_SAMPLE(sampler, key, jnp.int32(s)) for s in range(4)]
  again = _SAMPLE(sampler, key, jnp.int32(2))
  np.testing.assert_array_equal(batches[2]["x"], again["x"])
  assert not np.array_equal(batches[0]["x"], batches[1]["x"])
  assert batches[0]["x"].shape == (4, 7, 3)
  assert batches[0]["y"].dtype == jnp.int32
  np.testing.assert_array_equal(
      batches[0]["y"], np.asarray(batches[0]["x"][..., 0]).astype(int) % 10)


def test_sampler_is_a_pytree_argument_compiled_once():
  traces = []

  def sample(sampler, key, step):
    traces.append(None)
    return sampler.sample(key, step)["x"]

  sample = jax.jit(sample)
  sampler = _shared_sampler()
  assert len(jax.tree_util.tree_leaves(sampler)) == 4  # x, y, idx, len
  shifted = dataclasses.replace(
      sampler, arrays={"x": sampler.arrays["x"] + 1, "y": sampler.arrays["y"]})
  key = jax.random.key(0)
  for step in range(3):
    np.testing.assert_array_equal(sample(shifted, key, jnp.int32(step)),
                                  sample(sampler, key, jnp.int32(step)) + 1)
  assert len(traces) == 1


def test_worker_offset_matches_the_full_sampler():
  sampler = _shared_sampler()
  key = jax.random.key(3)
  full = _examples(_SAMPLE(sampler, key, 9))
  tail = dataclasses.replace(sampler, shard_idx_W=sampler.shard_idx_W[2:],
                             shard_len_W=sampler.shard_len_W[2:])
  part = jax.jit(lambda s, k: s.sample(k, 9, worker_offset=2))(tail, key)
  np.testing.assert_array_equal(_examples(part), full[2:])


def test_lm_windows_match_numpy_reference():
  source = _lm(2001, seq_len=8)
  tokens = source.train["tokens"]
  assert source.num_examples() == 250
  assert source.tokens_per_example == 8
  sampler = source.build(3, 4, seed=0)
  key = jax.random.key(0)
  for step in (0, 20):
    batch_W = _SAMPLE(sampler, key, step)["tokens"]
    assert batch_W.shape == (3, 4, 9) and batch_W.dtype == jnp.int32
    examples = _reference_sample(sampler, key, step)
    expected = np.array([[tokens[e * 8: e * 8 + 9] for e in row]
                         for row in examples], np.int32)
    np.testing.assert_array_equal(batch_W, expected)
  np.testing.assert_array_equal(source.example_batch(2)["tokens"],
                                np.stack([tokens[0:9], tokens[8:17]]))


def test_last_lm_window_is_in_range():
  source = _lm(17, seq_len=8)  # exactly 2 windows: [0, 9) and [8, 17)
  sampler = source.build(1, 2, seed=0)
  batch = np.asarray(_SAMPLE(sampler, jax.random.key(0), 0)["tokens"][0])
  tokens = source.train["tokens"].astype(np.int32)
  assert sorted(map(tuple, batch)) == [tuple(tokens[0:9]), tuple(tokens[8:17])]


def test_dirichlet_unequal_shards_sample_within_their_own_shard():
  source = _toy(600, sharding="dirichlet", alpha=1.0)
  sampler = source.build(4, 8, seed=1)
  shards = _shards(sampler)
  assert len({len(s) for s in shards}) > 1
  assert sampler.max_shard == max(len(s) for s in shards)
  key = jax.random.key(4)
  for step in range(0, 60, 7):
    batch_W = _examples(_SAMPLE(sampler, key, step))
    for w in range(4):
      assert set(batch_W[w]) <= set(shards[w])
  np.testing.assert_array_equal(_examples(_SAMPLE(sampler, key, 13)),
                                _reference_sample(sampler, key, 13))


def test_epoch_arithmetic_is_exact_for_large_steps():
  for step, n, b, max_n in [(2**31 - 1, 1000, 512, 1000),
                            (123457, 3, 3, 3),
                            (4_000_000, 70_000, 1, 2**31 - 1)]:
    epoch, offset = _sampler._epoch_and_offset(
        jnp.uint32(step), jnp.int32(n), b, max_n)
    assert (int(epoch), int(offset)) == divmod(step * b, n)


# Eval batches.


def test_eval_batches_shapes():
  x = np.zeros((1100, 2), np.float32)
  y = np.zeros(1100, np.int64)
  source = data.arrays(x, y, eval=(x[:1037], y[:1037]))
  batches = source.eval_batches()
  assert batches["x"].shape == (3, 345, 2)  # ceil(1037/512)=3, 1037//3
  assert source.eval_batches(100)["y"].shape == (1, 100)
  lm = data.DataSource(
      name="lm", task="lm", train={"tokens": np.zeros(100, np.uint8)},
      eval={"tokens": np.arange(4000, dtype=np.uint16)}, seq_len=10,
      vocab_size=4000)
  tokens = lm.eval_batches()["tokens"]
  assert tokens.shape == (1, 256, 11) and tokens.dtype == np.int32
  # 399 windows available; the 256 evaluated are spread over all of them.
  starts = tokens[0, :, 0].astype(np.int64)
  assert starts[0] == 0 and starts[-1] == 398 * 10
  assert np.all(np.diff(starts) > 0) and np.all(starts % 10 == 0)
  for row in tokens[0]:
    np.testing.assert_array_equal(row, np.arange(row[0], row[0] + 11))
  assert lm.eval_batches(10_000)["tokens"].shape == (1, 399, 11)


def test_long_text_windows_are_evaluated_in_batches_of_at_most_65536_tokens():
  lm = data.DataSource(
      name="lm", task="lm", train={"tokens": np.zeros(2000, np.uint8)},
      eval={"tokens": np.arange(300_000) % 256}, seq_len=1024,
      vocab_size=256)
  # 256 windows of 1,024 tokens: 4 batches of 64 (65,536 tokens each).
  assert lm.eval_batches()["tokens"].shape == (4, 64, 1025)


# Factories.


def test_contiguous_sharding_keeps_the_original_order():
  # Sorted labels: contiguous shards must each hold one class (non-IID by
  # source), which a shuffled train split would destroy.
  x = np.arange(400, dtype=np.float32).reshape(100, 4)
  y = np.repeat(np.arange(4), 25)
  source = data.arrays(x, y, sharding="contiguous")
  train_y = source.train["y"]
  assert np.all(np.diff(train_y) >= 0)  # held-out rows removed, order kept
  shard_W = np.asarray(source.build(4, 2, seed=0).shard_idx_W)
  for w, shard in enumerate(shard_W):
    assert np.all(np.diff(shard) > 0)  # a contiguous, increasing slice
  labels = [set(train_y[shard].tolist()) for shard in shard_W]
  assert sum(len(l) for l in labels) <= 7  # nearly one class per worker
  digits = data.digits(sharding="contiguous")
  assert np.all(np.diff(np.asarray(digits.build(4, 8, 0).shard_idx_W[0])) == 1)


def test_digits():
  source = data.digits()
  assert source.task == "classification" and source.num_classes == 10
  assert source.train["x"].shape[1:] == (8, 8, 1)
  assert source.train["x"].dtype == np.float32
  assert 0.0 <= source.train["x"].min() and source.train["x"].max() <= 1.0
  assert len(source.train["y"]) + len(source.eval["y"]) == 1797
  np.testing.assert_array_equal(source.eval["x"], data.digits().eval["x"])
  batch = source.example_batch(5)
  assert batch["x"].shape == (5, 8, 8, 1) and batch["y"].dtype == np.int32
  json.dumps(source.config)
  assert data.get("digits", sharding="contiguous").sharding == "contiguous"


@pytest.mark.parametrize("read_file", [True, False])
def test_digits_are_scikit_learns_with_or_without_its_file(read_file,
                                                           monkeypatch):
  """The digits are read from scikit-learn's shipped file without importing
  scikit-learn; without the file, through ``load_digits``; both give
  scikit-learn's images and labels."""
  from sklearn.datasets import load_digits
  from lowbw.data import _digits
  if not read_file:
    monkeypatch.setattr(_digits, "_digits_file", lambda: None)
  else:
    assert _digits._digits_file() is not None
  images, target = _digits._read()
  reference = load_digits()
  np.testing.assert_array_equal(images, reference.images)
  np.testing.assert_array_equal(target, reference.target)


def test_text_bytes_default_corpus():
  _text._CACHE.clear()
  first = _text.load_corpus(None, 20)
  _text._CACHE.clear()
  second = _text.load_corpus(None, 20)
  assert len(first.train) > 5_000_000
  np.testing.assert_array_equal(first.train, second.train)
  np.testing.assert_array_equal(first.eval, second.eval)
  assert not set(first.train_files) & set(first.eval_files)
  assert len(first.eval_files) > 10
  assert not any(part in {"test", "tests", "site-packages"}
                 for f in first.train_files for part in f.split("/"))
  source = data.text_bytes(seq_len=64)
  assert source.vocab_size == 256 and source.train["tokens"].dtype == np.uint8
  assert source.example_batch(2)["tokens"].shape == (2, 65)
  json.dumps(source.config)
  assert data.get(**source.config).seq_len == 64


def test_text_bytes_from_a_folder(tmp_path):
  for i in range(5):
    (tmp_path / f"f{i}.txt").write_text(f"file {i} " * 40)
  (tmp_path / "sub").mkdir()
  (tmp_path / "sub" / "g.txt").write_text("nested " * 100)
  (tmp_path / "blob.bin").write_bytes(bytes([0xff, 0xfe, 0x80]) * 50)
  corpus = _text.load_corpus(str(tmp_path), 3)
  assert corpus.eval_files == ("f0.txt", "f3.txt")
  assert "blob.bin" not in corpus.train_files + corpus.eval_files
  assert "sub/g.txt" in corpus.train_files
  source = data.text_bytes(seq_len=16, root=tmp_path, eval_every_nth_file=3)
  sampler = source.build(2, 4, seed=0)
  assert _SAMPLE(sampler, jax.random.key(0), 0)["tokens"].shape == (2, 4, 17)

  one_file_folder = tmp_path / "sub"
  source = data.text_bytes(seq_len=16, root=one_file_folder)
  assert len(source.eval["tokens"]) == round(0.05 * len("nested " * 100))


def test_arrays_npz_and_npy(tmp_path):
  rng = np.random.default_rng(0)
  x, y = rng.normal(size=(50, 4)), rng.integers(0, 3, 50)
  np.savez(tmp_path / "d.npz", x=x, y=y, x_eval=x[:7], y_eval=y[:7])
  source = data.arrays(str(tmp_path / "d.npz"))
  assert len(source.train["y"]) == 50 and len(source.eval["y"]) == 7
  np.save(tmp_path / "x.npy", x)
  np.save(tmp_path / "y.npy", y)
  source = data.arrays(tmp_path / "x.npy", tmp_path / "y.npy",
                       eval_fraction=0.2)
  assert len(source.train["y"]) == 40 and source.train["x"].dtype == np.float32
  json.dumps(source.config)


def test_arrays_refuse_empty_axes_by_name(tmp_path):
  x, y = np.zeros((10, 8), np.float32), np.zeros(10, int)
  with pytest.raises(lowbw.ConfigError, match=re.escape(
      "x='<array float32 (0, 8)>' is invalid: expected at least 1 example")):
    data.arrays(x[:0], y[:0])
  with pytest.raises(lowbw.ConfigError, match=re.escape(
      "x='<array float32 (10, 0)>' is invalid: expected at least 1 feature")):
    data.arrays(x[:, :0], y)
  np.savez(tmp_path / "d.npz", x=x, y=y, x_eval=x[:0], y_eval=y[:0])
  with pytest.raises(lowbw.ConfigError, match=re.escape(
      "x_eval='<array float32 (0, 8)>' is invalid: expected at least 1 "
      "example")):
    data.arrays(tmp_path / "d.npz")


def test_token_file(tmp_path):
  path = tmp_path / "train.bin"
  tokens = (np.arange(3000) * 13 % 1000).astype(np.uint16)
  tokens.tofile(path)
  source = data.token_file(path, seq_len=32)
  assert source.vocab_size == 1000
  assert len(source.eval["tokens"]) == 150
  np.testing.assert_array_equal(source.train["tokens"], tokens[:2850])
  (tokens[:500]).tofile(tmp_path / "val.bin")
  source = data.get("tokens", path=str(path), seq_len=32,
                    eval_path=str(tmp_path / "val.bin"))
  assert len(source.train["tokens"]) == 3000
  assert _SAMPLE(source.build(2, 8, seed=0), jax.random.key(0),
                 1)["tokens"].shape == (2, 8, 33)


# Errors.


@pytest.mark.parametrize("kwargs, field", [
    (dict(num_workers=0, batch_size=4, seed=0), "workers"),
    (dict(num_workers=2.0, batch_size=4, seed=0), "workers"),
    (dict(num_workers=2, batch_size=0, seed=0), "batch_size"),
    (dict(num_workers=2, batch_size=True, seed=0), "batch_size"),
    (dict(num_workers=4, batch_size=26, seed=0), "batch_size"),
    (dict(num_workers=104, batch_size=1, seed=0), "workers"),
    (dict(num_workers=2, batch_size=4, seed=-1), "seed"),
])
def test_build_errors(kwargs, field):
  with pytest.raises(ValueError, match=field):
    _toy(103).build(**kwargs)


def test_batch_larger_than_smallest_shard_names_the_worker():
  with pytest.raises(ValueError, match=r"batch_size=26 is larger than worker "
                     r"\d's shard of 25 examples"):
    _toy(103).build(4, 26, seed=0)
  with pytest.raises(ValueError, match="batch_size.*alpha"):
    _toy(100, sharding="dirichlet", alpha=0.01).build(8, 10, seed=0)


def test_source_errors():
  with pytest.raises(ValueError, match="sharding"):
    _lm(sharding="dirichlet")
  with pytest.raises(ValueError, match="sharding"):
    data.text_bytes(sharding="dirichlet")
  with pytest.raises(ValueError, match="sharding"):
    _toy(sharding="random")
  with pytest.raises(ValueError, match="alpha"):
    _toy(sharding="dirichlet", alpha=0.0)
  with pytest.raises(ValueError, match="alpha"):
    data.digits(sharding="dirichlet", alpha=-1.0)
  with pytest.raises(ValueError, match="eval_fraction"):
    data.digits(eval_fraction=1.0)
  with pytest.raises(ValueError, match="seq_len"):
    data.text_bytes(seq_len=0)
  with pytest.raises(ValueError, match="max_examples"):
    data.digits().eval_batches(0)
  with pytest.raises(ValueError, match="batch_size"):
    _toy(10).example_batch(11)


def test_factory_errors(tmp_path):
  missing = str(tmp_path / "missing")
  with pytest.raises(ValueError, match="root"):
    data.text_bytes(root=missing)
  (tmp_path / "empty").mkdir()
  with pytest.raises(ValueError, match="root"):
    data.text_bytes(root=tmp_path / "empty")
  x = np.zeros((10, 2))
  with pytest.raises(ValueError, match="y"):
    data.arrays(x, np.linspace(0, 1, 10))
  with pytest.raises(ValueError, match="y"):
    data.arrays(x)
  with pytest.raises(ValueError, match="y"):
    data.arrays(x, np.zeros(9, int))
  with pytest.raises(ValueError, match=f"path='{missing}'"):
    data.arrays(missing, np.zeros(9, int))
  with pytest.raises(ValueError, match="path"):
    data.token_file(missing)
  with pytest.raises(ValueError, match="eval_path"):
    (np.arange(100, dtype=np.uint16)).tofile(tmp_path / "t.bin")
    data.token_file(tmp_path / "t.bin", seq_len=4, eval_path=missing)
  with pytest.raises(ValueError, match="data"):
    data.get("imagenet")


def test_public_api():
  assert set(data.__all__) >= {"DataSource", "WorkerSampler", "digits",
                                "text_bytes", "arrays", "token_file", "get"}
  assert set(data.names()) == {"digits", "text", "arrays", "tokens",
                               "prepared", "mnist", "fashion_mnist",
                               "cifar10", "per_worker"}
  assert os.path.basename(data._text.__file__) == "_text.py"

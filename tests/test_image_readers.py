"""The local image readers: IDX (MNIST, Fashion-MNIST) and CIFAR-10 batches,
read from tiny files written here, and the factories' DataSources."""

import gzip
import json
import os
import pickle
import struct

import numpy as np
import pytest

from lowbw import data
from lowbw.data import _images

IDX_UBYTE = 0x08


def idx_bytes(array: np.ndarray, code: int) -> bytes:
  """An IDX file of ``array``, written by hand from the format's spec."""
  dtype = np.dtype(_images.IDX_TYPES[code])
  header = struct.pack(">BBBB", 0, 0, code, array.ndim)
  header += struct.pack(f">{array.ndim}I", *array.shape)
  return header + array.astype(dtype).tobytes()


def write(path, content: bytes, gz: bool = False):
  opener = gzip.open if gz else open
  with opener(path, "wb") as f:
    f.write(content)
  return str(path)


def digit_images(n: int, seed: int) -> np.ndarray:
  return np.random.default_rng(seed).integers(0, 256, (n, 28, 28), np.uint8)


def mnist_folder(folder, gz=False, dotted=False, train=5, test=3):
  """The four MNIST files of known values; returns what they hold."""
  folder.mkdir(exist_ok=True)
  values = {"x": digit_images(train, 1), "y": np.arange(train) % 10,
            "eval_x": digit_images(test, 2), "eval_y": (np.arange(test) + 3) % 10}
  values["x"][0, 0, 0], values["x"][0, 0, 1] = 0, 255  # both ends of the range
  for key, name in _images.MNIST_FILES:
    if dotted:
      name = name.replace("-idx", ".idx")
    write(folder / (name + (".gz" if gz else "")),
          idx_bytes(values[key], IDX_UBYTE), gz=gz)
  return values


# -- IDX -----------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_gives_the_values_written(tmp_path, gz):
  images = digit_images(5, 0)
  path = write(tmp_path / ("im.gz" if gz else "im"),
               idx_bytes(images, IDX_UBYTE), gz=gz)
  read = _images.read_idx(path)
  assert read.dtype == np.uint8 and read.shape == (5, 28, 28)
  np.testing.assert_array_equal(read, images)


@pytest.mark.parametrize("code,values", [
    (0x09, np.array([-128, -1, 0, 127])),
    (0x0B, np.array([[-32768, 1], [2, 32767]])),
    (0x0C, np.array([-(2**31), 2**31 - 1, 7])),
    (0x0D, np.array([1.5, -2.25, 3e38])),
    (0x0E, np.array([[1e-300, -0.5]])),
])
def test_read_idx_reads_every_type_big_endian(tmp_path, code, values):
  read = _images.read_idx(write(tmp_path / "f", idx_bytes(values, code)))
  assert read.dtype == np.dtype(_images.IDX_TYPES[code]).newbyteorder("=")
  assert read.dtype.isnative
  np.testing.assert_array_equal(read, values.astype(read.dtype))


def test_gzip_is_recognised_by_content_not_name(tmp_path):
  labels = np.array([3, 1, 4], np.uint8)
  plain_named_gz = write(tmp_path / "a.gz", idx_bytes(labels, IDX_UBYTE))
  gz_named_plain = write(tmp_path / "b", idx_bytes(labels, IDX_UBYTE), gz=True)
  for path in (plain_named_gz, gz_named_plain):
    np.testing.assert_array_equal(_images.read_idx(path), labels)


def test_bad_magic_is_named(tmp_path):
  path = write(tmp_path / "f", b"\x01\x00\x08\x01" + struct.pack(">I", 1) + b"\0")
  with pytest.raises(ValueError, match=r"starts with two zero bytes.*01 00 08 01"
                     ) as info:
    _images.read_idx(path)
  assert info.value.field == "path" and info.value.value == path


def test_wrong_type_code_is_named(tmp_path):
  path = write(tmp_path / "f", b"\0\0\x0A\x01" + struct.pack(">I", 1) + b"\0")
  with pytest.raises(ValueError, match=r"type byte 0x0A; expected one of 0x08"):
    _images.read_idx(path)


@pytest.mark.parametrize("gz", [False, True])
def test_truncated_file_names_expected_and_actual_bytes(tmp_path, gz):
  content = idx_bytes(digit_images(5, 0), IDX_UBYTE)[:-100]
  path = write(tmp_path / "f", content, gz=gz)
  with pytest.raises(ValueError, match=r"is truncated: expected 3,920 bytes "
                     r"of uint8 data after the header for shape \(5, 28, 28\), "
                     r"found 3,820") as info:
    _images.read_idx(path)
  assert info.value.value == path


def test_trailing_bytes_and_short_header_are_refused(tmp_path):
  long = write(tmp_path / "long", idx_bytes(np.zeros(3), IDX_UBYTE) + b"\0")
  with pytest.raises(ValueError, match=r"trailing bytes: expected 3 bytes.*found 4"):
    _images.read_idx(long)
  short = write(tmp_path / "short", b"\0\0\x08\x03" + struct.pack(">I", 5))
  with pytest.raises(ValueError, match=r"16-byte header for 3 dimensions"):
    _images.read_idx(short)


def test_truncated_gzip_stream_is_named(tmp_path):
  whole = gzip.compress(idx_bytes(digit_images(5, 0), IDX_UBYTE))
  path = write(tmp_path / "f.gz", whole[:len(whole) // 2])
  with pytest.raises(ValueError, match=r"complete gzip file"):
    _images.read_idx(path)


def test_missing_file_is_named(tmp_path):
  with pytest.raises(ValueError, match=r"no such file"):
    _images.read_idx(tmp_path / "nothing")


# -- MNIST ---------------------------------------------------------------------


@pytest.mark.parametrize("gz,dotted", [(False, False), (True, False),
                                       (False, True), (True, True)])
def test_mnist_arrays_match_the_files(tmp_path, gz, dotted):
  values = mnist_folder(tmp_path / "m", gz=gz, dotted=dotted)
  out = _images.mnist_arrays(tmp_path / "m")
  assert set(out) == {"x", "y", "eval_x", "eval_y"}
  for images, labels in (("x", "y"), ("eval_x", "eval_y")):
    assert out[images].dtype == np.float32 and out[labels].dtype == np.int32
    assert out[images].shape == values[images].shape + (1,)
    np.testing.assert_array_equal(out[images][..., 0] * 255, values[images])
    np.testing.assert_array_equal(out[labels], values[labels])
  assert out["x"].min() == 0.0 and out["x"].max() == 1.0


def test_mnist_file_inside_a_folder_of_its_name(tmp_path):
  values = mnist_folder(tmp_path / "m")
  os.rename(tmp_path / "m" / "t10k-labels-idx1-ubyte", tmp_path / "lab")
  os.mkdir(tmp_path / "m" / "t10k-labels-idx1-ubyte")
  os.rename(tmp_path / "lab",
            tmp_path / "m" / "t10k-labels-idx1-ubyte" / "t10k-labels-idx1-ubyte")
  out = _images.mnist_arrays(tmp_path / "m")
  np.testing.assert_array_equal(out["eval_y"], values["eval_y"])


def test_missing_mnist_files_are_listed_in_one_error(tmp_path):
  mnist_folder(tmp_path / "m")
  os.remove(tmp_path / "m" / "train-labels-idx1-ubyte")
  os.remove(tmp_path / "m" / "t10k-images-idx3-ubyte")
  with pytest.raises(ValueError) as info:
    _images.mnist_arrays(tmp_path / "m")
  message = str(info.value)
  assert info.value.field == "folder"
  assert info.value.value == str(tmp_path / "m")
  assert "missing train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz]" \
      in message
  assert "it holds: t10k-labels-idx1-ubyte, train-images-idx3-ubyte" in message
  with pytest.raises(ValueError, match="expected an existing folder"):
    _images.mnist_arrays(tmp_path / "absent")


def test_mnist_label_count_must_match_images(tmp_path):
  mnist_folder(tmp_path / "m")
  write(tmp_path / "m" / "train-labels-idx1-ubyte",
        idx_bytes(np.zeros(4), IDX_UBYTE))
  with pytest.raises(ValueError, match=r"holds 4 labels; expected one per image"):
    _images.mnist_arrays(tmp_path / "m")


def test_mnist_images_must_be_ubyte(tmp_path):
  mnist_folder(tmp_path / "m")
  write(tmp_path / "m" / "train-images-idx3-ubyte",
        idx_bytes(np.zeros((5, 28, 28)), 0x0D))
  with pytest.raises(ValueError, match=r"expected uint8 images"):
    _images.mnist_arrays(tmp_path / "m")


# -- CIFAR-10 ------------------------------------------------------------------

CIFAR_NAMES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def cifar_rows(n: int, seed: int) -> np.ndarray:
  """n images, channel-first, whose every pixel value says where it is."""
  c, h, w = np.meshgrid(np.arange(3), np.arange(32), np.arange(32),
                        indexing="ij")
  pattern = c * 80 + h * 2 + (w % 2)  # not symmetric under any transpose
  return np.stack([(pattern + seed * 7 + i) % 256 for i in range(n)]
                  ).astype(np.uint8).reshape(n, 3072)


def cifar_folder(folder, binary=False):
  """The six batches (2 records each); returns (rows, labels) per batch."""
  folder.mkdir(parents=True, exist_ok=True)
  written = {}
  for seed, name in enumerate(CIFAR_NAMES):
    rows, labels = cifar_rows(2, seed), [seed % 10, (seed + 5) % 10]
    if binary:
      records = np.concatenate([np.array(labels, np.uint8)[:, None], rows], 1)
      write(folder / (name + ".bin"), records.tobytes())
    else:
      with open(folder / name, "wb") as f:
        pickle.dump({b"batch_label": name.encode(), b"labels": labels,
                     b"data": rows, b"filenames": [b"a.png", b"b.png"]}, f)
    written[name] = (rows, labels)
  return written


@pytest.mark.parametrize("binary,sub", [(False, ""), (False, "cifar-10-batches-py"),
                                        (True, ""), (True, "cifar-10-batches-bin")])
def test_cifar10_arrays_match_the_batches(tmp_path, binary, sub):
  written = cifar_folder(tmp_path / "c" / sub, binary=binary)
  out = _images.cifar10_arrays(tmp_path / "c")
  assert out["x"].shape == (10, 32, 32, 3) and out["eval_x"].shape == (2, 32, 32, 3)
  assert out["x"].dtype == np.float32 and out["y"].dtype == np.int32
  assert 0 <= out["x"].min() and out["x"].max() <= 1
  rows = np.concatenate([written[n][0] for n in CIFAR_NAMES[:5]])
  np.testing.assert_array_equal(
      out["y"], np.concatenate([written[n][1] for n in CIFAR_NAMES[:5]]))
  np.testing.assert_array_equal(out["eval_y"], written["test_batch"][1])
  # Pixel (row h, column w, channel c) of image i is byte c*1024 + h*32 + w.
  first = rows[0]
  for h, w, c in [(0, 1, 0), (5, 2, 1), (31, 30, 2), (1, 0, 2)]:
    assert out["x"][0, h, w, c] * 255 == first[c * 1024 + h * 32 + w]
  np.testing.assert_array_equal(
      np.round(out["x"] * 255).astype(np.uint8),
      rows.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
  np.testing.assert_array_equal(
      np.round(out["eval_x"] * 255).astype(np.uint8),
      written["test_batch"][0].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))


def test_cifar10_prefers_python_batches_when_both_exist(tmp_path):
  cifar_folder(tmp_path, binary=True)
  written = cifar_folder(tmp_path, binary=False)
  os.truncate(tmp_path / "test_batch.bin", 5)  # would fail if it were read
  out = _images.cifar10_arrays(tmp_path)
  np.testing.assert_array_equal(out["eval_y"], written["test_batch"][1])


def test_missing_cifar_batch_is_named(tmp_path):
  cifar_folder(tmp_path / "c")
  os.remove(tmp_path / "c" / "data_batch_3")
  with pytest.raises(ValueError, match=r"data_batch_1 \.\. data_batch_5 and "
                     r"test_batch.*cifar-10-batches-py.*no complete set"
                     ) as info:
    _images.cifar10_arrays(tmp_path / "c")
  assert info.value.field == "folder"


def test_truncated_cifar_binary_batch_is_named(tmp_path):
  cifar_folder(tmp_path, binary=True)
  os.truncate(tmp_path / "data_batch_2.bin", 3073 + 1000)
  with pytest.raises(ValueError, match=r"holds 4,073 bytes; expected a whole "
                     r"number of 3073-byte records") as info:
    _images.cifar10_arrays(tmp_path)
  assert info.value.value.endswith("data_batch_2.bin")


def test_bad_cifar_pickles_are_named(tmp_path):
  cifar_folder(tmp_path)
  write(tmp_path / "data_batch_4", b"not a pickle")
  with pytest.raises(ValueError, match=r"could not be unpickled"):
    _images.cifar10_arrays(tmp_path)
  with open(tmp_path / "data_batch_4", "wb") as f:
    pickle.dump({b"data": cifar_rows(2, 0)}, f)
  with pytest.raises(ValueError, match=r"keys b'data' and b'labels'"):
    _images.cifar10_arrays(tmp_path)
  with open(tmp_path / "data_batch_4", "wb") as f:
    pickle.dump({b"data": cifar_rows(2, 0), b"labels": [0, 12]}, f)
  with pytest.raises(ValueError, match=r"labels from 0 to 12; expected"):
    _images.cifar10_arrays(tmp_path)


# -- factories -----------------------------------------------------------------


def test_mnist_factory_builds_and_rebuilds_from_its_config(tmp_path):
  values = mnist_folder(tmp_path / "m", gz=True, train=12, test=4)
  source = _images.mnist(tmp_path / "m", sharding="contiguous")
  assert source.name == "mnist" and source.num_classes == 10
  np.testing.assert_array_equal(source.eval["y"], values["eval_y"])
  assert source.train["x"].shape == (12, 28, 28, 1)
  sampler = source.build(num_workers=2, batch_size=4, seed=0)
  assert sampler.shard_idx_W.shape == (2, 6)
  config = json.loads(json.dumps(source.config))
  assert config == {"name": "mnist", "path": str(tmp_path / "m"),
                    "sharding": "contiguous", "alpha": 0.5}
  factory = getattr(_images, config.pop("name"))
  again = factory(**config)
  for part in ("train", "eval"):
    for key in ("x", "y"):
      np.testing.assert_array_equal(getattr(again, part)[key],
                                    getattr(source, part)[key])


def test_registry_rebuilds_image_sources(tmp_path):
  mnist_folder(tmp_path / "m")
  cifar_folder(tmp_path / "c")
  for source in (_images.mnist(tmp_path / "m"),
                 _images.fashion_mnist(tmp_path / "m"),
                 _images.cifar10(tmp_path / "c")):
    again = data.get(**source.config)
    assert again.config == source.config and again.name == source.name
    np.testing.assert_array_equal(again.train["x"], source.train["x"])


def test_factories_name_the_path_they_were_given(tmp_path):
  with pytest.raises(ValueError, match=r"missing train-images") as info:
    _images.fashion_mnist(tmp_path)
  assert info.value.field == "path"
  cifar_folder(tmp_path / "c")
  source = _images.cifar10(tmp_path / "c", sharding="dirichlet", alpha=2.0)
  assert source.name == "cifar10" and source.sharding == "dirichlet"
  assert source.config["alpha"] == 2.0
  assert source.train["x"].shape == (10, 32, 32, 3)
  with pytest.raises(ValueError, match="sharding='bogus' is invalid"):
    _images.cifar10(tmp_path / "c", sharding="bogus")


def test_data_dir_picks_the_reader_by_what_the_folder_holds(tmp_path):
  from lowbw.config._resolve import build_data
  mnist_folder(tmp_path / "m")
  cifar_folder(tmp_path / "c")
  (tmp_path / "t").mkdir()
  assert _images.image_kind(tmp_path / "m") == "mnist"
  assert _images.image_kind(tmp_path / "c") == "cifar10"
  assert _images.image_kind(tmp_path / "t") is None
  settings = {"sharding": "iid", "alpha": 0.5, "seq_len": 8,
              "data_root": None}
  m = build_data({**settings, "data": str(tmp_path / "m")})
  c = build_data({**settings, "data": str(tmp_path / "c")})
  assert m.config["name"] == "mnist" and m.train["x"].shape[1:] == (28, 28, 1)
  assert c.config["name"] == "cifar10" and c.train["x"].shape[1:] == (32, 32, 3)


def test_lowbw_train_runs_on_an_mnist_folder(tmp_path, capsys):
  from lowbw import cli
  mnist_folder(tmp_path / "m", train=8)
  code = cli.main(["train", "--data", str(tmp_path / "m"), "--strategy",
                   "ddp", "--steps", "2", "--workers", "2", "--batch-size",
                   "2", "--out", str(tmp_path / "run"), "--no-plot"])
  assert code == 0, capsys.readouterr().err
  assert '"name": "mnist"' in (tmp_path / "run" / "config.json").read_text()

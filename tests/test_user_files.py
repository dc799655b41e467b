"""Files and folders users hand to lowbw: readers refuse what they do not
understand with one line naming the file (or flag), what is there and what
is allowed; no path read from a user's file leads out of its folder."""

import json
import os
import shutil
import struct
import zipfile

import numpy as np
import pytest

from lowbw import cli, data
from lowbw.data import _prepare, _tokenizer


def error_of(argv, capsys) -> str:
  """The one-line error of a command that must fail before it trains."""
  code = cli.main(argv)
  err = capsys.readouterr().err.strip()
  assert code == 2, err
  assert len(err.splitlines()) == 1 and err.startswith("lowbw: error: "), err
  return err


# --- paths: a missing one, a folder, a device ------------------------------

def test_a_missing_data_folder_is_named_before_any_model_flag(capsys):
  err = error_of(["train", "--data", "/no/such/folder", "--layers", "1"],
                 capsys)
  assert "--data='/no/such/folder' is invalid: no such file or folder" in err


@pytest.mark.parametrize("path, why", [
    ("FOLDER", "is a folder; expected a YAML, TOML or JSON file"),
    ("/dev/null", "is not a regular file"),
    ("/no/such.toml", "no such file")])
def test_a_config_that_is_a_folder_or_a_device_is_not_no_such_file(
    tmp_path, capsys, path, why):
  path = str(tmp_path) if path == "FOLDER" else path
  err = error_of(["train", "--config", path], capsys)
  assert f"--config={path!r} is invalid: {why}" in err


def test_a_folder_named_like_an_archive_is_one_error_naming_data(
    tmp_path, capsys):
  folder = tmp_path / "x.npz"
  folder.mkdir()
  err = error_of(["train", "--data", str(folder)], capsys)
  assert f"--data={str(folder)!r} is invalid: expected at least one" in err
  assert "root=" not in err


def test_a_tokenizer_that_is_a_folder_is_named(tmp_path, capsys):
  (tmp_path / "a.txt").write_text("some text\n\nmore text\n")
  err = error_of(["data", "prepare", str(tmp_path / "a.txt"), "--out",
                  str(tmp_path / "out"), "--tokenizer", str(tmp_path)],
                 capsys)
  assert f"--tokenizer={str(tmp_path)!r} is invalid: is a folder" in err

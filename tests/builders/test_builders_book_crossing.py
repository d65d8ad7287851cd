"""The book_crossing_listwise ranker (builders/book_crossing.py) on a tiny Book-Crossing."""

import json
import pathlib
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

import builders_testlib as lib
from builders import book_crossing
from builders import book_crossing_config
from mxrec_pipeline import cli
from mxrec_pipeline.data import book_crossing_lists as lists_lib
from mxrec_pipeline.data import elwc
from mxrec_pipeline.util import initialize

CONFIG = str(lib.CONFIG_DIR / "book_crossing_listwise.yaml")
SAMPLE = str(pathlib.Path(__file__).resolve().parents[2] / "examples" / "book_crossing_lists.json")


def write_book_crossing(data_dir: pathlib.Path, num_users: int = 8, ratings_per_user: int = 9,
                        num_books: int = 24, seed: int = 0) -> pathlib.Path:
  """The three BX CSVs of a tiny Book-Crossing, with the real files' quirks.

  Escaped quotes and ';' in titles, `&amp;`, NULL ages, an ISBN with a lower-case
  x, implicit 0 ratings and a rated ISBN without a row in BX-Books.csv.
  """
  rng = np.random.default_rng(seed)
  data_dir.mkdir(parents=True)
  isbns = [f"{i:09d}X" if i % 5 == 0 else f"{i:010d}" for i in range(num_books)]
  books = [
      '"ISBN";"Book-Title";"Book-Author";"Year-Of-Publication";"Publisher";'
      '"Image-URL-S";"Image-URL-M";"Image-URL-L"'
  ]
  for i, isbn in enumerate(isbns[:-1]):  # The last ISBN has no row.
    title = rf'Book {i}: \"Part\"; the end' if i % 3 else f"Book {i}"
    books.append(f'"{isbn.lower()}";"{title}";"Author {i % 4}";"{1990 + i}";'
                 f'"Pub &amp; Sons {i % 3}";"s";"m";"l"')
  users = ['"User-ID";"Location";"Age"']
  ratings = ['"User-ID";"ISBN";"Book-Rating"']
  for user in range(1, num_users + 1):
    age = "NULL" if user % 3 == 0 else f'"{18 + 3 * user}"'
    users.append(f'"{user}";"city {user % 2}, region, country {user % 3}";{age}')
    for i in rng.choice(num_books, ratings_per_user, replace=False):
      # Author 0's books rate high: something to learn.
      value = 0 if rng.random() < 0.2 else (10 if i % 4 == 0 else rng.integers(1, 9))
      ratings.append(f'"{user}";"{isbns[i]}";"{value}"')
  files = {"BX-Book-Ratings.csv": ratings, "BX-Books.csv": books, "BX-Users.csv": users}
  for name, rows in files.items():
    (data_dir / name).write_bytes(("\r\n".join(rows) + "\r\n").encode("latin-1"))
  return data_dir


def test_config_crosses_are_the_lists_crosses():
  assert book_crossing_config.CROSSES == tuple(lists_lib.CROSSES)
  context, example, label = book_crossing.BookCrossingListwise().feature_specs()
  assert set(context) == set(lists_lib.CONTEXT_FEATURES)
  assert set(example) == {
      *lists_lib.EXAMPLE_FEATURES, *lists_lib.CROSSES, *lists_lib.STATISTICS_FEATURES
  }
  assert label[0] == lists_lib.LABEL_FEATURE


@pytest.mark.parametrize("values, message", [
    ({"crosses": ["user_author", "nope"]}, r"model.crosses must be distinct names of"),
    ({"id_vocabulary_size": 0}, r"model.id_vocabulary_size must be positive, got 0"),
    ({"combiner": "max"}, r"model.combiner must be one of"),
    ({"device_fraction": 0.0}, r"model.device_fraction must be in \(0, 1\], got 0.0"),
    ({"device_fraction": 1.5}, r"model.device_fraction must be in \(0, 1\], got 1.5"),
    ({"device_fraction": 0.1}, r"model.host_fraction must be in \(0, 1 - device_fraction = 0.9\]"),
    ({"device_fraction": 0.5, "host_fraction": 0.6}, r"model.host_fraction must be in"),
    ({"cache_policy": "fifo"}, r"model.cache_policy must be 'lru' or 'lfu', got 'fifo'"),
])
def test_model_config_checks_name_the_key(values, message):
  with pytest.raises(ValueError, match=message):
    book_crossing_config.BookCrossingModelConfig(**values)


def test_data_config_checks_name_the_key():
  with pytest.raises(ValueError, match=r"data.min_ratings must be >= 2, got 1"):
    book_crossing_config.BookCrossingDataConfig(min_ratings=1)
  with pytest.raises(ValueError, match=r"data.on_bad_record must be one of"):
    book_crossing_config.BookCrossingDataConfig(on_bad_record="ignore")


def test_tables_use_string_keys_and_the_chosen_crosses():
  initialize.init()
  ranker = book_crossing.BookCrossingListwise()
  model = book_crossing_config.BookCrossingModelConfig(crosses=["location_isbn"],
                                                       id_vocabulary_size=50,
                                                       attribute_vocabulary_size=50,
                                                       cross_vocabulary_size=50,
                                                       rating_statistics=False)
  features, tables = ranker.sparse_features(model)
  key_dtypes = {t.name: t.key_dtype for t in tables}
  assert key_dtypes == {
      "user": "int64", "age_bucket": "int64", "year": "int64", "location": "string",
      "country": "string", "isbn": "string", "author": "string", "publisher": "string",
      "title_token": "string", "location_isbn": "string"
  }
  assert {f.name: f.table for f in features}["title_tokens"] == "title_token"
  _, example = ranker.model_feature_specs(model)
  assert "user_author" not in example and "isbn_mean_rating" not in example
  names = {layer.name for layer in ranker.build_model_builder(model, seed=1).build().layers}
  assert {"sparse_lookup_location_isbn", "sparse_lookup_isbn"} <= names
  assert "sparse_lookup_user_author" not in names


def test_baseline_scores_the_isbn_mean_training_rating(tmp_path):
  train = tmp_path / "train.tfrecord"
  lists = [({"user_id": 1}, [{"isbn": "a", "rating": 8.0}, {"isbn": "b", "rating": 2.0}]),
           ({"user_id": 2}, [{"isbn": "a", "rating": 6.0}])]
  elwc.write_elwc_tfrecord(train, [elwc.make_elwc(c, e) for c, e in lists])
  assert book_crossing.isbn_means(str(train)) == ({b"a": 7.0, b"b": 2.0}, 16.0 / 3)
  score = book_crossing.BookCrossingListwise().build_baseline(
      book_crossing.DataPaths(str(train), str(train)), None)
  got = score({"isbn": tf.constant([[[b"b"], [b"z"], [b"a"]]])})
  np.testing.assert_allclose(got.numpy(), [[2.0, 16.0 / 3, 7.0]], rtol=1e-6)


@pytest.mark.slow
def test_tiered_tables_split_each_tables_rows_by_fraction():
  model = book_crossing_config.BookCrossingModelConfig(id_vocabulary_size=100,
                                                       attribute_vocabulary_size=50,
                                                       cross_vocabulary_size=200,
                                                       device_fraction=0.1, host_fraction=0.3,
                                                       ssd_data_path=["/ssd"], cache_policy="lfu")
  _, tables = book_crossing.BookCrossingListwise().sparse_features(model)
  by_name = {t.name: t for t in tables}
  rows = {
      name: (t.device_vocabulary_size, t.host_vocabulary_size, t.ssd_vocabulary_size)
      for name, t in by_name.items()
  }
  assert rows["isbn"] == (10, 30, 60) and rows["year"] == (5, 15, 30)
  assert rows["user_author"] == (20, 60, 120)
  assert all(t.tiered and t.ssd_data_path == ("/ssd",) and t.cache_policy == "lfu" for t in tables)
  # Host rows alone (no SSD) when the two fractions cover the rows.
  model.host_fraction = 0.9
  _, tables = book_crossing.BookCrossingListwise().sparse_features(model)
  assert {t.ssd_vocabulary_size for t in tables} == {0}


def _tiny_job(tmp_path) -> list[str]:
  """Overrides of a tiny Book-Crossing job on write_book_crossing's data: 300 rows a table."""
  data_dir = write_book_crossing(tmp_path / "bx")
  return [
      f"data.data_dir={data_dir}", f"data.elwc_dir={tmp_path / 'elwc'}",
      f"pipeline.model_dir={tmp_path / 'run'}", "model.hidden_layer_dims=[8]", "model.id_dim=4",
      "model.attribute_dim=2", "model.cross_dim=2", "model.id_vocabulary_size=300",
      "model.attribute_vocabulary_size=300", "model.cross_vocabulary_size=300",
      "dataset.train_batch_size=4"
  ]


def test_trains_exports_and_predicts_the_sample(tmp_path, capsys):
  metrics = lib.train_cli(capsys, CONFIG, _tiny_job(tmp_path) + ["lambdamart.n_estimators=5"])
  lib.assert_metrics_file(metrics)
  stats = json.loads((tmp_path / "elwc" / lists_lib.STATS_FILE).read_text())
  assert stats["users"] == 8 and stats["explicit_without_book_row"] > 0
  assert metrics["data"]["train"]["bad_records"]["skipped"] == 0

  # The sample lists score (their ids are unseen here: default rows), and a fresh process
  # serves the validation lists as this one does.
  export = tmp_path / "run" / "export" / "latest_model"
  assert cli.main(["predict", str(export), "--input", SAMPLE]) == 0
  with open(SAMPLE, encoding="utf-8") as f:
    assert [len(s) for s in json.loads(capsys.readouterr().out)["scores"]
           ] == [len(item["examples"]) for item in json.load(f)]
  valid = str(tmp_path / "elwc" / "valid.tfrecord")
  command = [sys.executable, "-m", "mxrec_pipeline.cli", "predict", str(export), "--input", valid]
  served = json.loads(subprocess.run(command, capture_output=True, text=True,
                                     check=True).stdout)["scores"]
  model = tf.saved_model.load(str(export)).signatures["serving_default"]
  scores = model(examples=lib.serialized_lists(valid))["scores"].numpy()
  for row, got in zip(scores, served):
    np.testing.assert_allclose(got, row[:len(got)], rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_trains_with_tiered_tables_on_host_and_ssd(tmp_path, capsys):
  # 30 device rows of 300 per table, 15 in host memory, the rest on SSD.
  overrides = _tiny_job(tmp_path) + [
      "model.device_fraction=0.1", "model.host_fraction=0.05",
      f"model.ssd_data_path=[{tmp_path / 'ssd'}]", "lambdamart.enabled=false", *lib.TINY_PIPELINE
  ]
  (tmp_path / "ssd").mkdir()
  metrics = lib.train_cli(capsys, CONFIG, overrides)
  lib.assert_metrics_file(metrics)
  assert (tmp_path / "run" / "export" / "latest_model" / "saved_model.pb").is_file()

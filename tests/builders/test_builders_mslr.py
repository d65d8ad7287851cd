"""The MSLR DNN ranker (builders/mslr.py) on tiny LETOR files."""

import os

import numpy as np
import pytest
import tensorflow as tf

import builders_testlib as lib
from builders import mslr
from mxrec_pipeline import cli
from mxrec_pipeline.data import elwc

CONFIG = str(lib.CONFIG_DIR / "mslr_dnn.yaml")


@pytest.fixture(name="letor_files")
def _letor_files(tmp_path):
  return (lib.write_letor(tmp_path / "train.txt", 8, 6, first_qid=1, seed=1),
          lib.write_letor(tmp_path / "vali.txt", 4, 6, first_qid=100, seed=2))


def test_signed_log1p():
  got = mslr.signed_log1p(tf.constant([-(np.e - 1.0), 0.0, np.e - 1.0, 1e6]))
  np.testing.assert_allclose(got, [-1.0, 0.0, 1.0, np.log1p(1e6)], rtol=1e-6)


def test_preprocessor_joins_features_in_order_then_log1p():
  examples = {"b": tf.constant([[[3.0]]]), "a": tf.constant([[[-1.0, 0.0]]])}
  context, features = mslr.Log1pConcatPreprocessor(["b", "a"],
                                                   "joined")({"q": tf.constant([[1.0]])}, examples,
                                                             tf.constant([[True]]))
  assert list(context) == ["q"] and list(features) == ["joined"]
  np.testing.assert_allclose(features["joined"], [[[np.log1p(3.0), -np.log1p(1.0), 0.0]]],
                             rtol=1e-6)


@pytest.mark.slow
def test_trains_on_user_files_writes_metrics_and_exports(tmp_path, letor_files, capsys):
  train, valid = letor_files
  overrides = [
      f"data.train_path={train}", f"data.valid_path={valid}", f"data.elwc_dir={tmp_path / 'elwc'}",
      f"pipeline.model_dir={tmp_path / 'run'}", "model.hidden_layer_dims=[8]",
      "dataset.train_batch_size=4", "dataset.list_size=8", lib.LETOR_BASELINE_SET
  ]
  metrics = lib.train_cli(capsys, CONFIG, overrides)

  lib.assert_metrics_file(metrics)
  # The baseline feature equals the label in these files: it ranks perfectly.
  assert metrics["baseline"] == pytest.approx({k: 1.0 for k in metrics["baseline"]})
  # Export from the checkpoint scores as the model exported after training.
  args = ["export", CONFIG, "--out", str(tmp_path / "reexport")]
  for override in overrides:
    args += ["--set", override]
  assert cli.main(args) == 0
  (valid_elwc,) = [str(p) for p in (tmp_path / "elwc").glob("vali.*.tfrecord")]
  lists = lib.serialized_lists(valid_elwc)
  scores = [
      tf.saved_model.load(str(d)).signatures["serving_default"](examples=lists)["scores"]
      for d in (tmp_path / "run" / "export" / "latest_model", tmp_path / "reexport")
  ]
  assert scores[0].shape == [4, 6]
  np.testing.assert_allclose(scores[0], scores[1], rtol=1e-5, atol=1e-6)


def test_elwc_conversion_is_cached_and_follows_the_source(tmp_path, letor_files):
  train, _ = letor_files
  first = mslr.cached_elwc(train, tmp_path / "elwc", mslr.NUM_FEATURES)
  written_ns = os.stat(first).st_mtime_ns
  assert mslr.cached_elwc(train, tmp_path / "elwc", mslr.NUM_FEATURES) == first
  assert os.stat(first).st_mtime_ns == written_ns  # Not converted again.

  lib.write_letor(train, 3, 2, first_qid=1, seed=9)  # The source changes.
  os.utime(train, ns=(written_ns + 10**9, written_ns + 10**9))
  second = mslr.cached_elwc(train, tmp_path / "elwc", mslr.NUM_FEATURES)
  assert second != first
  assert [len(proto.examples) for proto in elwc.read_elwc_tfrecord(second)] == [2, 2, 2]


def test_checks_are_part_of_the_cache_and_skips_are_kept_beside_it(tmp_path, letor_files):
  train, _ = letor_files
  with open(train, "a", encoding="utf-8") as f:
    f.write("9 qid:99 1:1\n")  # A label outside [0, 4].
  with pytest.raises(ValueError, match=r"train\.txt:\d+: label 'utility' is 9, outside \[0, 4\]"):
    mslr.cached_elwc(train, tmp_path / "elwc", mslr.NUM_FEATURES)
  assert not list((tmp_path / "elwc").glob("*.tfrecord"))  # Nothing cached.

  skipped = mslr.cached_elwc(train, tmp_path / "elwc", mslr.NUM_FEATURES, on_bad_record="skip")
  report = mslr.bad_records(skipped)
  assert (report["skipped"], report["by_reason"]) == (1, {"label out of range": 1})
  assert len(list(elwc.read_elwc_tfrecord(skipped))) == 8
  wider = mslr.cached_elwc(train, tmp_path / "elwc", mslr.NUM_FEATURES, label_range=(0, 9))
  assert wider != skipped and mslr.bad_records(wider)["skipped"] == 0
  assert len(list(elwc.read_elwc_tfrecord(wider))) == 9


def test_baseline_ranks_by_whole_document_bm25():
  score = mslr.MslrDnn().build_baseline(None, mslr.MslrDataConfig())
  features = {
      "custom_features_110": tf.constant([[[2.0], [7.0]]]),
      "custom_features_106": tf.constant([[[9.0], [1.0]]])
  }
  np.testing.assert_array_equal(score(features), [[2.0, 7.0]])


@pytest.mark.parametrize("overrides, key", [
    (["data.train_path={train}"], "data.valid_path"),
    (["data.train_path={missing}", "data.valid_path={train}"], "data.train_path"),
    (["data.baseline_feature=0"], "data.baseline_feature"),
    (["data.num_features=0"], "data.num_features"),
    (["model.dropout=1.5"], "model.dropout"),
    (["model.hidden_units=[8]"], "model.hidden_units"),
    (["model.use_log1p=yes please"], "model.use_log1p"),
])
def test_config_errors_name_the_key(tmp_path, letor_files, capsys, overrides, key):
  train, _ = letor_files
  args = ["train", CONFIG, "--set", f"pipeline.model_dir={tmp_path / 'run'}"]
  for override in overrides:
    args += ["--set", override.format(train=train, missing=tmp_path / "nope.txt")]
  assert key in lib.cli_error(capsys, args)
  assert not (tmp_path / "run").exists()  # Failed before anything ran.

"""LETOR files of any width through the mslr_dnn builder: width, baseline checks, whole lists."""

import numpy as np
import pytest
import tensorflow as tf

import builders_testlib as lib
from builders import base_config
from builders import mslr
from builders import mslr_config
from mxrec_pipeline.data import elwc
from mxrec_pipeline.data import letor
from mxrec_pipeline.evaluation import evaluate_scores

CONFIG = str(lib.CONFIG_DIR / "mslr_dnn.yaml")


def _data(tmp_path, width, baseline, train_lists=(5, 7, 3), valid_lists=(4, 9, 2), **kwargs):
  train = lib.write_wide_letor(tmp_path / "train.txt", width, list(train_lists), baseline, seed=1)
  valid = lib.write_wide_letor(tmp_path / "vali.txt", width, list(valid_lists), baseline, seed=2,
                               first_qid=100)
  return mslr_config.MslrDataConfig(train_path=str(train), valid_path=str(valid),
                                    elwc_dir=str(tmp_path / "elwc"), baseline_feature=baseline,
                                    **kwargs)


@pytest.mark.parametrize("width, baseline", [(46, 25), (300, 110), (700, 3)])
def test_width_comes_from_the_data(tmp_path, width, baseline):
  ranker = mslr.MslrDnn()
  paths = ranker.prepare_data(_data(tmp_path, width, baseline))
  assert ranker.num_features == width
  _, example_spec, _ = ranker.feature_specs()
  assert list(example_spec) == letor.feature_names(width)
  (first, *_) = elwc.read_elwc_tfrecord(paths.train)
  assert len(first.examples[0].features.feature) == width + 1  # Features and the label.
  assert paths.valid_list_size == 9  # The longest validation list.


def test_the_scan_is_cached_beside_the_conversion(tmp_path, monkeypatch):
  data = _data(tmp_path, 46, 25)
  first = mslr.MslrDnn().prepare_data(data)

  def no_rescan(path):
    raise AssertionError(f"scanned {path} again")

  monkeypatch.setattr(letor, "scan_letor", no_rescan)
  ranker = mslr.MslrDnn()
  assert ranker.prepare_data(data) == first and ranker.num_features == 46
  assert len(list((tmp_path / "elwc").glob("*.shape.json"))) == 2


def test_num_features_from_the_config(tmp_path):
  ranker = mslr.MslrDnn()
  ranker.prepare_data(_data(tmp_path, 46, 25, num_features=60))
  assert ranker.num_features == 60
  with pytest.raises(
      ValueError, match=r"train\.txt:1: feature id 46 out of range \[1, 40\] "
      r"\(the data's width, data\.num_features\) in token '46:"):
    mslr.MslrDnn().prepare_data(_data(tmp_path, 46, 25, num_features=40))


def test_baseline_feature_outside_the_width(tmp_path):
  with pytest.raises(ValueError, match=r"data\.baseline_feature is 110, outside the data's "
                     r"width \[1, 46\]"):
    mslr.MslrDnn().prepare_data(
        mslr_config.MslrDataConfig(**{**vars(_data(tmp_path, 46, 25)), "baseline_feature": 110}))
  with pytest.raises(ValueError, match=r"data\.baseline_feature must be in \[1, 40\], got 41"):
    mslr_config.MslrDataConfig(num_features=40, baseline_feature=41)


def test_all_zero_baseline_feature_is_refused(tmp_path):
  data = vars(_data(tmp_path, 46, 25))
  with pytest.raises(
      ValueError, match=r"data\.baseline_feature 10 \(custom_features_10\) is 0 on "
      r"every line of the training data .*train\.txt"):
    mslr.MslrDnn().prepare_data(mslr_config.MslrDataConfig(**{**data, "baseline_feature": 10}))


def test_scan_letor(tmp_path):
  path = tmp_path / "a.txt"
  path.write_text("1 qid:3 1:0 4:2.5 # c\n0 qid:3 2:0\n\n2 qid:5 1:1 bad 9:0\n")
  assert letor.scan_letor(path) == letor.LetorShape(num_features=9, max_list_size=2, num_lists=2,
                                                    zero_features=(2, 3, 5, 6, 7, 8, 9))
  path.write_text("")
  assert letor.scan_letor(path) == letor.LetorShape(0, 0, 0, ())


def test_validation_keeps_whole_lists(tmp_path):
  ranker = mslr.MslrDnn()
  data = _data(tmp_path, 46, 25, valid_lists=(4, 30, 2))
  paths = ranker.prepare_data(data)
  builder = ranker.build_dataset_builder(paths, base_config.DatasetConfig(list_size=8), None)
  (batch, labels), = builder.build_raw_valid_dataset().take(1)
  assert labels.shape == [3, 30] and int(np.sum(labels.numpy() >= 0)) == 36
  # Ranking by the label-equal feature is perfect on the whole lists.
  scores = evaluate_scores(builder.build_raw_valid_dataset(), ranker.build_baseline(paths, data))
  assert scores == pytest.approx({k: 1.0 for k in scores})
  # dataset.valid_list_size still cuts, as documented.
  cut = ranker.build_dataset_builder(paths, base_config.DatasetConfig(list_size=8,
                                                                      valid_list_size=5), None)
  assert next(iter(cut.build_raw_valid_dataset()))[1].shape == [3, 5]
  # Other builders (ELWC without a known longest list): read from the files.
  plain = ranker.build_dataset_builder(mslr.DataPaths(paths.train, paths.valid),
                                       base_config.DatasetConfig(list_size=8), None)
  assert next(iter(plain.build_raw_valid_dataset()))[1].shape == [3, 30]


def test_skip_queries_without_relevant(tmp_path):
  # Two lists: one with relevant documents ranked worst-first, one without any.
  valid = tmp_path / "vali.txt"
  valid.write_text("1 qid:1 1:1 2:1\n0 qid:1 1:2 2:1\n0 qid:2 1:1 2:1\n0 qid:2 1:3 2:1\n")
  data = mslr_config.MslrDataConfig(train_path=str(valid), valid_path=str(valid),
                                    elwc_dir=str(tmp_path / "elwc"), baseline_feature=1)
  ranker = mslr.MslrDnn()
  paths = ranker.prepare_data(data)
  builder = ranker.build_dataset_builder(paths, base_config.DatasetConfig(), None)
  baseline = ranker.build_baseline(paths, data)
  ndcg_first = 1.0 / np.log2(3.0)  # The relevant document at rank 2.
  counted = evaluate_scores(builder.build_raw_valid_dataset(), baseline)
  assert counted["ndcg@10"] == pytest.approx(ndcg_first / 2)  # tfr: the other list scores 0.
  builder.skip_lists_without_relevant = True
  skipped = evaluate_scores(builder.build_raw_valid_dataset(), baseline)
  assert skipped["ndcg@10"] == pytest.approx(ndcg_first) and skipped["mrr"] == pytest.approx(0.5)
  assert sum(int(b[1].shape[0]) for b in builder.build_raw_valid_dataset(all_lists=True)) == 2
  assert sum(int(b[1].shape[0]) for b in builder.build_valid_dataset(num_epochs=1)) == 1


@pytest.mark.slow
def test_trains_a_46_feature_set_and_states_the_convention(tmp_path, capsys):
  data = _data(tmp_path, 46, 25, train_lists=(5, 7, 3, 6), valid_lists=(4, 12, 3))
  overrides = [
      f"data.train_path={data.train_path}", f"data.valid_path={data.valid_path}",
      f"data.elwc_dir={data.elwc_dir}", "data.baseline_feature=25",
      f"pipeline.model_dir={tmp_path / 'run'}", "model.hidden_layer_dims=[8]",
      "dataset.train_batch_size=2", "dataset.list_size=4",
      "metrics.skip_queries_without_relevant=true"
  ]
  metrics = lib.train_cli(capsys, CONFIG, overrides)
  lib.assert_metrics_file(metrics)
  assert metrics["baseline"] == pytest.approx({k: 1.0 for k in metrics["baseline"]})
  assert metrics["data"]["valid"]["skip_queries_without_relevant"] is True
  saved = tf.saved_model.load(str(tmp_path / "run" / "export" / "latest_model"))
  scores = saved.signatures["serving_default"](
      examples=lib.serialized_lists(mslr.MslrDnn().prepare_data(data).valid))["scores"]
  assert scores.shape == [3, 12]


def test_config_errors_exit_2(tmp_path, capsys):
  data = _data(tmp_path, 46, 25)
  args = ["train", CONFIG]
  for override in (f"data.train_path={data.train_path}", f"data.valid_path={data.valid_path}",
                   f"data.elwc_dir={data.elwc_dir}", f"pipeline.model_dir={tmp_path / 'run'}"):
    args += ["--set", override]
  assert "data.baseline_feature is 110, outside the data's width [1, 46]" in lib.cli_error(
      capsys, args)
  assert "metrics.skip_queries_without_relevant" in lib.cli_error(
      capsys, args + ["--set", "metrics.skip_queries_without_relevant=maybe"])
  assert "metrics.other" in lib.cli_error(capsys, args + ["--set", "metrics.other=1"])


@pytest.mark.network
@pytest.mark.slow
def test_the_real_mslr_5k(tmp_path):
  ranker = mslr.MslrDnn()
  paths = ranker.prepare_data(mslr_config.MslrDataConfig(elwc_dir=str(tmp_path / "elwc")))
  # Validation (the test split) keeps its longest list, 229 documents (not list_size 200).
  assert (ranker.num_features, paths.valid_list_size) == (136, 229)

"""keras/datasets.validation_batches: the batches a PS coordinator and the sidecar evaluator score.

12 validation lists in batches of 4: one pass is 3 batches; `num_valid_steps`
5 repeats the data as Keras' validation_steps reads it (batches 4-5 are
batches 1-2 again), raw ids (the sidecar's serving scorer) and the pipeline's
path alike.
"""

import numpy as np

import keras_testlib as lib
from mxrec_pipeline.keras import datasets


def _labels(dataset) -> list[np.ndarray]:
  return [labels.numpy() for _, labels in dataset]


def test_num_steps_repeat_the_data_and_raw_ids_come_in_the_same_batches(tmp_path):
  train, valid = lib.write_task(tmp_path)
  builder = lib.dataset_builder(train, valid)
  one_pass = _labels(datasets.validation_batches(builder, None, raw=True))
  assert len(one_pass) == 3
  raw = _labels(datasets.validation_batches(builder, 5, raw=True))
  assert len(raw) == 5
  for got, want in zip(raw, one_pass + one_pass[:2]):
    np.testing.assert_array_equal(got, want)
  # The pipeline's path (build_valid_dataset; a builder that inserts nothing here).
  same = _labels(datasets.validation_batches(builder.with_raw_ids(), 5))
  for got, want in zip(same, raw):
    np.testing.assert_array_equal(got, want)
  assert len(_labels(datasets.validation_batches(builder.with_raw_ids(), None))) == 3

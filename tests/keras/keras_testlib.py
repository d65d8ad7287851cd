"""A tiny ranking task in ELWC, hand-checkable, for pipeline and export tests.

Lists of a user (context: user_id int64, city string) over items (example:
item_id int64, tags ragged strings, price float); label in {0, 1, 2}. Items
< 20 appear in training; validation also holds unseen items >= 1000.
"""

import json
import os
import subprocess
import sys

import numpy as np
import tensorflow as tf

from mxrec_pipeline.data import elwc
from mxrec_pipeline.keras import model as model_lib
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.keras.layers import SparseFeature, TableSpec
from mxrec_pipeline.util import initialize

F = tf.io.FixedLenFeature
CONTEXT_SPEC = {
    "user_id": F([1], tf.int64, default_value=0), "city": F([1], tf.string, default_value="")
}
EXAMPLE_SPEC = {
    "item_id": F([1], tf.int64, default_value=0), "price": F([1], tf.float32, default_value=0.0),
    "tags": tf.io.RaggedFeature(tf.string)
}
LABEL_SPEC = ("label", F([1], tf.float32, default_value=-1.0))
MASK = "example_list_mask"
SPARSE_FEATURES = [
    SparseFeature("user_id", "user"),
    SparseFeature("city", "word"),
    SparseFeature("item_id", "item"),
    SparseFeature("tags", "word")
]
TABLES = [
    TableSpec("user", 4, 100),
    TableSpec("item", 4, 200),
    TableSpec("word", 4, 100, key_dtype="string")
]


def make_lists(num_lists: int, seed: int, unseen_items: bool = False,
               first_user: int | None = None) -> list:
  """ELWC lists; user i % 7 of list i, or user first_user + i (one list each)."""
  rng = np.random.default_rng(seed)
  lists = []
  for i in range(num_lists):
    n = int(rng.integers(2, 6))
    items = rng.choice(20, size=n, replace=False)
    if unseen_items:
      items[0] = 1000 + i
    examples = [{
        "item_id": int(item), "price": float(item) / 10.0,
        "tags": [f"t{item % 3}", f"t{item % 5}"][:1 + item % 2], "label": float((item + i) % 3)
    } for item in items]
    user = i % 7 if first_user is None else first_user + i
    lists.append(elwc.make_elwc({"user_id": user, "city": f"c{i % 3}"}, examples))
  return lists


def write_task(tmp_path) -> tuple[str, str]:
  train, valid = str(tmp_path / "train.tfrecord"), str(tmp_path / "valid.tfrecord")
  elwc.write_elwc_tfrecord(train, make_lists(48, seed=0))
  elwc.write_elwc_tfrecord(valid, make_lists(12, seed=1, unseen_items=True))
  return train, valid


def model_builder(seed: int = 1, hidden_layer_dims=(8,), tables=None) -> model_lib.ModelBuilder:
  """The task's ranker: a DNN over the sparse features, on `tables` (default TABLES)."""
  return model_lib.ModelBuilder(
      input_creator=model_lib.FeatureSpecInputCreator(CONTEXT_SPEC, EXAMPLE_SPEC), preprocessor={},
      scorer=model_lib.DNNScorer(hidden_layer_dims=list(hidden_layer_dims), output_units=1),
      mask_feature_name=MASK, sparse_features=SPARSE_FEATURES, tables=tables or TABLES, seed=seed)


def tiered_tables(ssd_dir: str) -> list[TableSpec]:
  """TABLES with the item table tiered: 12 rows on the device, 4 on the host, 100 on SSD.

  Training batches of 2 lists (`dataset_builder(..., train_batch_size=2)`) keep
  each batch's items within the 12 device rows; the 20 items overflow them.
  """
  return [
      TableSpec("user", 4, 100),
      TableSpec("item", 4, 12, host_vocabulary_size=4, ssd_vocabulary_size=100,
                ssd_data_path=(ssd_dir,)),
      TableSpec("word", 4, 100, key_dtype="string")
  ]


def dataset_builder(train: str, valid: str,
                    train_batch_size: int = 8) -> pipeline_lib.SimpleDatasetBuilder:
  hparams = pipeline_lib.DatasetHparams(train_input_pattern=train, valid_input_pattern=valid,
                                        train_batch_size=train_batch_size, valid_batch_size=4)
  return pipeline_lib.SimpleDatasetBuilder(CONTEXT_SPEC, EXAMPLE_SPEC, MASK, LABEL_SPEC, hparams,
                                           sparse_features=SPARSE_FEATURES)


def eval_scores(model, dataset) -> np.ndarray:
  """[num_lists, list_size] eval-mode scores of a dataset's lists, zero-padded."""
  scores = [model(features, training=False).numpy() for features, _ in dataset]
  longest = max(s.shape[1] for s in scores)
  return np.concatenate([np.pad(s, ((0, 0), (0, longest - s.shape[1]))) for s in scores])


# Scores a SavedModel in a fresh interpreter where only tensorflow may be
# imported and the op library must not be mapped.
SERVE_SCRIPT = r"""
import json, sys
import tensorflow as tf
model = tf.saved_model.load(sys.argv[1])
serialized = [bytes.fromhex(h) for h in json.loads(sys.argv[2])]
scores = model.signatures["serving_default"](examples=tf.constant(serialized))["scores"]
assert not any(m.startswith("mxrec_pipeline") or m.startswith("builders") for m in sys.modules)
loaded = [l for l in open("/proc/self/maps") if "_mxrec_ops" in l]
assert not loaded, loaded
print(json.dumps(scores.numpy().tolist()))
"""


def serve_in_fresh_process(export_dir: str, valid_path: str, cwd: str) -> np.ndarray:
  """[num_lists, list_size] scores of the ELWC lists in `valid_path` by the SavedModel."""
  serialized = [r.SerializeToString() for r in elwc.read_elwc_tfrecord(valid_path)]
  out = subprocess.run(
      [sys.executable, "-c", SERVE_SCRIPT, export_dir,
       json.dumps([s.hex() for s in serialized])], capture_output=True, text=True, check=True,
      cwd=cwd, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
  return np.array(json.loads(out.stdout.strip().splitlines()[-1]))


def assert_served_match(served: np.ndarray, expected: np.ndarray, valid_path: str) -> None:
  """Each served list's scores equal those of one list scored in process.

  tfr's datasets read with sloppy ordering, so lists are matched one to one
  (every list has distinct item ids, so scores differ).
  """
  assert len(served) == len(expected)
  unmatched = list(range(len(expected)))
  for row, lst in enumerate(elwc.read_elwc_tfrecord(valid_path)):
    n = len(lst.examples)
    match = [
        j for j in unmatched if np.allclose(served[row, :n], expected[j, :n], rtol=1e-5, atol=1e-5)
    ]
    assert match, f"served list {row} {served[row, :n]} matches no in-process list"
    unmatched.remove(match[0])


def train_task(tmp_path, **hparams) -> dict:
  """Writes the task to tmp_path and trains it with SimplePipeline in a new run.

  Args:
    tmp_path: pathlib.Path of the task files and `model/` (the model_dir).
    **hparams: PipelineHparams fields besides model_dir.

  Returns:
    {"tmp": tmp_path, "valid": validation file, "pipeline": the trained
    SimplePipeline, "metrics": train_and_validate's, "in_process":
    [num_lists, list_size] float32 eval-mode scores of the validation lists
    (seen items and unseen ones), through the training-side path (insertion
    in the dataset), zero-padded}.
  """
  train, valid = write_task(tmp_path)
  initialize.terminate_config_initializer()
  pipe = pipeline_lib.SimplePipeline(
      model_builder(), dataset_builder(train, valid),
      pipeline_lib.PipelineHparams(model_dir=str(tmp_path / "model"), **hparams))
  metrics = pipe.train_and_validate()
  return {
      "tmp": tmp_path, "valid": valid, "pipeline": pipe, "metrics": metrics,
      "in_process": eval_scores(pipe.model,
                                dataset_builder(train, valid).build_valid_dataset(num_epochs=1))
  }

"""Exports the keras_testlib task's model twice, SIGKILLed in the second export.

  python export_worker.py TASK_DIR EXPORT_DIR OUT_JSON

Builds the model (no training: one training batch inserts keys), exports it
to EXPORT_DIR, writes OUT_JSON with the scores of TASK_DIR/valid.tfrecord by
that export, then changes the scorer's bias and exports again to EXPORT_DIR,
SIGKILLing itself once the SavedModel is in the temporary directory and before
it is renamed into place.
"""

import json
import os
import signal
import sys

import tensorflow as tf

import keras_testlib as lib
from mxrec_pipeline.data import elwc
from mxrec_pipeline.keras import export as export_lib
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.util import initialize


def main(task_dir: str, export_dir: str, out_json: str) -> None:
  train, valid = (os.path.join(task_dir, f"{name}.tfrecord") for name in ("train", "valid"))
  datasets = lib.dataset_builder(train, valid)
  pipe = pipeline_lib.SimplePipeline(
      lib.model_builder(), datasets,
      pipeline_lib.PipelineHparams(model_dir=os.path.join(task_dir, "worker"), num_epochs=1))
  initialize.init()
  model = pipe.build_compiled_model()
  features, _ = next(iter(datasets.build_train_dataset(num_epochs=1)))
  model(features, training=False)
  pipe.export_saved_model(model, export_dir)
  serialized = tf.constant([r.SerializeToString() for r in elwc.read_elwc_tfrecord(valid)])
  scores = tf.saved_model.load(export_dir).signatures["serving_default"](examples=serialized)
  with open(out_json, "w", encoding="utf-8") as f:
    json.dump(scores["scores"].numpy().tolist(), f)

  bias = model.trainable_variables[-1]
  bias.assign_add(tf.ones_like(bias))
  export_lib.export_serving_model(model, export_dir, lib.CONTEXT_SPEC, lib.EXAMPLE_SPEC, lib.MASK,
                                  lib.SPARSE_FEATURES,
                                  before_rename=lambda path: os.kill(os.getpid(), signal.SIGKILL))
  raise AssertionError("the second export was not killed")


if __name__ == "__main__":
  main(*sys.argv[1:])

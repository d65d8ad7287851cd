"""A whole run on TensorFlow's in-memory `ram://` filesystem: nothing of it touches the disk.

Train one epoch, a second pipeline in the same process resumes from the
checkpoint for a second epoch (as a restarted job would), the export is served
from `ram://` and scores as the trained model does; the model_dir's files
(checkpoints with their manifests, the export, logs) are all on `ram://`, and
the local directory holds only the task's data. Storage goes through
tf.io.gfile (util/model_files.py), so any TF filesystem (GCS, S3, HDFS) works
the same way.
"""

import uuid

import pytest
import tensorflow as tf

import keras_testlib as lib
from mxrec_pipeline import evaluation
from mxrec_pipeline.data import elwc
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.util import initialize


@pytest.fixture(autouse=True)
def _fresh_run():
  initialize.terminate_config_initializer()
  yield
  initialize.terminate_config_initializer()


def _pipeline(train, valid, model_dir, num_epochs):
  hparams = pipeline_lib.PipelineHparams(model_dir=model_dir, num_epochs=num_epochs,
                                         num_train_steps=4 * num_epochs, learning_rate=0.05, seed=3,
                                         export_best_model=True)
  return pipeline_lib.SimplePipeline(lib.model_builder(), lib.dataset_builder(train, valid),
                                     hparams)


def test_train_resume_export_and_serve_on_ram_filesystem(tmp_path):
  train, valid = lib.write_task(tmp_path)
  local_before = sorted(p.name for p in tmp_path.iterdir())
  model_dir = f"ram://mxrec-{uuid.uuid4().hex}/model"
  _pipeline(train, valid, model_dir, 1).train_and_validate()
  assert tf.io.gfile.exists(f"{model_dir}/checkpoints/ckpt-1.index")
  assert tf.io.gfile.exists(f"{model_dir}/checkpoints/ckpt-1.manifest.json")

  initialize.terminate_config_initializer()
  second = _pipeline(train, valid, model_dir, 2)
  second.train_and_validate()  # Resumes at epoch 2 from ckpt-1.
  assert tf.io.gfile.exists(f"{model_dir}/checkpoints/ckpt-2.index")
  assert not tf.io.gfile.exists(f"{model_dir}/checkpoints/ckpt-3.index")  # Epoch 1 not redone.
  assert tf.io.gfile.exists(f"{model_dir}/export/best_model_by_metric/best_metric.json")
  assert tf.io.gfile.glob(f"{model_dir}/logs/*")

  # The export served from ram:// scores every list as the trained model does.
  served = tf.saved_model.load(f"{model_dir}/export/latest_model")
  serialized = [r.SerializeToString() for r in elwc.read_elwc_tfrecord(valid)]
  scores = served.signatures["serving_default"](examples=tf.constant(serialized))["scores"]
  expected = lib.eval_scores(second.model,
                             lib.dataset_builder(train, valid).build_valid_dataset(num_epochs=1))
  lib.assert_served_match(scores.numpy(), expected, valid)
  assert sorted(p.name for p in tmp_path.iterdir()) == local_before  # Nothing written locally.


def test_metrics_and_config_files_go_through_the_filesystem_layer():
  model_dir = f"ram://mxrec-{uuid.uuid4().hex}/job"
  tf.io.gfile.makedirs(model_dir)
  path = evaluation.write_metrics(model_dir, {"ndcg": 0.5}, {"ndcg": 0.4})
  assert path.startswith("ram://") and "ndcg" in tf.io.gfile.GFile(path).read()

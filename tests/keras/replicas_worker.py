"""Trains the Keras test task with N replicas and with one; saves the results.

Run in a fresh process (logical CPU devices must be set before TensorFlow
initializes them): `python replicas_worker.py OUT.npz DIR N CASE [CASE ...]`.
For each CASE the same global batches train SimplePipeline under
MirroredStrategy with one replica (logical CPU 0) and with N (logical CPUs
0..N-1); the test compares per-step and epoch losses, validation metrics,
dense weights and every table's rows by key. CASE "flat" uses keras_testlib's
tables; "tiered" makes the item table tiered (keras_testlib.tiered_tables),
with training batches of 2 lists. (One N per process: MirroredStrategies over
different device counts in one process collide in TF's collective groups.)

The loss is tfr's mean_squared_loss (with Adam and lazy Adam): a listwise
softmax loss is invariant to a per-list shift of the scores, so some gradients
(the output bias's) are zero up to float rounding, whose sign Adam turns into
full learning-rate steps; summing the replicas' gradients rounds differently
from one replica's sum, so such weights would differ by the learning rate.
"""

import pathlib
import sys

import numpy as np
import tensorflow as tf

NUM_REPLICAS = int(sys.argv[3])
CPU = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(CPU,
                                           [tf.config.LogicalDeviceConfiguration()] * NUM_REPLICAS)

# pylint: disable=wrong-import-position
import keras_testlib as lib  # noqa: E402
from mxrec_pipeline.core import lookup  # noqa: E402
from mxrec_pipeline.keras import model as model_lib  # noqa: E402
from mxrec_pipeline.keras import pipeline as pipeline_lib  # noqa: E402
from mxrec_pipeline.util import initialize  # noqa: E402


def model_builder(tables):
  """The task's ranker (keras_testlib) without batch norm and dropout.

  Both see only a replica's examples under a strategy (per-replica batch
  statistics, per-replica random masks), so they differ from one replica.
  """
  return model_lib.ModelBuilder(
      input_creator=model_lib.FeatureSpecInputCreator(lib.CONTEXT_SPEC,
                                                      lib.EXAMPLE_SPEC), preprocessor={},
      scorer=model_lib.DNNScorer(hidden_layer_dims=[8], output_units=1, use_batch_norm=False,
                                 dropout=0.0), mask_feature_name=lib.MASK,
      sparse_features=lib.SPARSE_FEATURES, tables=tables or lib.TABLES, seed=1)


class StepLosses(tf.keras.callbacks.Callback):
  """Keras' running training loss after every step."""

  def __init__(self):
    super().__init__()
    self.losses = []

  def on_train_batch_end(self, batch, logs=None):
    self.losses.append(logs["loss"])


def train(strategy, tmp: pathlib.Path, tiered: bool) -> dict:
  """Trains 2 epochs of 3 steps each (full global batches); returns the final state."""
  tmp.mkdir(parents=True)
  train_path, valid_path = lib.write_task(tmp)
  tables = lib.tiered_tables(str(tmp)) if tiered else None
  initialize.terminate_config_initializer()
  hparams = pipeline_lib.PipelineHparams(model_dir=str(tmp / "model"), num_epochs=2,
                                         num_train_steps=6, learning_rate=0.05, seed=3,
                                         export_best_model=False, loss="mean_squared_loss")
  pipe = pipeline_lib.SimplePipeline(
      model_builder(tables),
      lib.dataset_builder(train_path, valid_path, train_batch_size=2 if tiered else 8), hparams,
      strategy=strategy)
  steps = StepLosses()
  metrics = pipe.train_and_validate(callbacks=[steps])
  model = pipe.model
  out = {
      "step_losses": np.array(steps.losses), "epoch_losses": np.array(pipe.history.history["loss"]),
      "metrics": np.array([metrics[k] for k in sorted(metrics)])
  }
  tables = {id(v) for v in model.table_variables}
  for i, variable in enumerate(v for v in model.trainable_variables if id(v) not in tables):
    out[f"dense_{i}"] = variable.numpy()
  run = initialize.get_config_initializer()
  for name, table in run.tables.items():
    keys, rows = table.key_index.export()
    order = np.argsort(keys.numpy())
    rows = tf.constant(rows.numpy()[order])
    out[f"{name}_keys"] = keys.numpy()[order]
    out[f"{name}_rows"] = lookup.unique_embeddings(table, rows, training=False).numpy()
    copies = getattr(table.variable, "values", [table.variable])
    for copy in copies[1:]:  # Mirrored copies stay identical.
      np.testing.assert_array_equal(copy.numpy(), copies[0].numpy(), err_msg=name)
    if table.is_tiered:
      out[f"{name}_swap_ins"] = table.tiers.stats()["swap_ins"].numpy()
  initialize.terminate_config_initializer()
  return out


def main():
  out_path, work, cases = sys.argv[1], pathlib.Path(sys.argv[2]), sys.argv[4:]
  devices = [d.name for d in tf.config.list_logical_devices("CPU")]
  strategies = {
      1: tf.distribute.MirroredStrategy(devices[:1]),
      NUM_REPLICAS: tf.distribute.MirroredStrategy(devices)
  }
  states = {}
  for case in cases:
    for n, strategy in strategies.items():
      assert strategy.num_replicas_in_sync == n
      state = train(strategy, work / f"{case}_{n}", case == "tiered")
      states.update({f"{case}_{n}_{k}": v for k, v in state.items()})
  np.savez(out_path, **states)


if __name__ == "__main__":
  main()

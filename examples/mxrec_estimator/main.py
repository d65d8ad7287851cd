"""The mxRec quick-start model with tf.estimator.Estimator and GraphModifierHook.

Tables are created inside model_fn (each Estimator graph creates its own; the
evaluation graph's session restores the key indexes with the checkpoint).
GraphModifierHook goes in the train, evaluate and predict hooks: with
USE_MODIFY_GRAPH=1 it rewrites the plain-id lookups so insertion runs in the
dataset; with 0 the input_fn maps get_asc_insert_func and the hook checks the
tables (start_asc_pipeline).

Run: python examples/mxrec_estimator/main.py [--steps 200] [--model-dir DIR]
"""

import argparse
import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "mxrec_quickstart"))
import dataset as dataset_lib  # noqa: E402  pylint: disable=wrong-import-position
import model as model_lib  # noqa: E402  pylint: disable=wrong-import-position
from main import BATCH_SIZE, DIM, EVAL_STEPS, ITEM_VOCAB, USER_VOCAB  # noqa: E402

from mxrec_pipeline.core.asc.feature_spec import FeatureSpec  # noqa: E402
from mxrec_pipeline.core.asc.helper import get_asc_insert_func  # noqa: E402
from mxrec_pipeline.core.embedding import create_table, sparse_lookup  # noqa: E402
from mxrec_pipeline.graph.modifier import GraphModifierHook  # noqa: E402
from mxrec_pipeline.optimizers import lazy_adam  # noqa: E402
from mxrec_pipeline.saver.saver import Saver  # noqa: E402
from mxrec_pipeline.util.initialize import init, terminate_config_initializer  # noqa: E402
from mxrec_pipeline.util.variable import get_dense_and_sparse_variable  # noqa: E402

TRAIN_LOSS = "train_loss"


def feature_specs():
  return [
      FeatureSpec("user_ids", table_name="user_table", feat_count=1),
      FeatureSpec("item_ids", table_name="item_table", feat_count=1)
  ]


def make_input_fn(is_training, modify_graph):

  def input_fn():
    dataset = dataset_lib.generate_dataset(is_training, BATCH_SIZE)
    if not modify_graph:
      dataset = dataset.map(
          get_asc_insert_func(tgt_key_specs=feature_specs(), is_training=is_training))
    return dataset.prefetch(10)

  return input_fn


def model_fn(features, labels, mode, params):
  del labels  # In the features dict, as in mxRec's examples.
  is_train = mode == tf.estimator.ModeKeys.TRAIN
  tables = [
      create_table(
          key_dtype=tf.int64, dim=tf.TensorShape([DIM]), name=name,
          emb_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.05,
                                                                    seed=model_lib.SEED + i),
          device_vocabulary_size=vocab)
      for i, (name, vocab) in enumerate((("user_table", USER_VOCAB), ("item_table", ITEM_VOCAB)))
  ]
  modify_graph = params["modify_graph"]
  ids = [features["user_ids"], features["item_ids"]] if modify_graph else feature_specs()
  user_emb, item_emb = [
      sparse_lookup(table, feature, send_count=BATCH_SIZE, is_train=is_train,
                    name=f"{table.table_name}_lookup", modify_graph=modify_graph, batch=features)
      for feature, table in zip(ids, tables)
  ]
  with tf.compat.v1.variable_scope("model", reuse=tf.compat.v1.AUTO_REUSE):
    loss, pred_0, pred_1 = model_lib.my_model(user_emb, item_emb, features["label_0"],
                                              features["label_1"])
  if mode == tf.estimator.ModeKeys.PREDICT:
    return tf.estimator.EstimatorSpec(mode, predictions={"label_0": pred_0, "label_1": pred_1},
                                      scaffold=tf.compat.v1.train.Scaffold(saver=Saver()))
  if mode == tf.estimator.ModeKeys.EVAL:
    return tf.estimator.EstimatorSpec(
        mode, loss=loss,
        eval_metric_ops={"auc": tf.compat.v1.metrics.auc(features["label_0"], pred_0)},
        scaffold=tf.compat.v1.train.Scaffold(saver=Saver()))
  tf.compat.v1.add_to_collection(TRAIN_LOSS, loss)
  dense_variables, sparse_variables = get_dense_and_sparse_variable()
  grads = tf.gradients(loss, dense_variables + sparse_variables)
  train_op = tf.group(
      tf.compat.v1.train.AdamOptimizer(0.001).apply_gradients(
          zip(grads[:len(dense_variables)], dense_variables)),
      lazy_adam.create_hash_optimizer(learning_rate=0.001).apply_gradients(
          zip(grads[len(dense_variables):], sparse_variables),
          global_step=tf.compat.v1.train.get_global_step()))
  # The sparse Saver (in every mode), made after the train op so it sees the slots.
  return tf.estimator.EstimatorSpec(mode, loss=loss, train_op=train_op,
                                    scaffold=tf.compat.v1.train.Scaffold(saver=Saver()))


class LastLossHook(tf.compat.v1.train.SessionRunHook):
  """Keeps the training loss of the last step (for comparing with the session run)."""

  def __init__(self):
    self.value = None

  def before_run(self, run_context):
    return tf.compat.v1.train.SessionRunArgs(tf.compat.v1.get_collection(TRAIN_LOSS)[0])

  def after_run(self, run_context, run_values):
    self.value = float(run_values.results)


def main(argv=None) -> dict:
  """Trains and evaluates; returns the last step's training loss and the evaluation."""
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=200)
  parser.add_argument("--model-dir", default="./estimator-model")
  args = parser.parse_args(argv)
  modify_graph = bool(int(os.getenv("USE_MODIFY_GRAPH", "0")))
  init(train_steps=args.steps, eval_steps=EVAL_STEPS)
  estimator = tf.estimator.Estimator(
      model_fn=model_fn, model_dir=args.model_dir, params={"modify_graph": modify_graph},
      config=tf.estimator.RunConfig(tf_random_seed=model_lib.SEED, save_checkpoints_steps=100,
                                    log_step_count_steps=50))
  last_loss = LastLossHook()
  tf.estimator.train_and_evaluate(
      estimator,
      tf.estimator.TrainSpec(make_input_fn(True, modify_graph), max_steps=args.steps,
                             hooks=[GraphModifierHook(), last_loss]),
      tf.estimator.EvalSpec(make_input_fn(False, modify_graph), steps=EVAL_STEPS,
                            hooks=[GraphModifierHook()], throttle_secs=0))
  result = estimator.evaluate(make_input_fn(False, modify_graph), steps=EVAL_STEPS,
                              hooks=[GraphModifierHook()])
  predictions = estimator.predict(make_input_fn(False, modify_graph), hooks=[GraphModifierHook()])
  first = next(iter(predictions))
  print(
      f"step {result['global_step']}: train loss {last_loss.value:.4f}, eval loss "
      f"{result['loss']:.4f}, eval auc {result['auc']:.4f}, first prediction "
      f"{first['label_0'][0]:.4f}", flush=True)
  terminate_config_initializer()
  return {
      "step": int(result["global_step"]), "train_loss": last_loss.value,
      "eval_loss": float(result["loss"]), "eval_auc": float(result["auc"])
  }


if __name__ == "__main__":
  main()

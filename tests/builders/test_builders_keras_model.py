"""KerasModelBuilder (builders/keras_model.py): a user's Keras model as a ranker."""

import numpy as np
import pytest
import tensorflow as tf

import builders_testlib as lib
from builders.base import MASK_FEATURE
from builders.keras_model import KerasModelBuilder
from mxrec_pipeline.data import elwc
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.util import initialize

_F = tf.io.FixedLenFeature
CONTEXT_SPEC = {"query_length": _F([1], tf.float32, default_value=0.0)}
EXAMPLE_SPEC = {
    "bm25": _F([1], tf.float32, default_value=0.0), "pagerank": _F([2], tf.float32,
                                                                   default_value=[0.0, 0.0])
}
LABEL_SPEC = ("relevance", _F([1], tf.float32, default_value=-1.0))


def user_model(name="user_scorer"):
  """A pointwise scorer as a user would have it: named inputs, [batch, 1] out."""
  inputs = {
      "query_length": tf.keras.Input([1], name="query_length"),
      "bm25": tf.keras.Input([1], name="bm25"), "pagerank": tf.keras.Input([2], name="pagerank")
  }
  x = tf.keras.layers.Concatenate()([inputs[k] for k in sorted(inputs)])
  x = tf.keras.layers.Dense(4, activation="relu")(x)
  return tf.keras.Model(inputs, tf.keras.layers.Dense(1)(x), name=name)


def write_lists(path, num_lists, seed):
  rng = np.random.default_rng(seed)
  lists = []
  for _ in range(num_lists):
    examples = [{
        "bm25": float(b), "pagerank": rng.uniform(size=2).tolist(), "relevance": float(b > 0.5)
    } for b in rng.uniform(size=rng.integers(2, 5))]
    lists.append(elwc.make_elwc({"query_length": float(rng.integers(1, 6))}, examples))
  elwc.write_elwc_tfrecord(path, lists)
  return str(path)


@pytest.mark.slow
def test_wraps_trains_and_exports_a_keras_model(tmp_path):
  train = write_lists(tmp_path / "train.tfrecord", 16, seed=0)
  valid = write_lists(tmp_path / "valid.tfrecord", 5, seed=1)
  original = user_model()
  original_weights = [w.copy() for w in original.get_weights()]
  dataset_builder = pipeline_lib.SimpleDatasetBuilder(
      CONTEXT_SPEC, EXAMPLE_SPEC, MASK_FEATURE, LABEL_SPEC,
      pipeline_lib.DatasetHparams(train_input_pattern=train, valid_input_pattern=valid,
                                  train_batch_size=4, valid_batch_size=5))
  pipeline = pipeline_lib.SimplePipeline(
      KerasModelBuilder(original, ["query_length"], ["bm25", "pagerank"], MASK_FEATURE),
      dataset_builder,
      pipeline_lib.PipelineHparams(model_dir=str(tmp_path / "run"), num_train_steps=3,
                                   learning_rate=0.1))
  metrics = pipeline.train_and_validate()

  assert set(metrics) >= {"ndcg@10", "mrr"}
  # The pipeline trained a clone made under its strategy, not the caller's model.
  trained = pipeline.model.get_layer("user_scorer")
  assert trained is not original
  assert not all(np.array_equal(a, b) for a, b in zip(trained.get_weights(), original_weights))
  for a, b in zip(original.get_weights(), original_weights):
    np.testing.assert_array_equal(a, b)

  # Each score is the user's model on that (context, example) pair.
  features, _ = next(iter(dataset_builder.build_valid_dataset(num_epochs=1)))
  scores = pipeline.model(features).numpy()
  mask = features[MASK_FEATURE].numpy()
  for b, i in zip(*np.nonzero(mask)):
    pair = {
        "query_length": features["query_length"][b:b + 1], "bm25": features["bm25"][b:b + 1, i],
        "pagerank": features["pagerank"][b:b + 1, i]
    }
    np.testing.assert_allclose(scores[b, i], trained(pair).numpy()[0, 0], rtol=1e-5)
  exported = tf.saved_model.load(str(tmp_path / "run" / "export" / "latest_model"))
  served = exported.signatures["serving_default"](examples=lib.serialized_lists(valid))["scores"]
  np.testing.assert_allclose(served.numpy()[mask], scores[mask], rtol=1e-5, atol=1e-6)


class SubclassedScorer(tf.keras.Model):
  """A subclassed model: no inputs to read shapes from."""

  def __init__(self):
    super().__init__()
    self.dense = tf.keras.layers.Dense(1, kernel_initializer="ones")

  def call(self, inputs):
    return self.dense(inputs["bm25"]) * inputs["query_length"]


def test_model_function_and_input_specs_wrap_a_subclassed_model():
  initialize.init()
  builder = KerasModelBuilder(
      SubclassedScorer, ["query_length"], ["bm25"], MASK_FEATURE, input_specs={
          "query_length": tf.TensorSpec([None, 1], tf.float32), "bm25": tf.TensorSpec([None, 1],
                                                                                      tf.float32)
      })
  model = builder.build()  # Kernel of ones, bias 0: bm25 * query_length.
  scores = model({
      "query_length": tf.constant([[2.0], [3.0]]), "bm25": tf.constant([[[1.0], [4.0]],
                                                                        [[5.0], [0.5]]]),
      MASK_FEATURE: tf.constant([[True, True], [True, True]])
  })
  np.testing.assert_allclose(scores, [[2.0, 8.0], [15.0, 1.5]], rtol=1e-6)


@pytest.mark.parametrize("context, example, match", [
    (["query_length"], ["bm25"], r"not inputs: \[\]; inputs neither context nor example "
     r"features: \['pagerank'\]"),
    (["query_length"], ["bm25", "pagerank", "title"], r"not inputs: \['title'\]"),
    (["bm25"], ["bm25", "pagerank", "query_length"], r"\['bm25'\] are both context and example"),
    (["query_length"], [], "at least one"),
])
def test_feature_names_must_be_the_model_inputs(context, example, match):
  with pytest.raises(ValueError, match=match):
    KerasModelBuilder(user_model(), context, example, MASK_FEATURE)


def test_subclassed_model_without_specs_is_refused():
  model = SubclassedScorer()
  with pytest.raises(ValueError, match="pass `input_specs`"):
    KerasModelBuilder(model, ["query_length"], ["bm25"], MASK_FEATURE)

"""Writes a small SavedModel with the exported models' serving signature, untrained.

  python tiny_model.py OUT_DIR

serving_default(examples: [batch_size] string, serialized ELWC) ->
{"scores": [batch_size, list_size] float32}, parsing the context feature
`user_id` ([1] int64) and the example features `item_id` ([1] int64) and
`weight` ([1] float32): score = log(weight) + item_id + 0 * user_id, so a
zero weight scores -inf and a negative one NaN (user_id is used so that its
parsing is not pruned from the graph). Run in a process of its own, so the tests that
use it never import TensorFlow.
"""

import sys

import tensorflow as tf
import tensorflow_ranking as tfr

F = tf.io.FixedLenFeature
CONTEXT = {"user_id": F([1], tf.int64, default_value=0)}
EXAMPLE = {
    "item_id": F([1], tf.int64, default_value=0), "weight": F([1], tf.float32, default_value=1.0)
}


class TinyModule(tf.Module):

  @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="examples")])
  def serve(self, examples):
    features = tfr.data.parse_from_example_list(examples, context_feature_spec=CONTEXT,
                                                example_feature_spec=EXAMPLE,
                                                mask_feature_name="mask")
    user = tf.cast(features["user_id"], tf.float32)[:, tf.newaxis, :]  # [batch_size, 1, 1]
    scores = (tf.math.log(features["weight"]) + tf.cast(features["item_id"], tf.float32) +
              0.0 * user)
    return {"scores": tf.squeeze(scores, -1)}


if __name__ == "__main__":
  module = TinyModule()
  tf.saved_model.save(module, sys.argv[1], signatures={"serving_default": module.serve})

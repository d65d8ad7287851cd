"""Fixtures of the TPUEmbedding-style API's tests."""

import pytest
import tensorflow as tf


@pytest.fixture(autouse=True)
def _no_global_seed_after():
  """Tests here seed TF globally (test_embedding_checkpoint._build: 0); later tests must not.

  Under a leaked global seed of 0, test_keras_epochs' stream-against-per-epoch
  comparison fails when the suite runs both in one process (seen with xdist).
  """
  yield
  tf.random.set_seed(None)

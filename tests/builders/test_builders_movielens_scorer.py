"""MovieLensScorer's list self-attention and ensemble (builders/movielens.py), on dense inputs."""

import numpy as np
import pytest
import tensorflow as tf

from builders import movielens
from builders.movielens_config import MovieLensModelConfig

BATCH, LIST, DIM = 3, 4, 8


def _model(**kwargs):
  """A Keras model of the scorer over user_id [b, DIM], item_id and x [b, LIST, DIM], mask."""
  tf.keras.utils.set_random_seed(1)
  context = {"user_id": tf.keras.Input([DIM], name="user_id")}
  example = {n: tf.keras.Input([LIST, DIM], name=n) for n in ("item_id", "x")}
  mask = tf.keras.Input([LIST], dtype=tf.bool, name="mask")
  scorer = movielens.MovieLensScorer([8], **kwargs)
  return tf.keras.Model([context, example, mask], scorer(context, example, mask))


def _inputs(seed=0):
  rng = np.random.default_rng(seed)
  context = {"user_id": rng.normal(size=[BATCH, DIM]).astype(np.float32)}
  example = {n: rng.normal(size=[BATCH, LIST, DIM]).astype(np.float32) for n in ("item_id", "x")}
  return [context, example, np.ones([BATCH, LIST], bool)]


@pytest.mark.parametrize("num_attention_heads", [0, 2])
def test_attention_makes_a_movies_score_depend_on_the_other_movies(num_attention_heads):
  model = _model(num_attention_heads=num_attention_heads, attention_head_size=4)
  inputs = _inputs()
  before = model(inputs, training=False).numpy()
  inputs[1]["x"][:, 3] += 1.0  # Only the last movie of each list changes.
  after = model(inputs, training=False).numpy()
  assert not np.allclose(before[:, 3], after[:, 3])
  # The other movies' scores move only through the attention across the list.
  assert np.allclose(before[:, :3], after[:, :3]) == (num_attention_heads == 0)
  names = {layer.name for layer in model.layers}
  assert (movielens.ATTENTION_FEATURE in names) == bool(num_attention_heads)


def test_ensemble_scores_the_mean_of_its_towers_and_trains_one_tower_per_list():
  k = 3
  model = _model(ensemble_size=k)
  # k copies of one list: at training, list b gets tower b's scores.
  one = _inputs()
  inputs = [{n: np.repeat(v[:1], k, 0) for n, v in part.items()} for part in one[:2]]
  inputs.append(np.ones([k, LIST], bool))
  per_tower = model(inputs, training=True).numpy()
  assert not np.allclose(per_tower[0], per_tower[1])  # Independently initialized towers.
  np.testing.assert_allclose(
      model(inputs, training=False).numpy()[0], per_tower.mean(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("field, value", [("ensemble_size", 0), ("num_attention_heads", -1),
                                          ("attention_head_size", 0)])
def test_bad_switches_are_named(field, value):
  with pytest.raises(ValueError, match=f"model.{field}"):
    MovieLensModelConfig(**{field: value})

"""MovieLens-100k as the mxRec quick start's data: user/item ids and two labels.

Each rating is one sample: `user_ids` [1] int64, `item_ids` [1] int64,
`label_0` = liked (rating >= 4), `label_1` = rated at least 3. Ratings are split
by time per user (mxrec_pipeline.data.movielens.split_by_time): the latest 20%
of each user's ratings are the evaluation set.
"""

import numpy as np
import tensorflow as tf

from mxrec_pipeline.data import fetch, movielens


def load_arrays(is_training: bool) -> dict:
  """The split as NumPy arrays: user_ids, item_ids [n, 1] int64; labels [n, 1] float32."""
  train, valid = movielens.split_by_time(movielens.read_ratings(fetch.fetch("movielens_100k")))
  split = train if is_training else valid
  ratings = sorted((r for user in split.values() for r in user), key=lambda r:
                   (r.timestamp_s, r.user_id, r.item_id))
  users = np.array([[r.user_id] for r in ratings], np.int64)
  items = np.array([[r.item_id] for r in ratings], np.int64)
  stars = np.array([[r.rating] for r in ratings], np.float32)
  return {
      "user_ids": users, "item_ids": items, "label_0": (stars >= 4).astype(np.float32),
      "label_1": (stars >= 3).astype(np.float32)
  }


def generate_dataset(is_training: bool, batch_size: int) -> tf.data.Dataset:
  """Batches of the split in time order, repeated (training) or once (evaluation)."""
  dataset = tf.data.Dataset.from_tensor_slices(load_arrays(is_training))
  dataset = dataset.batch(batch_size, drop_remainder=True)
  return dataset.repeat() if is_training else dataset

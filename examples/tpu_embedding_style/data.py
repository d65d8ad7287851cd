"""MovieLens-100k as ranking lists for the TPUEmbedding-style example.

Ratings are split by time per user (mxrec_pipeline.data.movielens): each
user's latest 20% are validation. A list is up to LIST_SIZE consecutive
ratings of one user, in time order (a user's ratings are cut into several
lists). Each list's elements are `(embedding_features, labels)`, as the
TPUEmbedding docs' dataset gives them:

  embedding_features:
    user_id  [batch_size, 1] int64                 -> table "user"
    item_id  [batch_size, (items)] int64, ragged   -> table "movie" (sequence,
             padded to LIST_SIZE by the Embedding)
    history  [batch_size, (ids)] int64, ragged     -> table "movie" (mean): the
             user's HISTORY_SIZE latest training movies before the list
  dense features (the TPUEmbedding docs' `tpu_features`, beside the labels):
    item_mean_rating   [batch_size, LIST_SIZE] float32: the movie's mean
             training rating by the other users (leave-one-out on training
             lists), the item-mean baseline's signal
    item_rating_count  [batch_size, LIST_SIZE] float32: how many other users
             rated it in training
    neighbor_rating_deviation  [batch_size, LIST_SIZE] float32: how the
             user's nearest users rated it against their own means
    (all from `movielens.training_features`: training ratings only; 0 on
    padding)
  labels     [batch_size, LIST_SIZE] float32 ratings, -1 on padding (tfr's mask)
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from mxrec_pipeline.data import fetch, movielens

LIST_SIZE = 16
HISTORY_SIZE = 32


def build_lists(split: dict, history_of, statistics: movielens.TrainingFeatures,
                training: bool) -> dict:
  """Lists of a split: {user_id, item_id (lists), history (lists), dense, labels}.

  `training`: the item mean and count leave each example's own rating out.
  """
  users, items, histories, labels = [], [], [], []
  dense = {name: [] for name in movielens.RATING_STATISTICS_FEATURES}
  for user_id, ratings in split.items():
    for start in range(0, len(ratings), LIST_SIZE):
      chunk = ratings[start:start + LIST_SIZE]
      padding = LIST_SIZE - len(chunk)
      users.append([user_id])
      items.append([r.item_id for r in chunk])
      histories.append(history_of(user_id, start))
      labels.append([r.rating for r in chunk] + [-1.0] * padding)
      rows = [
          statistics.example_features(user_id, r.item_id, r.rating if training else None)
          for r in chunk
      ]
      for name, values in dense.items():
        values.append([row[name] for row in rows] + [0.0] * padding)
  return {
      "user_id": np.array(users, np.int64), "item_id": items, "history": histories,
      "dense": {name: np.array(values, np.float32) for name, values in dense.items()},
      "labels": np.array(labels, np.float32)
  }


def load(valid_fraction: float = 0.2) -> tuple[dict, dict, dict]:
  """(train lists, validation lists, {movie: mean training rating})."""
  train, valid = movielens.split_by_time(movielens.read_ratings(fetch.fetch("movielens_100k")),
                                         valid_fraction)
  train_items = {user: [r.item_id for r in ratings] for user, ratings in train.items()}
  statistics = movielens.training_features(train)
  train_lists = build_lists(
      train, lambda user, start: train_items[user][max(0, start - HISTORY_SIZE):start], statistics,
      training=True)
  valid_lists = build_lists(valid, lambda user, start: train_items[user][-HISTORY_SIZE:],
                            statistics, training=False)
  return train_lists, valid_lists, {
      item: total / count for item, (total, count) in statistics.item_totals.items()
  }


def dataset(lists: dict, batch_size: int, training: bool, seed: int = 0) -> tf.data.Dataset:
  """Batches of `(embedding_features, (dense, labels))`; shuffled and repeated for training."""
  features = {
      "user_id": lists["user_id"], "item_id": tf.ragged.constant(lists["item_id"], dtype=tf.int64),
      "history": tf.ragged.constant(lists["history"], dtype=tf.int64, ragged_rank=1)
  }
  data = tf.data.Dataset.from_tensor_slices((features, (lists["dense"], lists["labels"])))
  if training:
    data = data.shuffle(len(lists["labels"]), seed=seed).repeat()
  return data.ragged_batch(batch_size, drop_remainder=training).prefetch(2)

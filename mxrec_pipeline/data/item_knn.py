"""Item-based collaborative filtering of a ratings table (NumPy).

Sarwar et al., "Item-Based Collaborative Filtering Recommendation
Algorithms", WWW 2001: a movie's predicted deviation for a user is the
similarity-weighted mean of the user's own deviations on the movies most
similar to it. Here:

  dev(u, j) = r(u, j) - mean_u                (mean_u: the user's mean rating)
  sim(i, j) = cos(dev(., i), dev(., j)) * n_ij / (n_ij + shrinkage)

(the adjusted cosine of Sarwar et al., over every user, 0 where a user did
not rate; n_ij users rated both, the support shrinkage of Koren, "Factor in
the Neighbors", TKDD 2010, eq. 2), and

  item_knn_deviation(u, i) = sum_j sim(i, j) dev(u, j) / (prior_weight + sum_j sim(i, j))

over the `num_neighbors` movies j the user rated with the largest positive
similarity to i (the user's rating of i itself, if any, never enters); 0.0
for a user or movie without ratings, or without such j.

Used by mxrec_pipeline/data/movielens.py for its `item_knn_deviation` feature.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

# Defaults of `fit_item_knn`.
NUM_NEIGHBORS = 30
SHRINKAGE = 50.0
PRIOR_WEIGHT = 1.0


@dataclasses.dataclass(frozen=True)
class ItemKNN:
  """A fitted item-based CF predictor; see the module docstring.

  Attributes:
    item_index: item id -> row/column of `similarity`.
    similarity: [num_items, num_items] float64 sim(i, j), 0 on the diagonal.
    user_deviations: user id -> ([n] int64 rows of the user's movies,
      [n] float64 their dev(u, j)).
    num_neighbors, prior_weight: See the module docstring.
  """

  item_index: Mapping[int, int]
  similarity: np.ndarray
  user_deviations: Mapping[int, tuple[np.ndarray, np.ndarray]]
  num_neighbors: int = NUM_NEIGHBORS
  prior_weight: float = PRIOR_WEIGHT

  def predict(self, user_id: int, item_id: int) -> float:
    """item_knn_deviation(user, item), float."""
    item = self.item_index.get(item_id)
    if item is None or user_id not in self.user_deviations:
      return 0.0
    rows, deviations = self.user_deviations[user_id]
    similarity = self.similarity[item, rows]
    nearest = np.argsort(-similarity, kind="stable")[:self.num_neighbors]
    nearest = nearest[similarity[nearest] > 0]
    if not len(nearest):
      return 0.0
    weights = similarity[nearest]
    return float(weights @ deviations[nearest] / (self.prior_weight + weights.sum()))

  def predict_many(self, user_ids: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
    """[n] float64 `predict` of each (user_ids[k], item_ids[k]); ids [n] int64.

    Vectorized per user: one sort of a [num_items_asked, num_rated] block.
    """
    user_ids, item_ids = np.asarray(user_ids, np.int64), np.asarray(item_ids, np.int64)
    out = np.zeros(len(user_ids))
    items = np.array([self.item_index.get(int(i), -1) for i in item_ids], np.int64)
    for user in np.unique(user_ids):
      if int(user) not in self.user_deviations:
        continue
      asked = np.nonzero((user_ids == user) & (items >= 0))[0]
      rows, deviations = self.user_deviations[int(user)]
      similarity = self.similarity[items[asked]][:, rows]
      nearest = np.argsort(-similarity, axis=1, kind="stable")[:, :self.num_neighbors]
      weights = np.take_along_axis(similarity, nearest, axis=1)
      weights = np.where(weights > 0, weights, 0.0)
      num = (weights * deviations[nearest]).sum(axis=1)
      den = weights.sum(axis=1)
      out[asked] = np.where(den > 0, num / np.where(den > 0, self.prior_weight + den, 1.0), 0.0)
    return out


def fit_item_knn(users: np.ndarray, items: np.ndarray, ratings: np.ndarray,
                 num_neighbors: int = NUM_NEIGHBORS, shrinkage: float = SHRINKAGE,
                 prior_weight: float = PRIOR_WEIGHT) -> ItemKNN:
  """Item similarities and user deviations of a ratings table.

  Args:
    users: [num_ratings] int64 user ids.
    items: [num_ratings] int64 item ids.
    ratings: [num_ratings] float64 ratings; a user's repeated (user, item)
      counts once, with its last rating.
    num_neighbors: >= 1. shrinkage, prior_weight: >= 0.

  Returns:
    The `ItemKNN`. Needs [num_users, num_items] and [num_items, num_items]
    float64 matrices: fine for ml-100k, not meant for millions.

  Raises:
    ValueError: no rating, arrays of different lengths, or a bad parameter.
  """
  users, items = np.asarray(users, np.int64), np.asarray(items, np.int64)
  ratings = np.asarray(ratings, np.float64)
  if not len(ratings) or not len(users) == len(items) == len(ratings):
    raise ValueError(f"fit_item_knn: needs ratings and one user and item per rating, got "
                     f"{len(users)} users, {len(items)} items, {len(ratings)} ratings")
  if num_neighbors < 1 or not shrinkage >= 0 or not prior_weight >= 0:
    raise ValueError(f"fit_item_knn: needs num_neighbors >= 1, shrinkage >= 0 and prior_weight "
                     f">= 0, got {num_neighbors}, {shrinkage}, {prior_weight}")
  user_ids, user_rows = np.unique(users, return_inverse=True)
  item_ids, item_rows = np.unique(items, return_inverse=True)
  rated = np.zeros((len(user_ids), len(item_ids)))
  rated[user_rows, item_rows] = 1.0
  table = np.zeros_like(rated)
  table[user_rows, item_rows] = ratings
  means = table.sum(axis=1) / rated.sum(axis=1)
  deviation = (table - means[:, None]) * rated
  norms = np.sqrt((deviation**2).sum(axis=0))
  norms[norms == 0] = 1.0
  support = rated.T @ rated
  similarity = (deviation.T @ deviation) / np.outer(norms, norms) * support / (support + shrinkage)
  np.fill_diagonal(similarity, 0.0)
  user_deviations = {}
  for row, user in enumerate(user_ids):
    columns = np.nonzero(rated[row])[0]
    user_deviations[int(user)] = (columns, deviation[row, columns])
  return ItemKNN({int(i): k for k, i in enumerate(item_ids)}, similarity, user_deviations,
                 num_neighbors, prior_weight)

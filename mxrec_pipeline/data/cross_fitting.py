"""Out-of-fold predictions of a model fitted on a ratings table (K-fold cross-fitting).

Each rating is predicted by a model fitted without it: the ratings are dealt
to K folds at random and the fit of fold k sees every other fold (the
out-of-fold predictions of stacked generalization: Wolpert, "Stacked
Generalization", Neural Networks 1992). A ranker trained on such predictions
as a feature sees them as noisy as the full fit's predictions of ratings it
never saw (the validation ratings). Used by mxrec_pipeline/data/movielens.py.
"""

from __future__ import annotations

from typing import Callable

import numpy as np


def out_of_fold_predictions(fit: Callable, users: np.ndarray, items: np.ndarray,
                            ratings: np.ndarray, num_folds: int = 5, seed: int = 0) -> np.ndarray:
  """Each rating predicted by `fit` on the other folds.

  Args:
    fit: `fit(users, items, ratings)` -> a model with `predict_many(user_ids,
      item_ids)` -> [n] float64 (e.g. `matrix_factorization.fit_als`,
      `item_knn.fit_item_knn`).
    users: [num_ratings] int64 user ids.
    items: [num_ratings] int64 item ids.
    ratings: [num_ratings] float64 ratings.
    num_folds: >= 2.
    seed: Seed of the fold assignment (fold of rating n: the n-th entry of a
      random permutation of range(num_ratings), modulo num_folds).

  Returns:
    [num_ratings] float64 predictions.

  Raises:
    ValueError: `num_folds` < 2; whatever `fit` raises (e.g. a fold holding every rating).
  """
  if num_folds < 2:
    raise ValueError(f"out_of_fold_predictions: num_folds must be >= 2, got {num_folds}")
  users, items = np.asarray(users, np.int64), np.asarray(items, np.int64)
  ratings = np.asarray(ratings, np.float64)
  fold = np.random.default_rng(seed).permutation(len(ratings)) % num_folds
  out = np.empty(len(ratings))
  for k in range(num_folds):
    held = fold == k
    model = fit(users[~held], items[~held], ratings[~held])
    out[held] = model.predict_many(users[held], items[held])
  return out

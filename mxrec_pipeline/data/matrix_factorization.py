"""Biased matrix factorization of a ratings table by alternating least squares (NumPy).

The model is the biased MF of Koren, Bell and Volinsky ("Matrix Factorization
Techniques for Recommender Systems", IEEE Computer 2009, eq. 4):

    r_hat(u, i) = mu + b_u + b_i + p_u . q_i

fitted by alternating least squares (Zhou et al., "Large-Scale Parallel
Collaborative Filtering for the Netflix Prize", AAIM 2008) on the squared
error plus `l2 * (b_u^2 + ||p_u||^2)` per user and `l2 * (b_i^2 + ||q_i||^2)`
per item: each half-step solves one ridge regression per user (items fixed)
or per item (users fixed), with the bias as one more column of ones. mu is
the mean rating, not fitted.

`cross_fitted_predictions` gives each rating a prediction from a model that
never saw it (K-fold cross-fitting, the out-of-fold predictions of stacked
generalization: Wolpert, "Stacked Generalization", Neural Networks 1992), so
a ranker trained on those predictions as a feature sees them as noisy as the
predictions of the full model on unseen ratings.

Used by mxrec_pipeline/data/movielens.py for its `mf_rating` feature.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from mxrec_pipeline.data import cross_fitting

# Defaults of `fit_als`.
DIM = 20
L2 = 20.0
NUM_ITERATIONS = 10


@dataclasses.dataclass(frozen=True)
class BiasedMF:
  """A fitted `r_hat(u, i) = mu + b_u + b_i + p_u . q_i`.

  Attributes:
    global_mean: mu, the mean training rating.
    user_index: user id -> row of `user_bias` / `user_factors`.
    item_index: item id -> row of `item_bias` / `item_factors`.
    user_bias: [num_users] float64 b_u.
    item_bias: [num_items] float64 b_i.
    user_factors: [num_users, dim] float64 p_u.
    item_factors: [num_items, dim] float64 q_i.
  """

  global_mean: float
  user_index: Mapping[int, int]
  item_index: Mapping[int, int]
  user_bias: np.ndarray
  item_bias: np.ndarray
  user_factors: np.ndarray
  item_factors: np.ndarray

  def predict(self, user_id: int, item_id: int) -> float:
    """r_hat(user, item); a user or item the fit never saw contributes 0 bias and no factor."""
    u, i = self.user_index.get(user_id), self.item_index.get(item_id)
    value = self.global_mean
    if u is not None:
      value += self.user_bias[u]
    if i is not None:
      value += self.item_bias[i]
    if u is not None and i is not None:
      value += float(self.user_factors[u] @ self.item_factors[i])
    return float(value)

  def predict_many(self, user_ids: np.ndarray, item_ids: np.ndarray) -> np.ndarray:
    """[n] float64 `predict` of each (user_ids[k], item_ids[k]); ids [n] int64."""
    users = np.array([self.user_index.get(int(u), -1) for u in user_ids], np.int64)
    items = np.array([self.item_index.get(int(i), -1) for i in item_ids], np.int64)
    known_user, known_item = users >= 0, items >= 0
    u, i = np.where(known_user, users, 0), np.where(known_item, items, 0)
    factors = np.einsum("nd,nd->n", self.user_factors[u], self.item_factors[i])
    return (self.global_mean + np.where(known_user, self.user_bias[u], 0.0) +
            np.where(known_item, self.item_bias[i], 0.0) +
            np.where(known_user & known_item, factors, 0.0))


def fit_als(users: np.ndarray, items: np.ndarray, ratings: np.ndarray, dim: int = DIM,
            l2: float = L2, num_iterations: int = NUM_ITERATIONS, seed: int = 0) -> BiasedMF:
  """Fits biased MF by ALS (see the module docstring).

  Args:
    users: [num_ratings] int64 user ids.
    items: [num_ratings] int64 item ids.
    ratings: [num_ratings] float64 ratings; a repeated (user, item) counts
      once, with its last rating (mu still counts every rating).
    dim: Factors per user and item, >= 1.
    l2: Ridge weight on each user's and item's bias and factors, > 0.
    num_iterations: Alternations (users then items), >= 1.
    seed: Seed of the initial item factors (normal, std 0.1).

  Returns:
    The fitted `BiasedMF`; deterministic given the inputs and `seed`. Holds
    [num_users, num_items] float64 matrices while fitting: fine for ml-100k,
    not meant for millions.

  Raises:
    ValueError: no rating, arrays of different lengths, or a bad `dim`,
      `l2` or `num_iterations`.
  """
  users, items = np.asarray(users, np.int64), np.asarray(items, np.int64)
  ratings = np.asarray(ratings, np.float64)
  if not len(ratings) or not len(users) == len(items) == len(ratings):
    raise ValueError(f"fit_als: needs ratings and one user and item per rating, got "
                     f"{len(users)} users, {len(items)} items, {len(ratings)} ratings")
  if dim < 1 or not l2 > 0 or num_iterations < 1:
    raise ValueError(f"fit_als: needs dim >= 1, l2 > 0 and num_iterations >= 1, got {dim}, "
                     f"{l2}, {num_iterations}")
  user_ids, user_rows = np.unique(users, return_inverse=True)
  item_ids, item_rows = np.unique(items, return_inverse=True)
  mu = float(ratings.mean())
  rng = np.random.default_rng(seed)
  # Column `dim` of each side is the bias; the other side's column `dim` is 1 in the solve.
  user_side = np.zeros((len(user_ids), dim + 1))
  item_side = np.concatenate(
      [rng.normal(0.0, 0.1, (len(item_ids), dim)),
       np.zeros((len(item_ids), 1))], axis=1)
  rated = np.zeros((len(user_ids), len(item_ids)))
  rated[user_rows, item_rows] = 1.0
  residual = np.zeros_like(rated)
  residual[user_rows, item_rows] = ratings - mu
  for _ in range(num_iterations):
    _solve_side(user_side, item_side, rated, residual, l2)
    _solve_side(item_side, user_side, rated.T, residual.T, l2)
  return BiasedMF(mu, {int(u): k for k, u in enumerate(user_ids)},
                  {int(i): k for k, i in enumerate(item_ids)}, user_side[:, dim].copy(),
                  item_side[:, dim].copy(), user_side[:, :dim].copy(), item_side[:, :dim].copy())


def _solve_side(side: np.ndarray, other: np.ndarray, rated: np.ndarray, residual: np.ndarray,
                l2: float) -> None:
  """One ALS half-step: per row, ridge regression of its ratings on the other side's factors.

  All rows at once, as dense products (two BLAS matmuls, no per-row call):
  row r solves `(X^T W_r X + l2 I) theta_r = X^T W_r y_r`, X = [other's
  factors, 1], W_r the 0/1 row of `rated`, y_r the row of `residual` minus
  the other side's bias.

  Args:
    side: [num_rows, dim + 1] float64 factors and bias, overwritten.
    other: [num_other, dim + 1] float64, fixed.
    rated: [num_rows, num_other] float64 0/1.
    residual: [num_rows, num_other] float64 rating - mu where rated, else 0.
    l2: The ridge weight.
  """
  dim = side.shape[1] - 1
  x = np.concatenate([other[:, :dim], np.ones((len(other), 1))], axis=1)
  outer = (x[:, :, None] * x[:, None, :]).reshape(len(x), -1)
  gram = (rated @ outer).reshape(len(side), dim + 1, dim + 1) + l2 * np.eye(dim + 1)
  # The other side's bias is a fixed offset of each rating.
  moment = (residual - rated * other[None, :, dim]) @ x
  side[:] = _solve_positive_definite(gram, moment)


def _solve_positive_definite(a: np.ndarray, b: np.ndarray) -> np.ndarray:
  """x with a[n] @ x[n] = b[n] for each n: Gaussian elimination without pivoting.

  Vectorized over the batch in NumPy (numpy.linalg.solve on many tiny
  systems was ~100x slower here, OpenBLAS threads per call). Symmetric
  positive definite `a` (here: a Gram matrix + l2 I, l2 > 0) needs no pivoting.

  Args:
    a: [n, d, d] float64, each symmetric positive definite.
    b: [n, d] float64.

  Returns:
    [n, d] float64.
  """
  a, b = a.copy(), b.copy()
  d = a.shape[1]
  for k in range(d - 1):
    factor = a[:, k + 1:, k] / a[:, k, k, None]
    a[:, k + 1:, k:] -= factor[:, :, None] * a[:, None, k, k:]
    b[:, k + 1:] -= factor * b[:, None, k]
  x = np.zeros_like(b)
  for k in reversed(range(d)):
    x[:, k] = (b[:, k] - np.einsum("nj,nj->n", a[:, k, k + 1:], x[:, k + 1:])) / a[:, k, k]
  return x


def cross_fitted_predictions(users: np.ndarray, items: np.ndarray, ratings: np.ndarray,
                             num_folds: int = 5, seed: int = 0, **als) -> np.ndarray:
  """Out-of-fold `fit_als` predictions (`cross_fitting.out_of_fold_predictions`).

  Args:
    users, items, ratings: As `fit_als`.
    num_folds: >= 2.
    seed: Seed of the fold assignment and of each fit.
    **als: `fit_als`'s dim, l2, num_iterations.

  Returns:
    [num_ratings] float64 predictions; a user or item whose only ratings are
    in a rating's fold gets the unseen-id prediction (`BiasedMF.predict`).

  Raises:
    ValueError: `num_folds` < 2, or as `fit_als` (e.g. a fold holding every rating).
  """
  return cross_fitting.out_of_fold_predictions(lambda u, i, r: fit_als(u, i, r, seed=seed, **als),
                                               users, items, ratings, num_folds, seed)

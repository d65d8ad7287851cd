"""Tests for mxrec_pipeline.data.matrix_factorization against NumPy references."""

import numpy as np
import pytest

from mxrec_pipeline.data import matrix_factorization as mf

# A 4-user x 5-item table, one rating missing (user 3, item 14).
_USERS = np.array([u for u in range(4) for _ in range(5)])
_ITEMS = np.array([10 + i for _ in range(4) for i in range(5)])
_RATINGS = np.array([5, 4, 1, 2, 3, 4, 4, 2, 1, 3, 1, 2, 5, 4, 2, 2, 1, 4, 5, 3], np.float64)
_KEEP = ~((_USERS == 3) & (_ITEMS == 14))


def _residuals(model, users, items, ratings):
  return ratings - np.array([model.predict(u, i) for u, i in zip(users, items)])


def test_the_fit_solves_the_items_normal_equations():
  """The last half-step solves each item's ridge regression: its gradient is 0."""
  users, items, ratings = _USERS[_KEEP], _ITEMS[_KEEP], _RATINGS[_KEEP]
  l2 = 0.5
  model = mf.fit_als(users, items, ratings, dim=2, l2=l2, num_iterations=3)
  assert model.global_mean == pytest.approx(ratings.mean())
  residual = _residuals(model, users, items, ratings)
  for item, row in model.item_index.items():
    on = items == item
    design = np.stack(
        [*(model.user_factors[[model.user_index[u] for u in users[on]]].T),
         np.ones(on.sum())], axis=1)
    theta = np.append(model.item_factors[row], model.item_bias[row])
    # d/d theta of sum residual^2 + l2 ||theta||^2 = -2 design^T residual + 2 l2 theta.
    np.testing.assert_allclose(design.T @ residual[on], l2 * theta, atol=1e-10)


def test_users_normal_equations_hold_at_convergence():
  users, items, ratings = _USERS[_KEEP], _ITEMS[_KEEP], _RATINGS[_KEEP]
  model = mf.fit_als(users, items, ratings, dim=2, l2=0.5, num_iterations=500)
  residual = _residuals(model, users, items, ratings)
  for user, row in model.user_index.items():
    on = users == user
    design = np.stack(
        [*(model.item_factors[[model.item_index[i] for i in items[on]]].T),
         np.ones(on.sum())], axis=1)
    theta = np.append(model.user_factors[row], model.user_bias[row])
    np.testing.assert_allclose(design.T @ residual[on], 0.5 * theta, atol=1e-6)


def test_recovers_a_low_rank_table():
  """Ratings mu + b_u + b_i + p_u q_i with rank 1, all observed, tiny l2: reproduced."""
  rng = np.random.default_rng(3)
  p, q = rng.normal(size=6), rng.normal(size=7)
  b_u, b_i = rng.normal(size=6), rng.normal(size=7)
  users, items = np.repeat(np.arange(6), 7), np.tile(np.arange(7), 6) + 100
  ratings = 3.0 + b_u[users] + b_i[items - 100] + p[users] * q[items - 100]
  model = mf.fit_als(users, items, ratings, dim=2, l2=1e-6, num_iterations=200)
  np.testing.assert_allclose(_residuals(model, users, items, ratings), 0.0, atol=1e-3)


def test_unseen_ids_get_the_biases_they_have():
  model = mf.fit_als(_USERS, _ITEMS, _RATINGS, dim=1, l2=1.0)
  mu = _RATINGS.mean()
  assert model.predict(99, 99) == pytest.approx(mu)
  assert model.predict(0, 99) == pytest.approx(mu + model.user_bias[model.user_index[0]])
  assert model.predict(99, 12) == pytest.approx(mu + model.item_bias[model.item_index[12]])
  users, items = np.array([99, 0, 99, 0, 3]), np.array([99, 99, 12, 12, 14])
  np.testing.assert_allclose(model.predict_many(users, items),
                             [model.predict(u, i) for u, i in zip(users, items)], rtol=1e-12)
  again = mf.fit_als(_USERS, _ITEMS, _RATINGS, dim=1, l2=1.0)
  np.testing.assert_array_equal(again.item_factors, model.item_factors)


def test_cross_fitted_prediction_never_sees_its_own_rating():
  base = mf.cross_fitted_predictions(_USERS, _ITEMS, _RATINGS, num_folds=4, dim=2, l2=0.5)
  for j in (0, 7, 19):
    changed = _RATINGS.copy()
    changed[j] = 6.0 - changed[j] + 10.0
    out = mf.cross_fitted_predictions(_USERS, _ITEMS, changed, num_folds=4, dim=2, l2=0.5)
    assert out[j] == base[j]
    # The fits that saw it predict other ratings differently.
    assert np.sum(out != base) >= 10


def test_errors():
  with pytest.raises(ValueError, match="needs ratings"):
    mf.fit_als(np.array([], np.int64), np.array([], np.int64), np.array([]))
  with pytest.raises(ValueError, match="one user and item per rating, got 2 users"):
    mf.fit_als(np.array([1, 2]), np.array([1]), np.array([3.0]))
  with pytest.raises(ValueError, match="dim >= 1, l2 > 0 and num_iterations >= 1, got 0"):
    mf.fit_als(_USERS, _ITEMS, _RATINGS, dim=0)
  with pytest.raises(ValueError, match="got 2, 0.0, 10"):
    mf.fit_als(_USERS, _ITEMS, _RATINGS, dim=2, l2=0.0)
  with pytest.raises(ValueError, match="num_folds must be >= 2, got 1"):
    mf.cross_fitted_predictions(_USERS, _ITEMS, _RATINGS, num_folds=1)

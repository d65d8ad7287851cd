"""Tests for mxrec_pipeline.data.cross_fitting."""

import numpy as np
import pytest

from mxrec_pipeline.data import cross_fitting


class _Memory:
  """A 'model' that predicts a rating it saw exactly and -1 for any other."""

  def __init__(self, users, items, ratings):
    self.seen = {(int(u), int(i)): float(r) for u, i, r in zip(users, items, ratings)}

  def predict(self, user_id, item_id):
    return self.seen.get((int(user_id), int(item_id)), -1.0)

  def predict_many(self, user_ids, item_ids):
    return np.array([self.predict(u, i) for u, i in zip(user_ids, item_ids)])


def test_no_rating_is_predicted_by_a_fit_that_saw_it():
  users, items = np.arange(20) % 4, np.arange(20)
  ratings = np.arange(20, dtype=np.float64)
  fits = []

  def fit(u, i, r):
    fits.append(len(r))
    return _Memory(u, i, r)

  out = cross_fitting.out_of_fold_predictions(fit, users, items, ratings, num_folds=4, seed=3)
  np.testing.assert_array_equal(out, -1.0)
  # Each of the 4 fits sees the other 3 folds of 5 ratings.
  assert fits == [15, 15, 15, 15]
  # Every rating is in some fit: a model that saw all predicts them all.
  assert [_Memory(users, items, ratings).predict(u, i) for u, i in zip(users, items)
         ] == list(ratings)


def test_num_folds():
  with pytest.raises(ValueError, match="num_folds must be >= 2, got 1"):
    cross_fitting.out_of_fold_predictions(_Memory, np.array([1]), np.array([1]), np.array([1.0]),
                                          num_folds=1)

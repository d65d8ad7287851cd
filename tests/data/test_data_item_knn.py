"""Tests for mxrec_pipeline.data.item_knn against hand values and a loop reference."""

import math

import numpy as np
import pytest

from mxrec_pipeline.data import item_knn


def _reference(users, items, ratings, user, item, num_neighbors, shrinkage, prior_weight):
  """The module docstring's formulas, one loop per sum."""
  table = {(u, i): r for u, i, r in zip(users, items, ratings)}
  means = {u: np.mean([r for (v, _), r in table.items() if v == u]) for u in set(users)}
  dev = {(u, i): r - means[u] for (u, i), r in table.items()}

  def sim(i, j):
    both = [u for u in means if (u, i) in dev and (u, j) in dev]
    num = sum(dev[u, i] * dev[u, j] for u in both)
    norm_i = math.sqrt(sum(d * d for (_, k), d in dev.items() if k == i)) or 1.0
    norm_j = math.sqrt(sum(d * d for (_, k), d in dev.items() if k == j)) or 1.0
    return num / (norm_i * norm_j) * len(both) / (len(both) + shrinkage)

  if item not in set(items) or user not in means:
    return 0.0
  rated = sorted((-sim(item, j), j) for (u, j) in dev if u == user and j != item)
  nearest = [(-s, j) for s, j in rated[:num_neighbors] if -s > 0]
  if not nearest:
    return 0.0
  return sum(s * dev[user, j] for s, j in nearest) / (prior_weight + sum(s for s, _ in nearest))


def test_by_hand():
  # Users 1, 2 rate a (10), b (11), c (12) 5, 5, 2 and 4, 4, 1 (deviations 1, 1, -2);
  # user 3 rates a 5, c 3 (deviations 1, -1).
  users = np.array([1, 1, 1, 2, 2, 2, 3, 3])
  items = np.array([10, 11, 12, 10, 11, 12, 10, 12])
  ratings = np.array([5, 5, 2, 4, 4, 1, 5, 3], np.float64)
  knn = item_knn.fit_item_knn(users, items, ratings, shrinkage=2.0)
  # sim(a, b) = (1 + 1) / (sqrt(3) sqrt(2)), 2 users rated both: * 2 / (2 + 2).
  s_ab = 2 / math.sqrt(6) * 0.5
  assert knn.similarity[0, 1] == pytest.approx(s_ab)
  # sim(c, b) < 0: only a is a neighbor of b for user 3 (deviation 1).
  assert knn.similarity[2, 1] < 0
  assert knn.predict(3, 11) == pytest.approx(s_ab / (1.0 + s_ab))
  # Unseen user or movie, or no positive neighbor: 0.
  assert knn.predict(9, 11) == 0.0 and knn.predict(3, 99) == 0.0
  only_c = item_knn.fit_item_knn(np.array([1, 1, 2]), np.array([10, 12, 12]),
                                 np.array([5.0, 1.0, 3.0]))
  assert only_c.predict(2, 10) == 0.0


@pytest.mark.parametrize("num_neighbors, shrinkage, prior_weight", [(30, 50.0, 1.0), (2, 0.0, 0.0),
                                                                    (1, 3.0, 2.0)])
def test_matches_the_loop_reference(num_neighbors, shrinkage, prior_weight):
  rng = np.random.default_rng(7)
  pairs = [(u, i) for u in range(6) for i in range(8) if rng.random() < 0.6]
  users, items = (np.array(c) for c in zip(*pairs))
  ratings = rng.integers(1, 6, len(pairs)).astype(np.float64)
  knn = item_knn.fit_item_knn(users, items, ratings, num_neighbors, shrinkage, prior_weight)
  for user in range(7):
    for item in range(9):
      assert knn.predict(user, item) == pytest.approx(
          _reference(users, items, ratings, user, item, num_neighbors, shrinkage, prior_weight),
          abs=1e-12), (user, item)
  # predict_many: the same, vectorized per user, any order, unseen ids too.
  users_asked = np.array([u for u in range(7) for _ in range(9)][::-1])
  items_asked = np.array([i for _ in range(7) for i in range(9)][::-1])
  np.testing.assert_allclose(knn.predict_many(users_asked, items_asked),
                             [knn.predict(u, i) for u, i in zip(users_asked, items_asked)],
                             rtol=1e-12, atol=1e-14)


def test_errors():
  with pytest.raises(ValueError, match="needs ratings"):
    item_knn.fit_item_knn(np.array([], np.int64), np.array([], np.int64), np.array([]))
  with pytest.raises(ValueError, match="got 0, 50.0, 1.0"):
    item_knn.fit_item_knn(np.array([1]), np.array([1]), np.array([3.0]), num_neighbors=0)

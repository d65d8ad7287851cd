"""data/letor_prep.py: the seeded holdout of LETOR queries and the feature moments."""

import numpy as np
import pytest

from mxrec_pipeline.data import letor
from mxrec_pipeline.data import letor_prep


def _letor(path, num_queries, docs=3):
  lines = []
  for q in range(num_queries):
    for d in range(docs):
      lines.append(f"{d % 3} qid:{100 + q} 1:{q}.5 3:{-d} # doc {d}\n")
  path.write_text("".join(lines))
  return path


@pytest.mark.parametrize(
    "n, fraction, min_queries, expected",
    [
        (1000, 0.1, 30, 100),  # 10 %.
        (200, 0.1, 30, 30),  # At least 30.
        (43, 0.1, 30, 21),  # At most half.
        (43, 0.0, 30, 0),  # None.
        (1, 0.5, 1, 0),
    ])
def test_holdout_size(n, fraction, min_queries, expected):
  assert letor_prep.holdout_size(n, fraction, min_queries) == expected


def test_split_holdout_keeps_every_line_once_in_query_order(tmp_path):
  src = _letor(tmp_path / "train.txt", 40)
  rest, held = tmp_path / "rest.txt", tmp_path / "held.txt"
  assert letor_prep.split_holdout(src, rest, held, 0.1, 5, seed=3) == (35, 5)
  rest_lines, held_lines = rest.read_text().splitlines(), held.read_text().splitlines()
  assert sorted(rest_lines + held_lines) == sorted(src.read_text().splitlines())
  held_qids = [line.split()[1] for line in held_lines]
  assert len(set(held_qids)) == 5 and len(held_lines) == 15
  # Lines of a query stay together, in the source order.
  order = [line for line in src.read_text().splitlines() if line in set(held_lines)]
  assert held_lines == order
  # Seeded: the same draw again; another seed, another draw.
  letor_prep.split_holdout(src, rest, tmp_path / "again.txt", 0.1, 5, seed=3)
  assert (tmp_path / "again.txt").read_text() == held.read_text()
  letor_prep.split_holdout(src, rest, tmp_path / "other.txt", 0.1, 5, seed=4)
  assert (tmp_path / "other.txt").read_text() != held.read_text()
  # Both outputs read as LETOR lists.
  assert len(letor.read_letor(held, 3)) == 5 and len(letor.read_letor(rest, 3)) == 35


def test_split_holdout_refuses_a_file_of_one_query(tmp_path):
  src = _letor(tmp_path / "one.txt", 1)
  with pytest.raises(ValueError, match="one.txt: 1 queries, too few"):
    letor_prep.split_holdout(src, tmp_path / "r", tmp_path / "h", 0.1, 1, seed=0)


def test_feature_moments_of_the_log1p_with_missing_features_as_zero(tmp_path):
  src = tmp_path / "t.txt"
  src.write_text("1 qid:1 1:3 2:-1\n0 qid:1 1:0 3:5\n2 qid:2 2:1 # no feature 1 or 3\n")
  mean, std = letor_prep.feature_moments([src], 4)
  x = np.array([[3, -1, 0, 0], [0, 0, 5, 0], [0, 1, 0, 0]], np.float64)
  t = np.sign(x) * np.log1p(np.abs(x))
  np.testing.assert_allclose(mean, t.mean(axis=0))
  expected_std = t.std(axis=0)
  expected_std[3] = 1.0  # Feature 4 is constant (missing everywhere): std 1.
  np.testing.assert_allclose(std, expected_std)


def test_feature_moments_name_a_bad_line(tmp_path):
  src = tmp_path / "bad.txt"
  src.write_text("1 qid:1 1:3\n1 qid:1 1:x\n")
  with pytest.raises(ValueError, match="bad.txt:2"):
    letor_prep.feature_moments([src], 2)

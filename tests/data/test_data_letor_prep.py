"""data/letor_prep.py: the seeded holdout of LETOR queries and the feature moments."""

import numpy as np
import pytest

from mxrec_pipeline.data import elwc
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


def _qids(path):
  return [
      int(r.context.features.feature[letor.QID_FEATURE].int64_list.value[0])
      for r in elwc.read_elwc_tfrecord(path)
  ]


def test_split_holdout_keeps_every_list_once_in_order(tmp_path):
  src = tmp_path / "train.tfrecord"
  letor.letor_to_elwc(_letor(tmp_path / "train.txt", 40), src, 3)
  rest, held = tmp_path / "rest.tfrecord", tmp_path / "held.tfrecord"
  qids = letor_prep.split_holdout(src, rest, held, 0.1, 5, seed=3)
  assert qids == _qids(held) and len(qids) == 5  # At least 5 of 40 (10 % is 4).
  assert len(_qids(rest)) == 35
  assert sorted(_qids(rest) + qids) == list(range(100, 140))
  assert _qids(rest) == sorted(_qids(rest))  # The source's order.
  # The lists are the source's, record for record.
  records = {
      r.context.features.feature["qid"].int64_list.value[0]: r.SerializeToString()
      for r in elwc.read_elwc_tfrecord(src)
  }
  assert all(
      records[q] == r.SerializeToString() for q, r in zip(qids, elwc.read_elwc_tfrecord(held)))
  # Seeded: the same draw again; another seed, another draw.
  assert letor_prep.split_holdout(src, rest, tmp_path / "again", 0.1, 5, seed=3) == qids
  assert letor_prep.split_holdout(src, rest, tmp_path / "other", 0.1, 5, seed=4) != qids


def test_split_holdout_of_one_list_holds_none_out(tmp_path):
  src = tmp_path / "one.tfrecord"
  letor.letor_to_elwc(_letor(tmp_path / "one.txt", 1), src, 3)
  assert letor_prep.split_holdout(src, tmp_path / "r", tmp_path / "h", 0.1, 1, seed=0) is None
  assert not (tmp_path / "r").exists()


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


def test_feature_moments_leave_out_the_excluded_queries(tmp_path):
  src = tmp_path / "t.txt"
  src.write_text("1 qid:1 1:3\n0 qid:2 1:8\n2 qid:3 1:1\n")
  mean, _ = letor_prep.feature_moments([src], 1, exclude_qids=[2])
  np.testing.assert_allclose(mean, [(np.log1p(3) + np.log1p(1)) / 2])
  with pytest.raises(ValueError, match="no document"):
    letor_prep.feature_moments([src], 1, exclude_qids=[1, 2, 3])


def test_feature_moments_name_a_bad_line(tmp_path):
  src = tmp_path / "bad.txt"
  src.write_text("1 qid:1 1:3\n1 qid:1 1:x\n")
  with pytest.raises(ValueError, match="bad.txt:2"):
    letor_prep.feature_moments([src], 2)

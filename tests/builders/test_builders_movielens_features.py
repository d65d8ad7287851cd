"""movielens_listwise's features from the training split, in the model (builders/movielens.py)."""

import pytest

from builders import movielens
from mxrec_pipeline.data import movielens as movielens_data
from mxrec_pipeline.util import initialize


@pytest.mark.parametrize("user_history, rating_statistics, mf_rating, item_knn",
                         [(True, True, True, True), (False, True, False, True),
                          (True, False, True, False), (True, False, False, False)])
def test_switches_choose_inputs_tables_and_the_linear_term(user_history, rating_statistics,
                                                           mf_rating, item_knn):
  initialize.init()
  ranker = movielens.MovieLensListwise()
  config = movielens.MovieLensModelConfig(device_vocabulary_size=100, user_history=user_history,
                                          rating_statistics=rating_statistics, mf_rating=mf_rating,
                                          item_knn=item_knn)
  features, tables = ranker.sparse_features(config)
  table_of = {f.name: f.table for f in features}
  expected = {"history_item_ids": "history_item", "history_genres": "genre"}
  assert {k: table_of.get(k) for k in expected
         } == (expected if user_history else {k: None for k in expected})
  assert ("history_item" in {t.name for t in tables}) == user_history
  context, example = ranker.model_feature_specs(config)
  history, statistics = (set(movielens_data.HISTORY_FEATURES),
                         set(movielens_data.RATING_STATISTICS_FEATURES))
  assert history & set(context) == (history if user_history else set())
  assert statistics & set(example) == (statistics if rating_statistics else set())
  assert ("mf_rating" in example, "item_knn_deviation" in example) == (mf_rating, item_knn)

  model = ranker.build_model_builder(config, seed=1).build()
  names = {layer.name for layer in model.layers}
  assert ("sparse_lookup_history_item_ids" in names) == user_history
  assert ("sparse_lookup_history_genres" in names) == user_history
  # The wide part: one weight per dense feature from the training ratings.
  num_linear = 3 * rating_statistics + mf_rating + item_knn
  linear = [layer for layer in model.layers if layer.name == "linear"]
  assert [w.shape.as_list() for layer in linear for w in layer.weights
         ] == ([[num_linear, 1]] if num_linear else [])
  # Every model input the parsed ELWC features can feed (the label is not one).
  all_context, all_example, _ = ranker.feature_specs()
  assert set(context) <= set(all_context) and set(example) <= set(all_example)

"""By-key and delta checkpoints of an Embedding's tables (distributed/embedding_checkpoint.py).

The two-table Embedding of test_embedding_checkpoint.py (movie: Adam, user:
Adagrad) trains 3 steps: a full save after step 1, deltas after steps 2 and
3. A fresh Embedding restoring the full save and both deltas holds every
table's rows, id -> row map and slots exactly as the trained one; a delta
holds only its step's ids; several replicas are refused.
"""

import types

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.distributed import embedding_checkpoint

import test_embedding_checkpoint as base


def test_a_full_save_and_its_deltas_restore_every_table(tmp_path):
  embedding, model, movie, user = base._build()
  base._step(embedding, model, base.BATCHES[0], 0)
  prefixes = embedding_checkpoint.save_tables(embedding, str(tmp_path / "full"))
  assert [p.rsplit("/", 2)[1] for p in prefixes] == ["movie", "user"]
  deltas = []
  for step in (1, 2):
    base._step(embedding, model, base.BATCHES[step], step)
    deltas.append(str(tmp_path / f"delta-{step}"))
    embedding_checkpoint.save_delta(embedding, deltas[-1])
  expected = base._state(embedding, movie, user)
  # Step 2 looked up movies 6, 3, 2 (item) and 2, 9, 6, 1 (history), users 2, 3, 7.
  for table, ids in (("movie", [1, 2, 3, 6, 9]), ("user", [2, 3, 7])):
    changed = tf.train.load_variable(f"{deltas[1]}/{table}/shard-0-of-1", "keys")
    np.testing.assert_array_equal(changed, ids, err_msg=table)

  restored, _, movie, user = base._build()
  embedding_checkpoint.restore_tables(restored, str(tmp_path / "full"), deltas)
  base._assert_same(base._state(restored, movie, user), expected)


def test_an_embedding_of_several_replicas_is_refused(tmp_path):
  with pytest.raises(ValueError, match="the Embedding runs 2 replicas; checkpoint mirrored"):
    embedding_checkpoint.save_tables(types.SimpleNamespace(num_replicas=2), str(tmp_path))

"""Per-shard checkpoints restore onto another number of shards: 2 workers -> 1 process, 1 -> 2.

Half the steps run on one side, the checkpoint (table shards by
distributed/checkpoint.py, dense model by tf.train.Checkpoint) moves to the
other, which trains the rest: losses, rows by key and dense weights must equal
one process training every step without a break.
"""

import numpy as np
import pytest
import tensorflow as tf

import distributed_testlib as lib
from mxrec_pipeline.core import embedding
from mxrec_pipeline.core import initializers
from mxrec_pipeline.distributed import checkpoint
from mxrec_pipeline.distributed import sharding
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.util import initialize

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

OPTIMIZER = "lazy_adam"
HALF = 2


def _cluster_args(tmp_path, *extra):
  return [[
      "--optimizer", OPTIMIZER, "--steps",
      str(HALF), "--out",
      str(tmp_path / f"out{i}.npz"), *extra
  ] for i in range(2)]


def test_two_workers_to_one_process_with_admission(tmp_path):
  # Keys seen fewer than 3 times by the save are pending: their counts must
  # reach their new owner (here the one process) for the runs to agree.
  ckpt = tmp_path / "ckpt"
  lib.run_cluster(2, _cluster_args(tmp_path, "--save", str(ckpt), "--access_threshold", "3"),
                  tmp_path)
  saved = {}
  for i in range(2):
    saved.update(lib.by_key(*[np.load(tmp_path / f"out{i}.npz")[n] for n in ("keys", "rows")]))
  resumed = lib.reference_run(OPTIMIZER, HALF, first_step=HALF, restore=str(ckpt),
                              access_threshold=3)
  whole = lib.reference_run(OPTIMIZER, 2 * HALF, access_threshold=3)
  np.testing.assert_allclose(resumed["losses"], whole["losses"][HALF:], rtol=1e-5, atol=1e-6)
  lib.assert_rows_equal(lib.by_key(resumed["keys"], resumed["rows"]),
                        lib.by_key(whole["keys"], whole["rows"]))
  np.testing.assert_allclose(resumed["w"], whole["w"], rtol=1e-5, atol=1e-6)
  # The restore itself: every saved key, with its saved row.
  initialize.init()
  table = embedding.create_table(key_dtype=tf.int64, dim=lib.DIM, name=lib.TABLE,
                                 emb_initializer=lib.initializer(), device_vocabulary_size=lib.ROWS)
  assert checkpoint.restore_shard(str(ckpt), table) == len(saved)
  keys, rows = table.key_index.export()
  lib.assert_rows_equal(lib.by_key(keys.numpy(), tf.gather(table.variable, rows).numpy()), saved)
  assert table.key_index.export_state()["pending_keys"].shape[0] > 0


def test_one_process_to_two_workers(tmp_path):
  ckpt = tmp_path / "ckpt"
  first = lib.reference_run(OPTIMIZER, HALF, save=str(ckpt))
  lib.run_cluster(2, _cluster_args(tmp_path, "--restore", str(ckpt), "--first_step", str(HALF)),
                  tmp_path)
  whole = lib.reference_run(OPTIMIZER, 2 * HALF)
  got = {}
  for shard in range(2):
    out = np.load(tmp_path / f"out{shard}.npz")
    np.testing.assert_allclose(out["losses"], whole["losses"][HALF:], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out["w"], whole["w"], rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(sharding.owner_numpy(out["keys"], 2), shard)
    got.update(lib.by_key(out["keys"], out["rows"]))
  lib.assert_rows_equal(got, lib.by_key(whole["keys"], whole["rows"]))
  assert set(lib.by_key(first["keys"], first["rows"])) <= set(got)


def test_restore_errors_name_the_table(tmp_path):
  initialize.init()
  table = embedding.create_table(key_dtype=tf.int64, dim=lib.DIM, name=lib.TABLE,
                                 emb_initializer=lib.initializer(), device_vocabulary_size=4)
  with pytest.raises(FileNotFoundError, match="table 'item': no shard-"):
    checkpoint.restore_shard(str(tmp_path), table)
  table.key_index.insert(tf.constant([1, 2, 3], tf.int64), training=True)
  checkpoint.save_shard(str(tmp_path), table)
  (tmp_path / "item" / "shard-0-of-1.index").rename(tmp_path / "item" / "shard-1-of-2.index")
  with pytest.raises(FileNotFoundError, match=r"table 'item': shard 0 of 2 is missing"):
    checkpoint.restore_shard(str(tmp_path), table)
  # A whole bundle, then its data file lost: the shard named, before and at restore.
  prefix = checkpoint.save_shard(str(tmp_path / "lost"), table)
  assert checkpoint.saved_key_count(str(tmp_path / "lost"), lib.TABLE) == 3
  (tmp_path / "lost" / "item" / "shard-0-of-1.data-00000-of-00001").unlink()
  for read in (checkpoint.saved_key_count, checkpoint.restore_shard):
    with pytest.raises(
        FileNotFoundError, match=f"table 'item': cannot read `keys` of shard {prefix}:"
        ".*shard-0-of-1.data-00000-of-00001"):
      read(str(tmp_path / "lost"), lib.TABLE if read is checkpoint.saved_key_count else table)


def test_save_is_atomic_per_shard(tmp_path):
  initialize.init()
  table = embedding.create_table(key_dtype=tf.int64, dim=lib.DIM, name=lib.TABLE,
                                 emb_initializer=lib.initializer(), device_vocabulary_size=4)
  table.key_index.insert(tf.constant([1, 2], tf.int64), training=True)
  prefix = checkpoint.save_shard(str(tmp_path), table)
  assert sorted(p.name for p in (tmp_path / "item").iterdir()) == [
      "shard-0-of-1.data-00000-of-00001", "shard-0-of-1.index"
  ]
  # A save killed before its rename leaves a temporary bundle, which restores ignore.
  (tmp_path / "item" / "shard-1-of-2_temp_99.data-00000-of-00001").write_bytes(b"partial")
  assert checkpoint.saved_shards(str(tmp_path), lib.TABLE) == [prefix]
  assert checkpoint.restore_shard(str(tmp_path), table) == 2


def test_tiered_table_restores_before_its_optimizer_is_attached(tmp_path):
  """A fresh process's tiered table (no optimizer_list) restores rows and slots of every tier."""
  init = initializers.RowInitializer("truncated_normal", stddev=0.1, seed=5)
  batches = [tf.constant(b) for b in np.random.default_rng(4).integers(0, 40, size=[10, 6])]

  def tiered(optimizer_list=None):
    return embedding.create_table(key_dtype=tf.int64, dim=lib.DIM, name="tiered_restore",
                                  emb_initializer=init, device_vocabulary_size=8,
                                  host_vocabulary_size=40, optimizer_list=optimizer_list)

  def train(table, optimizer, ids_list):
    for ids in ids_list:
      with tf.GradientTape() as tape:
        loss = tf.reduce_sum(tf.square(embedding.sparse_lookup(table, ids) - 1.0))
      optimizer.apply_gradients([(tape.gradient(loss, table.variable), table.variable)])
    return embedding.sparse_lookup(table, tf.range(40, dtype=tf.int64), is_train=False).numpy()

  initialize.init()
  try:
    optimizer = lazy_adam.create_hash_optimizer(0.05)
    table = tiered([optimizer])
    train(table, optimizer, batches[:5])
    checkpoint.save_shard(str(tmp_path), table, [optimizer])
    want = train(table, optimizer, batches[5:])
  finally:
    initialize.terminate_config_initializer()
  initialize.init()
  try:
    optimizer = lazy_adam.create_hash_optimizer(0.05)
    table = tiered()  # Its slots attach when the optimizer builds, inside restore_shard.
    assert checkpoint.restore_shard(str(tmp_path), table, [optimizer]) > 8
    np.testing.assert_allclose(train(table, optimizer, batches[5:]), want, rtol=1e-5, atol=1e-6)
  finally:
    initialize.terminate_config_initializer()

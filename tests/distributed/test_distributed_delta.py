"""Delta checkpoints (distributed/delta.py): a full save plus deltas restores as a full save.

A one-process table with admission (threshold 2) and eviction trains with a
hash optimizer (flat: lazy Adam, Adagrad, FTRL; tiered, 16 device rows and
the rest on the host: lazy Adam); a full save at step 2 starts the chain,
deltas follow at steps 4, 6 and 8 (evictions between them), and a full save
at step 8 is the reference. The chain restored (onto one shard, keys on their saved rows, and
onto 2 shards) equals the reference restored the same way: keys, rows,
values, slots, step counts, last-seen times, pending keys and counters, bit
for bit. Deltas hold only the keys trained since the previous save.
"""

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import admission
from mxrec_pipeline.core import embedding
from mxrec_pipeline.core import key_index
from mxrec_pipeline.core import lookup
from mxrec_pipeline.core import tiers
from mxrec_pipeline.distributed import checkpoint
from mxrec_pipeline.distributed import delta
from mxrec_pipeline.distributed import shard_files
from mxrec_pipeline.optimizers import factory
from mxrec_pipeline.util import initialize

DIM, ROWS, TABLE = 4, 64, "item"
OPTIMIZERS = {"lazy_adam": 0.05, "adagrad": 0.1, "ftrl": 0.1}


def _batch(step: int) -> np.ndarray:
  """Ids of step `step`: a moving window (old ids go idle and are evicted) plus repeats."""
  rng = np.random.default_rng(step)
  return np.concatenate([np.arange(step * 3, step * 3 + 8),
                         rng.integers(0, 40, 6)]).astype(np.int64)


def _train(table, optimizer, steps) -> None:
  container = initialize.get_config_initializer().container
  for step in steps:
    keys = key_index.to_keys(tf.constant(_batch(step)))
    rows, restore = admission.insert(container, TABLE, keys, True,
                                     timestamp=tf.constant(10 * step, tf.int64))
    token = None
    if table.is_tiered:  # The key process's plan: device slots of the batch's rows.
      rows, token = tiers.plan(container, TABLE, rows, wait=False)
    with tf.GradientTape() as tape:
      unique = lookup.unique_embeddings(table, rows, training=True, admitting=True,
                                        plan_token=token)
      loss = tf.reduce_sum(tf.square(lookup.per_id(unique, restore) - 1.0))
    optimizer.apply_gradients(zip(tape.gradient(loss, [table.variable]), [table.variable]))
    admission.evict(table, 25, [optimizer])


def _new_table(optimizer_key: str, shard: tuple[int, int] = (0, 1)):
  """The table of `optimizer_key` ("tiered": a tiered table with lazy Adam) and its optimizer."""
  tiered = optimizer_key == "tiered"
  optimizer = factory.get_optimizer("lazy_adam" if tiered else optimizer_key,
                                    OPTIMIZERS["lazy_adam" if tiered else optimizer_key])
  sizes = {
      "device_vocabulary_size": 16, "host_vocabulary_size": ROWS -
                                                            16, "optimizer_list": [optimizer]
  } if tiered else {"device_vocabulary_size": ROWS}
  table = embedding.create_table(tf.int64, DIM, TABLE, tf.keras.initializers.Constant(0.1), **sizes)
  if not tiered:
    table = table.as_shard(*shard)
  admission.configure(TABLE, admission.AdmitEvictConfig(2, 25), "test")
  optimizer.build([table.variable])
  return table, optimizer


def _state(table, optimizer) -> dict:
  state = {n: v.numpy() for n, v in table.key_index.export_state().items()}
  order = np.argsort(state["keys"])
  out = {n: state[n][order] for n in ("keys", "rows", "last_seen")}
  pending = np.argsort(state["pending_keys"])
  out.update({n: state[n][pending] for n in shard_files.PENDING})
  out["counters"] = state["counters"]
  if table.is_tiered:  # Every tier's rows: [embedding | m | v].
    whole = table.tiers.read_rows(table.variable, tf.constant(out["rows"])).numpy()
    out["values"] = whole[:, :DIM]
    for name, slot in table.slot_variables(optimizer).items():
      block = table.tiers.slot_block(slot)
      out[f"slot/{name}"] = whole[:, block * DIM:(block + 1) * DIM]
  else:
    out["values"] = table.variable.numpy()[out["rows"]]
    for name, slot in table.slot_variables(optimizer).items():
      out[f"slot/{name}"] = slot.numpy()[out["rows"]]
  out["iterations"] = table.iterations(optimizer).numpy()
  return out


@pytest.fixture(name="chain", params=[*sorted(OPTIMIZERS), "tiered"])
def _chain(request, tmp_path):
  """(optimizer, full dir (step 2), delta dirs, full dir of step 8, keys per delta, keys)."""
  initialize.init()
  try:
    table, optimizer = _new_table(request.param)
    _train(table, optimizer, range(0, 2))
    checkpoint.save_shard(str(tmp_path / "full-2"), table, [optimizer], start_chain=True)
    deltas, sizes = [], []
    for end in (4, 6, 8):
      _train(table, optimizer, range(end - 2, end))
      deltas.append(str(tmp_path / f"delta-{end}"))
      (prefix,) = delta.save_delta(deltas[-1], table, [optimizer])
      sizes.append(tf.train.load_variable(prefix, "keys").size)
    checkpoint.save_shard(str(tmp_path / "full-8"), table, [optimizer])
    total = table.key_index.size().numpy()
    assert not table.is_tiered or total > 16  # Some rows beyond the device cache.
    assert sum(table.stats()[n] for n in ("evictions",)) > 0  # Eviction happened.
  finally:
    initialize.terminate_config_initializer()
  return request.param, str(tmp_path / "full-2"), deltas, str(tmp_path / "full-8"), sizes, total


def _restored(optimizer_key, restore, shard=(0, 1), keep_rows=False) -> dict:
  initialize.init()
  try:
    table, optimizer = _new_table(optimizer_key, shard)
    restore(table, optimizer, keep_rows)
    return _state(table, optimizer)
  finally:
    initialize.terminate_config_initializer()


@pytest.mark.parametrize("shard, keep_rows", [((0, 1), True), ((0, 1), False), ((1, 2), False)])
def test_a_full_save_and_its_deltas_restore_as_the_full_save_of_the_last_step(
    chain, shard, keep_rows):
  key, full, deltas, reference, _, _ = chain
  if key == "tiered" and shard != (0, 1):
    pytest.skip("tiered tables are not sharded over workers (ps tasks shard them)")
  got = _restored(key, lambda t, o, k: delta.restore_chain(full, deltas, t, [o], keep_rows=k),
                  shard, keep_rows)
  want = _restored(key, lambda t, o, k: checkpoint.restore_shard(reference, t, [o], keep_rows=k),
                   shard, keep_rows)
  assert got.keys() == want.keys() and got["keys"].size > 0
  for name, value in want.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_a_delta_holds_only_the_keys_trained_since_the_previous_save(chain):
  _, _, deltas, _, sizes, total = chain
  assert all(0 < size < 20 for size in sizes), sizes  # Each two steps' admitted keys.
  deleted = [tf.train.load_variable(f"{d}/{TABLE}/shard-0-of-1", delta.DELETED) for d in deltas]
  assert sum(d.size for d in deleted) > 0  # Evictions between saves are recorded.
  assert total > 0


def test_a_delta_before_any_chain_holds_every_key(tmp_path):
  initialize.init()
  try:
    table, optimizer = _new_table("lazy_adam")
    _train(table, optimizer, range(2))
    (prefix,) = delta.save_delta(str(tmp_path / "delta"), table, [optimizer])
    assert tf.train.load_variable(prefix, "keys").size == table.key_index.size().numpy() > 0
  finally:
    initialize.terminate_config_initializer()


def test_a_delta_missing_a_shard_is_named(chain, tmp_path):
  key, full, deltas, _, _, _ = chain
  import shutil  # pylint: disable=import-outside-toplevel
  broken = tmp_path / "broken"
  shutil.copytree(deltas[1], broken)
  for path in (broken / TABLE).iterdir():
    path.unlink()
  with pytest.raises(FileNotFoundError, match=rf"delta {broken} has no shard-0-of-1"):
    _restored(key, lambda t, o, k: delta.restore_chain(full, [deltas[0], str(broken)], t, [o]))

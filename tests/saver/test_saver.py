"""mxrec_pipeline Saver: dense checkpoint plus `sparse-<name>-<step>/`, for plain and
dynamic-expansion tables; restore in fresh graphs and sessions; mxRec's quick-start
paths; missing or corrupt sparse parts; failures leave nothing half-written; ram://."""

import json
import os
import uuid

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import embedding
from mxrec_pipeline.optimizers import lazy_adam, lazy_adam_by_addr
from mxrec_pipeline.saver import saver as saver_lib
from mxrec_pipeline.util.initialize import init, terminate_config_initializer

import sparse_testlib as lib

ITEM_BATCHES = [
    np.array([[1, 2, 1], [3, 4, 2]]),
    np.array([[5, 1, 6], [2, 2, 7]]),
    np.array([[8, 3, 3], [9, 1, 5]]),
    np.array([[2, 10, 11], [4, 4, 12]])
]
USER_BATCHES = [
    np.array([100, 200]),
    np.array([300, 100]),
    np.array([200, 200]),
    np.array([400, 500])
]
PROBE_ITEMS = np.array([1, 2, 5, 9, 12, 77])  # Trained, untrained and never-seen keys.
MODES = ["plain", "expansion"]


def _build(mode, seed, **init_kwargs):
  """A two-table model with a dense part (init() with `init_kwargs`); its handles in a dict."""
  expansion = mode == "expansion"
  init(use_dynamic_expansion=expansion, **init_kwargs)
  item = lib.make_table("item", dim=3, capacity=16 if not expansion else 4, seed=seed)
  user = lib.make_table("user", dim=2, capacity=8, key_dtype=tf.int32, seed=seed + 1)
  item_ids = tf.compat.v1.placeholder(tf.int64, [None, None])
  user_ids = tf.compat.v1.placeholder(tf.int32, [None])
  dense = tf.compat.v1.get_variable("dense", initializer=tf.constant([0.5, -0.25, 1.0]))
  item_emb = embedding.sparse_lookup(item, item_ids)
  user_emb = embedding.sparse_lookup(user, user_ids)
  loss = (tf.reduce_sum(tf.square(tf.reduce_sum(item_emb * dense, -1) - 1.0)) +
          tf.reduce_sum(tf.square(user_emb + 1.0)))
  global_step = tf.compat.v1.train.get_or_create_global_step()
  sparse_optimizer = (lazy_adam_by_addr.create_hash_optimizer_by_address(0.1)
                      if expansion else lazy_adam.create_hash_optimizer(0.1))
  tables = [item.variable, user.variable]
  grads = tf.gradients(loss, [dense] + tables)
  train_op = tf.group(
      tf.compat.v1.train.AdamOptimizer(0.05).apply_gradients([(grads[0], dense)]),
      sparse_optimizer.apply_gradients(zip(grads[1:], tables), global_step=global_step))
  probe = embedding.sparse_lookup(item, tf.constant(PROBE_ITEMS), is_train=False)
  state = {
      "dense": dense, "global_step": global_step, "probe": probe,
      "iterations": sparse_optimizer.iterations
  }
  for table in (item, user):
    keys, rows = table.key_index.export()
    state[f"{table.table_name}/keys"], state[f"{table.table_name}/rows"] = keys, rows
    if expansion:
      state[f"{table.table_name}/values"] = table.store.read_rows(rows)[0]
    else:
      state[f"{table.table_name}/values"] = tf.concat(
          [tf.gather(table.variable, rows)] +
          [tf.gather(sparse_optimizer.get_slot(table.table_name, s), rows) for s in ("m", "v")],
          axis=1)

  def run_step(sess, step):
    sess.run(train_op, {item_ids: ITEM_BATCHES[step], user_ids: USER_BATCHES[step]})

  def read_state(sess):
    values = sess.run(state)
    for name in ("item", "user"):
      order = np.argsort(values[f"{name}/keys"])
      for part in ("keys", "rows", "values"):
        values[f"{name}/{part}"] = values[f"{name}/{part}"][order]
    return values

  return {
      "run_step": run_step, "read_state": read_state, "item": item, "loss": loss,
      "train_op": train_op,
      "feed": lambda step: {item_ids: ITEM_BATCHES[step], user_ids: USER_BATCHES[step]}
  }


def _assert_states_equal(got, expected):
  assert sorted(got) == sorted(expected)
  for name, value in expected.items():
    np.testing.assert_array_equal(got[name], value, err_msg=name)


def _train_and_save(mode, directory, steps=3, **saver_kwargs):
  """Trains `steps` steps, saves at global step `steps`; (path, saved state, next state)."""
  with tf.Graph().as_default():
    model = _build(mode, seed=1)
    saver = saver_lib.Saver(**saver_kwargs)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for step in range(steps):
        model["run_step"](sess, step)
      path = saver.save(sess, os.path.join(directory, "model-0"),
                        global_step=tf.compat.v1.train.get_global_step())
      saved = model["read_state"](sess)
      model["run_step"](sess, steps)
      continued = model["read_state"](sess)
  terminate_config_initializer()
  return path, saved, continued


@pytest.mark.parametrize("mode", MODES)
def test_save_restore_in_a_fresh_graph_gives_identical_lookups_and_next_step(mode, tmp_path):
  path, saved, continued = _train_and_save(mode, str(tmp_path))
  assert path == str(tmp_path / "model-0-3")
  assert os.path.isdir(tmp_path / "sparse-model-0-3")
  dense_names = dict(tf.train.list_variables(path))
  assert "dense" in dense_names and "global_step" in dense_names
  assert not [n for n in dense_names if n.startswith(("item/", "user/"))], dense_names

  with tf.Graph().as_default():
    # The same initializers: step 3 brings new keys, whose rows start from them.
    model = _build(mode, seed=1)
    saver = saver_lib.Saver()
    init_op = tf.compat.v1.global_variables_initializer()
    tf.compat.v1.get_default_graph().finalize()  # Restore builds no ops.
    with tf.compat.v1.Session() as sess:  # No initializer: the restore initializes.
      saver.restore(sess, path)
      _assert_states_equal(model["read_state"](sess), saved)
      model["run_step"](sess, 3)
      _assert_states_equal(model["read_state"](sess), continued)
    with tf.compat.v1.Session() as sess:  # A session that trained on other ids first.
      sess.run(init_op)
      model["run_step"](sess, 3)
      model["run_step"](sess, 1)
      saver.restore(sess, path)
      _assert_states_equal(model["read_state"](sess), saved)
      model["run_step"](sess, 3)
      _assert_states_equal(model["read_state"](sess), continued)


@pytest.mark.parametrize("mode", MODES)
def test_sparse_part_holds_keys_rows_embeddings_and_slots_in_key_order(mode, tmp_path):
  path, saved, _ = _train_and_save(mode, str(tmp_path))
  directory = saver_lib.sparse_dir(path)
  meta = json.loads(open(os.path.join(directory, "meta.json")).read())
  item = meta["tables"]["item"]
  assert item["kind"] == ("expansion" if mode == "expansion" else "table")
  assert item["dim"] == 3
  if mode == "expansion":
    assert item["slots"] == ["m", "v"] and item["slot_initial_values"] == [0.0, 0.0]
  else:
    assert item["slots"] == ["LazyAdam/m", "LazyAdam/v"]
  table_dir = os.path.join(directory, "table-item")
  keys = np.load(os.path.join(table_dir, "keys.npy"))
  assert keys.dtype == np.int64 and list(keys) == sorted(keys) == list(range(1, 10))
  np.testing.assert_array_equal(np.load(os.path.join(table_dir, "rows.npy")), saved["item/rows"])
  files = [
      np.load(os.path.join(table_dir, f"{name}.npy")) for name in ("embeddings", "slot-0", "slot-1")
  ]
  np.testing.assert_array_equal(np.concatenate(files, axis=1), saved["item/values"])
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]  # No temporaries left.


def test_mxrec_quickstart_save_and_restore_if_present(tmp_path):
  directory = str(tmp_path / "saved-model")
  rank_id = 0
  for run in range(2):
    with tf.Graph().as_default():
      model = _build("plain", seed=1)
      saver = saver_lib.Saver()
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        if os.path.exists(f"{directory}/sparse-model-{rank_id}-%d" % 0):
          saver.restore(sess, f"{directory}/model-{rank_id}-%d" % 0)
          restored = model["read_state"](sess)
        else:
          os.makedirs(directory)
          saver.save(sess, f"{directory}/model-{rank_id}", global_step=0)
          model["run_step"](sess, 0)
          saver.save(sess, f"{directory}/model-{rank_id}", global_step=1)
        first = model["read_state"](sess)
    terminate_config_initializer()
    if run == 0:
      initial = first
  assert tf.train.latest_checkpoint(directory).endswith("model-0-1")
  assert sorted(os.listdir(directory)) == sorted([
      "checkpoint", "model-0-0.data-00000-of-00001", "model-0-0.index", "model-0-0.meta",
      "model-0-1.data-00000-of-00001", "model-0-1.index", "model-0-1.meta", "sparse-model-0-0",
      "sparse-model-0-1"
  ])
  assert restored["global_step"] == 0 and len(restored["item/keys"]) == 0
  assert initial["global_step"] == 1


def test_missing_or_corrupt_sparse_part_raises_naming_the_path(tmp_path):
  path, saved, _ = _train_and_save("plain", str(tmp_path))
  directory = saver_lib.sparse_dir(path)
  embeddings = os.path.join(directory, "table-item", "embeddings.npy")
  with tf.Graph().as_default():
    model = _build("plain", seed=50)
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      before = model["read_state"](sess)

      def expect(error, pattern):
        with pytest.raises(error, match=pattern):
          saver.restore(sess, path)
        _assert_states_equal(model["read_state"](sess), before)  # Nothing restored.

      original = open(embeddings, "rb").read()
      open(embeddings, "wb").write(original[:len(original) // 2])
      expect(ValueError, rf"sparse checkpoint file '{embeddings}' of table 'item' is corrupt")
      np.save(embeddings, np.zeros([9, 5], np.float32))
      expect(
          ValueError, rf"'{embeddings}' of table 'item' is corrupt: float32 array of shape "
          r"\(9, 5\), expected float \[n, 3\] with n = 9 keys")
      os.remove(embeddings)
      expect(FileNotFoundError, rf"sparse checkpoint file '{embeddings}' of table 'item' is "
             "missing")
      open(os.path.join(directory, "meta.json"), "w").write("{not json")
      expect(ValueError, rf"sparse checkpoint '{directory}/meta.json' is corrupt")
      os.rename(directory, directory + ".moved")
      expect(FileNotFoundError, rf"sparse checkpoint '{directory}' does not exist")
      os.rename(directory + ".moved", directory)
      meta = {"format": 1, "tables": {}}
      open(os.path.join(directory, "meta.json"), "w").write(json.dumps(meta))
      expect(ValueError, rf"sparse checkpoint '{directory}' has no table 'item'")


def _dir_listing(directory):
  return sorted(os.listdir(directory))


def test_failures_while_saving_leave_the_previous_checkpoint_whole(tmp_path, monkeypatch):
  directory = str(tmp_path)
  with tf.Graph().as_default():
    model = _build("plain", seed=1)
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      model["run_step"](sess, 0)
      first = saver.save(sess, os.path.join(directory, "model"), global_step=1)
      saved = model["read_state"](sess)
      listing = _dir_listing(directory)
      model["run_step"](sess, 1)

      # The sparse part fails half-way (after its first file).
      real_save, calls = np.save, []

      def failing_save(*args, **kwargs):
        calls.append(args)
        if len(calls) > 1:
          raise OSError("disk full")
        return real_save(*args, **kwargs)

      monkeypatch.setattr(np, "save", failing_save)
      with pytest.raises(OSError, match="disk full"):
        saver.save(sess, os.path.join(directory, "model"), global_step=2)
      monkeypatch.undo()
      assert _dir_listing(directory) == listing

      # The dense part fails after the sparse part was renamed into place.
      def failing_dense_save(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "disk full")

      monkeypatch.setattr(tf.compat.v1.train.Saver, "save", failing_dense_save)
      with pytest.raises(tf.errors.ResourceExhaustedError):
        saver.save(sess, os.path.join(directory, "model"), global_step=2)
      monkeypatch.undo()
      assert _dir_listing(directory) == listing
      assert tf.train.latest_checkpoint(directory) == first

      saver.restore(sess, tf.train.latest_checkpoint(directory))
      _assert_states_equal(model["read_state"](sess), saved)


def test_max_to_keep_deletes_old_sparse_parts_and_resave_replaces(tmp_path):
  with tf.Graph().as_default():
    model = _build("plain", seed=1)
    saver = saver_lib.Saver(max_to_keep=2)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for step in range(3):
        model["run_step"](sess, step)
        saver.save(sess, str(tmp_path / "model"), global_step=step, write_meta_graph=False)
      saver.save(sess, str(tmp_path / "model"), global_step=2, write_meta_graph=False)
  assert sorted(n for n in os.listdir(tmp_path) if n.startswith("sparse")) == [
      "sparse-model-1", "sparse-model-2"
  ]
  assert not [n for n in os.listdir(tmp_path) if n.startswith(".")]


@pytest.mark.parametrize("mode", MODES)
def test_monitored_session_saves_and_restores_through_the_scaffold(mode, tmp_path):
  # The Estimator path: the Scaffold's saver, CheckpointSaverHook saves at the
  # end, the next MonitoredSession restores the latest checkpoint on creation.
  directory = str(tmp_path)
  states = []
  for run in range(2):
    with tf.Graph().as_default():
      model = _build(mode, seed=1 + 10 * run)
      scaffold = tf.compat.v1.train.Scaffold(saver=saver_lib.Saver())
      with tf.compat.v1.train.MonitoredTrainingSession(checkpoint_dir=directory, scaffold=scaffold,
                                                       save_checkpoint_steps=1000,
                                                       save_summaries_steps=None,
                                                       log_step_count_steps=None) as sess:
        if run == 0:
          for step in range(2):
            model["run_step"](sess, step)
        states.append(model["read_state"](sess))
    terminate_config_initializer()
  _assert_states_equal(states[1], states[0])
  assert states[0]["global_step"] == 2
  assert os.path.isdir(os.path.join(directory, "sparse-model.ckpt-2"))


def test_saver_needs_a_graph_and_init():
  with pytest.raises(RuntimeError, match=r"not initialized"):
    with tf.Graph().as_default():
      saver_lib.Saver()
  init()
  with pytest.raises(RuntimeError, match=r"eagerly, checkpoint tables with tf.train.Checkpoint"):
    saver_lib.Saver()


@pytest.mark.parametrize("mode", MODES)
def test_saves_restores_and_prunes_on_any_tf_filesystem(mode):
  # TF's in-memory filesystem stands for GCS/S3/HDFS: no call may need a POSIX path.
  directory = f"ram://saver-{mode}-{uuid.uuid4().hex}"
  path, saved, continued = _train_and_save(mode, directory)
  assert tf.io.gfile.isdir(f"{directory}/sparse-model-0-3")
  with tf.Graph().as_default():
    model = _build(mode, seed=1)
    saver = saver_lib.Saver(max_to_keep=1)
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, path)
      _assert_states_equal(model["read_state"](sess), saved)
      model["run_step"](sess, 3)
      _assert_states_equal(model["read_state"](sess), continued)
      for step in (4, 5, 5):  # Pruned by max_to_keep, then a re-save of step 5 replaced.
        saver.save(sess, f"{directory}/next", global_step=step, write_meta_graph=False)
  sparse = sorted(n.rstrip("/") for n in tf.io.gfile.listdir(directory) if n.startswith("sparse-"))
  assert sparse == ["sparse-model-0-3", "sparse-next-5"]
  assert not [n for n in tf.io.gfile.listdir(directory) if n.startswith(".")]
  terminate_config_initializer()
  with pytest.raises(FileNotFoundError, match=f"sparse checkpoint file '{directory}/sparse-next-5"):
    tf.io.gfile.remove(f"{directory}/sparse-next-5/table-item/keys.npy")
    with tf.Graph().as_default():
      _build(mode, seed=1)
      with tf.compat.v1.Session() as sess:
        saver_lib.Saver().restore(sess, f"{directory}/next-5")
  terminate_config_initializer()


@pytest.mark.parametrize("mode", MODES)
def test_warm_start_tables_takes_only_the_named_tables(mode, tmp_path, capsys):
  path, saved, _ = _train_and_save(mode, str(tmp_path))
  with tf.Graph().as_default():
    model = _build(mode, seed=7)  # A new model: other initial rows and dense values.
    with pytest.raises(
        ValueError, match=r"warm_start_tables \['nope'\] are not tables of this "
        r"graph \(its tables: \['item', 'user'\]\)"):
      saver_lib.Saver(warm_start_tables=["nope"])
    saver = saver_lib.Saver(warm_start_tables=["item"])
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      initial = model["read_state"](sess)
      saver.restore(sess, path)
      state = model["read_state"](sess)
      for name, value in state.items():
        # The named table (and a lookup of it) as saved; the rest as initialized.
        want = saved if name.startswith("item/") or name == "probe" else initial
        np.testing.assert_array_equal(value, want[name], err_msg=name)
      saver.restore(sess, path, warm_start_tables=["user"])  # mxRec's restore argument.
      for name, value in model["read_state"](sess).items():
        if name.startswith("user/"):
          np.testing.assert_array_equal(value, saved[name], err_msg=name)
  out = capsys.readouterr().out
  keys = len(saved["item/keys"])
  assert (f"warm start: table 'item' from {saver_lib.sparse_dir(path)}: {keys} keys with their "
          "rows and optimizer slots") in out
  assert "warm start: table 'user' keeps its initial values (not in warm_start_tables)" in out
  terminate_config_initializer()

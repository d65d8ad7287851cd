"""The Saver's delta checkpoints (mxRec's `save(..., save_delta=True)`, `init(is_incremental_...)`).

The two-table model of test_saver.py trains 4 steps: a full save after step
2, deltas after steps 3 and 4. Restoring the delta of step 4 (the full part,
then both deltas) in a fresh graph gives the state a full save of step 4
gives, and the same next step, for plain and dynamic-expansion tables;
`restore_model_version` picks step 3 of the directory. Deltas hold only the
keys trained since the previous save; a full
part a kept delta needs outlives max_to_keep; a failed delta loses no change;
misuse and a missing part of the chain are named; recent_key_count_threshold
leaves rare keys out of deltas. DeltaCheckpointHook saves on init()'s timers
(a fake clock).
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.saver import hooks
from mxrec_pipeline.saver import saver as saver_lib
from mxrec_pipeline.saver import sparse_files
from mxrec_pipeline.util.initialize import init, terminate_config_initializer

import test_saver

INCREMENTAL = {"is_incremental_checkpoint": True}


def _train_with_deltas(directory, mode="plain", **init_kwargs):
  """Steps 0-3: full save at 2, deltas at 3 and 4; (paths by step, states by step, next)."""
  with tf.Graph().as_default():
    model = test_saver._build(mode, seed=1, **{**INCREMENTAL, **init_kwargs})
    saver = saver_lib.Saver()
    paths, states = {}, {}
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for step in range(4):
        model["run_step"](sess, step)
        if step >= 1:
          paths[step + 1] = saver.save(sess, os.path.join(directory, "model"), global_step=step + 1,
                                       save_delta=step >= 2)
          states[step + 1] = model["read_state"](sess)
      model["run_step"](sess, 0)
      continued = model["read_state"](sess)
  terminate_config_initializer()
  return paths, states, continued


def _restored(path, mode="plain", **init_kwargs):
  """(state after restoring `path` in a fresh graph, state after one more step)."""
  try:
    with tf.Graph().as_default():
      model = test_saver._build(mode, seed=1, **{**INCREMENTAL, **init_kwargs})
      saver = saver_lib.Saver()
      with tf.compat.v1.Session() as sess:
        saver.restore(sess, path)
        restored = model["read_state"](sess)
        model["run_step"](sess, 0)
        after = model["read_state"](sess)
  finally:
    terminate_config_initializer()
  return restored, after


@pytest.mark.parametrize("mode", test_saver.MODES)
def test_a_chain_restores_as_the_full_save_of_its_step_and_trains_on(mode, tmp_path):
  paths, states, continued = _train_with_deltas(str(tmp_path), mode)
  assert sorted(n for n in os.listdir(tmp_path) if "sparse" in n) == [
      "delta-sparse-model-3", "delta-sparse-model-4", "sparse-model-2"
  ]
  meta = json.loads((tmp_path / "delta-sparse-model-4" / "meta.json").read_text())
  assert meta["chain"] == ["sparse-model-2", "delta-sparse-model-3", "delta-sparse-model-4"]
  # Step 3 trained items 2, 4, 10, 11, 12 (of 12 keys) and users 400, 500 (of 5).
  for table, keys in (("item", [2, 4, 10, 11, 12]), ("user", [400, 500])):
    delta = tmp_path / "delta-sparse-model-4" / sparse_files.table_dir(table)
    np.testing.assert_array_equal(np.load(delta / "keys.npy"), keys)
    assert np.load(delta / "deleted_keys.npy").size == 0

  restored, after = _restored(paths[4], mode)
  test_saver._assert_states_equal(restored, states[4])
  test_saver._assert_states_equal(after, continued)
  # init(restore_model_version=3): the directory's checkpoint of step 3 (full part + 1 delta).
  restored, _ = _restored(str(tmp_path), mode, restore_model_version=3)
  test_saver._assert_states_equal(restored, states[3])
  restored, _ = _restored(str(tmp_path), mode)  # The newest.
  test_saver._assert_states_equal(restored, states[4])
  with pytest.raises(
      FileNotFoundError, match=r"restore_model_version=7: .* has no checkpoint "
      r"of that step \(it has steps \['2', '3', '4'\]\)"):
    _restored(str(tmp_path), mode, restore_model_version=7)


def test_a_delta_after_a_restore_builds_on_the_restored_chain(tmp_path):
  paths, states, _ = _train_with_deltas(str(tmp_path))
  with tf.Graph().as_default():
    model = test_saver._build("plain", seed=1, **INCREMENTAL)
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, paths[3])
      model["run_step"](sess, 3)  # As the first run's step 4.
      path = saver.save(sess, str(tmp_path / "again"), global_step=4, save_delta=True)
  terminate_config_initializer()
  meta = json.loads((tmp_path / "delta-sparse-again-4" / "meta.json").read_text())
  assert meta["chain"] == ["sparse-model-2", "delta-sparse-model-3", "delta-sparse-again-4"]
  test_saver._assert_states_equal(_restored(path)[0], states[4])


def test_a_full_part_that_kept_deltas_need_outlives_max_to_keep(tmp_path):
  with tf.Graph().as_default():
    model = test_saver._build("plain", seed=1, **INCREMENTAL)
    saver = saver_lib.Saver(max_to_keep=2)
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      for step, delta in enumerate([False, True, True, False, True]):
        model["run_step"](sess, step % 4)
        saver.save(sess, str(tmp_path / "model"), global_step=step, save_delta=delta,
                   write_meta_graph=False)
        parts = sorted(n for n in os.listdir(tmp_path) if "sparse" in n)
        if step == 2:  # Dense 0 pruned; its sparse part is the chain's base.
          assert parts == ["delta-sparse-model-1", "delta-sparse-model-2", "sparse-model-0"]
  terminate_config_initializer()
  assert parts == ["delta-sparse-model-4", "sparse-model-3"]


def test_a_failed_delta_leaves_its_changes_to_the_next_save(tmp_path, monkeypatch):
  with tf.Graph().as_default():
    model = test_saver._build("plain", seed=1, **INCREMENTAL)
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      model["run_step"](sess, 0)
      saver.save(sess, str(tmp_path / "model"), global_step=1)
      model["run_step"](sess, 1)

      def failing_dense_save(*args, **kwargs):
        raise tf.errors.ResourceExhaustedError(None, None, "disk full")

      with monkeypatch.context() as patch:
        patch.setattr(tf.compat.v1.train.Saver, "save", failing_dense_save)
        with pytest.raises(tf.errors.ResourceExhaustedError):
          saver.save(sess, str(tmp_path / "model"), global_step=2, save_delta=True)
      assert not (tmp_path / "delta-sparse-model-2").exists()
      assert tf.train.latest_checkpoint(str(tmp_path)).endswith("model-1")
      model["run_step"](sess, 2)
      path = saver.save(sess, str(tmp_path / "model"), global_step=3, save_delta=True)
      state = model["read_state"](sess)
  terminate_config_initializer()
  test_saver._assert_states_equal(_restored(path)[0], state)  # Step 2's changes too.


def test_misuse_and_a_broken_chain_are_named(tmp_path):
  with tf.Graph().as_default():
    model = test_saver._build("plain", seed=1)
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      model["run_step"](sess, 0)
      with pytest.raises(ValueError, match=r"needs init\(is_incremental_checkpoint=True\)"):
        saver.save(sess, str(tmp_path / "model"), global_step=1, save_delta=True)
  terminate_config_initializer()
  with tf.Graph().as_default():
    model = test_saver._build("plain", seed=1, **INCREMENTAL)
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      with pytest.raises(ValueError, match=r"needs a full save \(save_delta=False\) or a restore"):
        saver.save(sess, str(tmp_path / "model"), global_step=1, save_delta=True)
  terminate_config_initializer()
  assert not list(tmp_path.glob("delta-*"))

  paths, _, _ = _train_with_deltas(str(tmp_path / "chain"))
  tf.io.gfile.rmtree(str(tmp_path / "chain" / "sparse-model-2"))
  with pytest.raises(
      FileNotFoundError, match=r"delta checkpoint '.*delta-sparse-model-4' builds "
      r"on '.*sparse-model-2', which is missing or incomplete"):
    _restored(paths[4])
  with pytest.raises(ValueError, match="must be in"):
    init(restore_model_version=-1)
  with pytest.raises(ValueError, match="needs `is_incremental_checkpoint=True`"):
    init(save_delta_checkpoints_secs=60)
  with pytest.raises(TypeError, match="`save_checkpoint_due_time` must be an int or None"):
    init(save_checkpoint_due_time=1.5)
  with pytest.raises(
      ValueError, match=r"`recent_key_count_threshold`=2 filters delta "
      r"checkpoints: it needs `is_incremental_checkpoint=True`"):
    init(recent_key_count_threshold=2)
  with pytest.raises(ValueError, match=r"`recent_key_count_threshold` must be in \[0, "):
    init(is_incremental_checkpoint=True, recent_key_count_threshold=-1)
  with pytest.raises(TypeError, match="`recent_key_count_threshold` must be an int"):
    init(is_incremental_checkpoint=True, recent_key_count_threshold=2.0)


@pytest.mark.parametrize("mode", test_saver.MODES)
def test_recent_key_count_threshold_leaves_rare_keys_out_of_the_deltas(mode, tmp_path):
  """mxRec's low-frequency filter: a delta holds the keys trained at least N times since the
  previous save (occurrences in the batches; the evaluation probe does not count)."""
  paths, states, _ = _train_with_deltas(str(tmp_path), mode, recent_key_count_threshold=2)
  # Step 3's batch: item 3 twice (8, 9, 1, 5 once), user 200 twice; step 4's: item 4 twice.
  for step, table, keys in ((3, "item", [3]), (3, "user", [200]), (4, "item", [4]), (4, "user",
                                                                                     [])):
    delta = tmp_path / f"delta-sparse-model-{step}" / sparse_files.table_dir(table)
    np.testing.assert_array_equal(np.load(delta / "keys.npy"), keys, err_msg=f"{step} {table}")
  # The full part holds every key; the chain then lacks the rare keys' later changes (by
  # design): item 8, first seen at step 3 once, is not restored.
  full = tmp_path / "sparse-model-2" / sparse_files.table_dir("item")
  assert 8 not in np.load(full / "keys.npy")
  restored, _ = _restored(paths[4], mode, recent_key_count_threshold=2)
  assert 8 not in restored["item/keys"] and 8 in states[4]["item/keys"]


def test_the_hook_saves_full_and_delta_checkpoints_on_the_init_timers(tmp_path):
  now = [0.0]
  with tf.Graph().as_default():
    model = test_saver._build("plain", seed=1, save_checkpoint_due_time=100,
                              save_delta_checkpoints_secs=10, **INCREMENTAL)
    hook = hooks.DeltaCheckpointHook(str(tmp_path), checkpoint_basename="model",
                                     clock=lambda: now[0])
    train_op = model["train_op"]
    with tf.compat.v1.train.MonitoredSession(hooks=[hook]) as sess:
      for step, t in enumerate([0, 5, 12, 30, 105, 110, 111]):
        now[0] = t
        sess.run(train_op, model["feed"](step % 4))
      state = model["read_state"](sess)
  terminate_config_initializer()
  assert hook.saved == [(1, "full"), (3, "delta"), (4, "delta"), (5, "full"), (7, "delta")]
  restored, _ = _restored(str(tmp_path))
  test_saver._assert_states_equal(restored, state)

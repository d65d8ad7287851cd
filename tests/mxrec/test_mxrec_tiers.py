"""mxRec's DDR/SSD modes: tiered tables through the mxRec Saver and the quick start.

The Saver writes a tiered table's keys, global rows, embeddings and slots from
wherever the rows live (device cache, host memory, SSD) and restores them into a
fresh graph so that training continues exactly; the quick start trains with
tiers switched on by its environment variables and restores its checkpoints.
"""

import json
import os

import numpy as np
import pytest
import tensorflow as tf

from mxrec_pipeline.core import initializers
from mxrec_pipeline.core.embedding import create_table, sparse_lookup
from mxrec_pipeline.optimizers import lazy_adam
from mxrec_pipeline.saver import saver as saver_lib
from mxrec_pipeline.util.initialize import init, terminate_config_initializer

from test_mxrec_workflows import QUICKSTART, run_example

DIM = 4
NUM_IDS = 300
INIT = initializers.RowInitializer("truncated_normal", stddev=0.1, seed=11)
SAVED_STEPS, MORE_STEPS = 15, 8
TIERS = {"device": 20, "host": 20, "ssd": 400}  # 440 rows; ~130 keys reach all three tiers


def _batches(steps, seed=0):
  """Zipf-like [4, 4] id batches over NUM_IDS ids (at most 16 distinct: fit 20 device rows)."""
  rng = np.random.default_rng(seed)
  weights = 1.0 / np.arange(1, NUM_IDS + 1)**0.8
  weights /= weights.sum()
  return [
      rng.choice(NUM_IDS, size=(4, 4), p=weights).astype(np.int64) * 3 + 1 for _ in range(steps)
  ]


BATCHES = _batches(SAVED_STEPS + MORE_STEPS)
ALL_KEYS = np.arange(NUM_IDS, dtype=np.int64) * 3 + 1


def _build(ssd_dir, dim=DIM, device=TIERS["device"], host=TIERS["host"], ssd=TIERS["ssd"],
           **init_kwargs):
  """A tiered table (host == 0: a flat one) and a dense weight, trained by placeholder ids."""
  init(**init_kwargs)
  optimizer = lazy_adam.create_hash_optimizer(0.05)
  if host:
    table = create_table(tf.int64, dim, "t", INIT, device_vocabulary_size=device,
                         host_vocabulary_size=host, ssd_vocabulary_size=ssd,
                         ssd_data_path=[ssd_dir] if ssd else [], optimizer_list=[optimizer])
  else:
    table = create_table(tf.int64, dim, "t", INIT, device_vocabulary_size=device)
  dense = tf.compat.v1.get_variable("dense", initializer=tf.linspace(0.5, 1.5, dim))
  ids = tf.compat.v1.placeholder(tf.int64, [None, None])
  emb = sparse_lookup(table, ids)
  target = tf.cast(ids % 5, tf.float32) / 5.0
  loss = tf.reduce_sum(tf.square(tf.reduce_sum(emb * dense, -1) - target))
  global_step = tf.compat.v1.train.get_or_create_global_step()
  grads = tf.gradients(loss, [dense, table.variable])
  train_op = tf.group(
      tf.compat.v1.train.AdamOptimizer(0.05).apply_gradients([(grads[0], dense)]),
      optimizer.apply_gradients([(grads[1], table.variable)], global_step=global_step))
  model = {
      "table": table, "ids": ids, "loss": loss, "train_op": train_op,
      "probe": sparse_lookup(table, tf.constant(ALL_KEYS),
                             is_train=False), "dense": dense, "global_step": global_step
  }
  if host:
    model["stats"] = table.tiers.stats()
  return model


def _train(sess, model, batches):
  return [sess.run([model["loss"], model["train_op"]], {model["ids"]: b})[0] for b in batches]


def _state(sess, model):
  """What restore must reproduce (and a failed one must leave as it was)."""
  names = ["probe", "dense", "global_step"] + (["stats"] if "stats" in model else [])
  return sess.run({name: model[name] for name in names})


@pytest.fixture(name="saved")
def fixture_saved(tmp_path):
  """Trains SAVED_STEPS steps with rows in all three tiers, saves, trains MORE_STEPS more."""
  ssd_dir = tmp_path / "ssd"
  ssd_dir.mkdir()
  with tf.Graph().as_default():
    model = _build(str(ssd_dir))
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      _train(sess, model, BATCHES[:SAVED_STEPS])
      at_save = _state(sess, model)
      path = saver.save(sess, str(tmp_path / "model-0"), global_step=model["global_step"])
      losses = _train(sess, model, BATCHES[SAVED_STEPS:])
      final = _state(sess, model)
  terminate_config_initializer()
  return {
      "path": path, "ssd_dir": str(ssd_dir), "at_save": at_save, "losses": losses, "final": final
  }


def test_saver_round_trip_through_all_three_tiers(saved, tmp_path):
  stats = saved["at_save"]["stats"]
  assert stats["swap_outs"] > 0 and stats["host_rows_used"] > 0 and stats["ssd_rows_used"] > 0
  path = saved["path"]
  assert path == str(tmp_path / f"model-0-{SAVED_STEPS}")
  # The dense part holds neither the rows, the slots, the key index nor the tiers.
  dense_names = [name for name, _ in tf.train.list_variables(path)]
  assert "dense" in dense_names and "global_step" in dense_names
  assert not [n for n in dense_names if n.startswith("t/")], dense_names

  directory = saver_lib.sparse_dir(path)
  meta = json.loads(open(os.path.join(directory, "meta.json")).read())["tables"]["t"]
  assert meta["kind"] == "tiered" and meta["dim"] == DIM and meta["capacity"] == TIERS["device"]
  assert meta["host_vocabulary_size"] == TIERS["host"]
  assert meta["ssd_vocabulary_size"] == TIERS["ssd"]
  assert meta["slots"] == ["LazyAdam/m", "LazyAdam/v"]
  files = {
      name: np.load(os.path.join(directory, "table-t", f"{name}.npy"))
      for name in ("keys", "rows", "embeddings", "slot-0", "slot-1")
  }
  keys = files["keys"]
  assert list(keys) == sorted(set(np.concatenate([b.ravel() for b in BATCHES[:SAVED_STEPS]])))
  assert files["rows"].max() >= TIERS["device"] + TIERS["host"]  # global rows, up to the SSD's
  # Every key trained: its row, whichever tier it was in, is no longer its
  # initial one, and its Adam v is positive.
  initial = INIT.rows(tf.constant(files["rows"]), DIM).numpy()
  not_trained = np.abs(files["embeddings"] - initial).max(1) == 0
  assert not not_trained.any(), f"rows saved as their initial values: {files['rows'][not_trained]}"
  assert np.all(files["slot-1"] > 0)
  # And the table reads (evaluation lookups) what was saved.
  np.testing.assert_array_equal(files["embeddings"], saved["at_save"]["probe"][(keys - 1) // 3])

  with tf.Graph().as_default():
    model = _build(saved["ssd_dir"])
    saver = saver_lib.Saver()
    tf.compat.v1.get_default_graph().finalize()  # Restore builds no ops.
    with tf.compat.v1.Session() as sess:  # No initializer: the restore initializes.
      saver.restore(sess, path)
      restored = _state(sess, model)
      np.testing.assert_array_equal(restored["probe"], saved["at_save"]["probe"])
      assert restored["global_step"] == SAVED_STEPS
      # Every saved key holds a row again: the first 20 in the cache, the rest stored.
      assert restored["stats"]["occupied"] == TIERS["device"]
      assert (restored["stats"]["host_rows_used"] +
              restored["stats"]["ssd_rows_used"] == len(keys) - TIERS["device"])
      losses = _train(sess, model, BATCHES[SAVED_STEPS:])
      final = _state(sess, model)
  np.testing.assert_allclose(losses, saved["losses"], rtol=1e-5)
  np.testing.assert_allclose(final["probe"], saved["final"]["probe"], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(final["dense"], saved["final"]["dense"], rtol=1e-5)


def test_a_delta_chain_of_a_tiered_table_restores_as_its_last_step(tmp_path):
  """Full save at step 15, deltas at 19 and 23: the chain restores the state of step 23."""
  ssd_dir = tmp_path / "ssd"
  ssd_dir.mkdir()
  with tf.Graph().as_default():
    model = _build(str(ssd_dir), is_incremental_checkpoint=True)
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      _train(sess, model, BATCHES[:SAVED_STEPS])
      saver.save(sess, str(tmp_path / "model"), global_step=model["global_step"])
      for end in (SAVED_STEPS + 4, SAVED_STEPS + MORE_STEPS):
        _train(sess, model, BATCHES[end - 4:end])
        path = saver.save(sess, str(tmp_path / "model"), global_step=model["global_step"],
                          save_delta=True)
      final = _state(sess, model)
  terminate_config_initializer()
  assert final["stats"]["ssd_rows_used"] > 0  # Rows in all three tiers.
  changed = np.load(tmp_path / f"delta-sparse-model-{SAVED_STEPS + MORE_STEPS}" / "table-t" /
                    "keys.npy")
  assert 0 < changed.size < len(set(np.concatenate([b.ravel() for b in BATCHES])))
  with tf.Graph().as_default():
    model = _build(str(ssd_dir), is_incremental_checkpoint=True)
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, path)
      restored = _state(sess, model)
  terminate_config_initializer()
  for name in ("probe", "dense", "global_step"):
    np.testing.assert_array_equal(restored[name], final[name], err_msg=name)


def test_tiered_checkpoint_restores_into_a_flat_table_and_back(saved, tmp_path):
  # Same RowInitializer: a flat table trains exactly as the tiered one.
  with tf.Graph().as_default():
    model = _build(saved["ssd_dir"], device=NUM_IDS, host=0)
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, saved["path"])
      np.testing.assert_allclose(_state(sess, model)["probe"], saved["at_save"]["probe"])
      losses = _train(sess, model, BATCHES[SAVED_STEPS:])
      flat_path = saver.save(sess, str(tmp_path / "flat"), global_step=model["global_step"])
      flat_final = _state(sess, model)
  terminate_config_initializer()
  np.testing.assert_allclose(losses, saved["losses"], rtol=1e-5)
  with tf.Graph().as_default():
    model = _build(saved["ssd_dir"])
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      saver.restore(sess, flat_path)
      np.testing.assert_allclose(_state(sess, model)["probe"], flat_final["probe"])


@pytest.mark.parametrize("case", ["too_few_rows", "other_dim"])
def test_bad_restore_names_table_and_path_and_changes_nothing(saved, case):
  directory = saver_lib.sparse_dir(saved["path"])
  with tf.Graph().as_default():
    if case == "too_few_rows":  # 40 rows in all, fewer than the saved keys
      model = _build(saved["ssd_dir"], device=20, host=20, ssd=0)
      pattern = (rf"sparse checkpoint '{directory}': \d+ keys of table 't', more than its 40 "
                 r"rows \(device_vocabulary_size=20 \+ host_vocabulary_size=20 \+ "
                 r"ssd_vocabulary_size=0\)")
    else:
      model = _build(saved["ssd_dir"], dim=DIM + 1)
      pattern = (rf"sparse checkpoint '{directory}': table 't' was saved as a tiered of dim "
                 rf"{DIM}, this graph has a tiered of dim {DIM + 1}")
    saver = saver_lib.Saver()
    with tf.compat.v1.Session() as sess:
      sess.run(tf.compat.v1.global_variables_initializer())
      _train(sess, model, BATCHES[:3])
      before = _state(sess, model)
      with pytest.raises(ValueError, match=pattern):
        saver.restore(sess, saved["path"])
      after = _state(sess, model)
      for name, value in before.items():
        if name == "stats":
          assert after[name] == value
        else:
          np.testing.assert_array_equal(after[name], value, err_msg=name)


def test_tf1_optimizer_reads_rows_after_the_swap_ins(tmp_path):
  """In a TF1 session the optimizer reads the slots of swapped-in rows only after the swap."""
  losses = []
  for device, host in ((NUM_IDS, 0), (TIERS["device"], TIERS["host"])):
    with tf.Graph().as_default():
      model = _build(str(tmp_path), device=device, host=host)
      with tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        losses.append(_train(sess, model, BATCHES[:SAVED_STEPS]))
    terminate_config_initializer()
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)


# -- the quick start -------------------------------------------------------------


@pytest.fixture(name="tier_env")
def fixture_tier_env(tmp_path, monkeypatch):
  ssd_dirs = [tmp_path / "ssd0", tmp_path / "ssd1"]
  for d in ssd_dirs:
    d.mkdir()
  # The cache holds ~2 batches' items (256 ids each) of the 1682; the host 600
  # more; the oldest spill to SSD.
  monkeypatch.setenv("DEVICE_VOCABULARY_SIZE", "600")
  monkeypatch.setenv("HOST_VOCABULARY_SIZE", "600")
  monkeypatch.setenv("SSD_VOCABULARY_SIZE", "1200")
  monkeypatch.setenv("SSD_DATA_PATH", os.pathsep.join(str(d) for d in ssd_dirs))
  monkeypatch.setenv("CACHE_POLICY", "lru")
  monkeypatch.delenv("USE_DYNAMIC_EXPANSION", raising=False)
  return ssd_dirs


@pytest.mark.slow
def test_quickstart_trains_with_tiers_and_continues_from_its_checkpoint(tier_env, tmp_path):
  model_dir = str(tmp_path / "saved-model")
  first, stdout = run_example(QUICKSTART, tmp_path, False, "--steps", "100", "--train-interval",
                              "50", "--saving-interval", "100", "--model-dir", model_dir)
  assert first["step"] == 100 and "restored" not in stdout
  assert np.isfinite(first["train_loss"]) and np.isfinite(first["eval_loss"])
  assert first["train_loss"] < 0.6  # from ~0.69
  assert first["eval_auc"] > 0.5
  items = first["tiers"]["item_table"]
  assert items["occupied"] == 600 and items["swap_outs"] > 0 and items["swap_ins"] > 0
  assert items["host_rows_used"] > 0 and items["ssd_rows_used"] > 0
  assert "item_table tiers: " in stdout
  assert not any(os.listdir(d) for d in tier_env)  # SSD files are unlinked at creation
  meta = json.loads(open(os.path.join(model_dir, "sparse-model-0-100", "meta.json")).read())
  assert {t["kind"] for t in meta["tables"].values()} == {"tiered"}

  second, stdout = run_example(QUICKSTART, tmp_path, False, "--steps", "20", "--saving-interval",
                               "20", "--model-dir", model_dir)
  assert f"restored {model_dir}/model-0-100" in stdout
  assert second["step"] == 120 and np.isfinite(second["train_loss"])
  assert sorted(p.name for p in (tmp_path / "saved-model").glob("sparse-*")) == [
      "sparse-model-0-100", "sparse-model-0-120"
  ]


def _quickstart_main():
  import importlib.util  # pylint: disable=import-outside-toplevel
  spec = importlib.util.spec_from_file_location("quickstart_main", QUICKSTART)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.main


@pytest.mark.parametrize("mode", ["USE_MODIFY_GRAPH", "USE_DYNAMIC_EXPANSION"])
def test_quickstart_refuses_tiers_with_graph_modification_or_expansion(monkeypatch, mode):
  monkeypatch.setenv("HOST_VOCABULARY_SIZE", "100")
  for name in ("USE_MODIFY_GRAPH", "USE_DYNAMIC_EXPANSION"):
    monkeypatch.setenv(name, str(int(name == mode)))
  # Refused before anything changes (the checks run before disable_eager_execution).
  with pytest.raises(SystemExit, match=rf"not supported with {mode}=1"):
    _quickstart_main()(["--steps", "1"])
  assert tf.executing_eagerly()

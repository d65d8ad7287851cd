"""mxRec's quick start (tf.compat.v1 session), ported to mxrec_pipeline.

The structure of mxRec's examples/demo main.py, on MovieLens-100k: a user
table and an item table, a two-label model, TRAIN_STEPS steps with evaluation
every TRAIN_INTERVAL steps and a checkpoint every SAVING_INTERVAL steps, and a
restore when a checkpoint exists: the run then skips the batches the
checkpoint's global step says were trained (before insertion) and trains
TRAIN_STEPS more. The only source change from mxRec is the
package name in the imports (`mx_rec` -> `mxrec_pipeline`).

Modes, as in mxRec (environment variables, 0 or 1):
  USE_MODIFY_GRAPH=1: sparse_lookup on plain id tensors + automatic graph
    modification; 0: FeatureSpecs + get_asc_insert_func + start_asc_pipeline.
  USE_DYNAMIC_EXPANSION=1: tables grow past device_vocabulary_size.

Tiers, mxRec's DDR and SSD modes (environment variables; see core/tiers.py):
  HOST_VOCABULARY_SIZE=N (default 0): N > 0 makes both tables tiered: their
    device rows become a cache in front of N host-memory rows (DDR mode). The
    sparse optimizer is then created before the tables and given to
    create_table(optimizer_list=[...]): its slots move with the rows.
  SSD_VOCABULARY_SIZE=N (default 0): N more rows on SSD (needs
    HOST_VOCABULARY_SIZE > 0).
  SSD_DATA_PATH=DIR[:DIR...] (os.pathsep-separated; default empty = the current
    directory, as mxRec): the SSD files' directories, which must exist.
  DEVICE_VOCABULARY_SIZE=N (default: 2000 users, 4000 items): overrides both
    tables' device rows, e.g. 600 to make the cache smaller than the 943 users
    and 1682 items. A training batch has up to 256 distinct ids per table and
    batches are planned ahead (prefetch): the cache should hold about two
    batches' ids (training fails naming the table if one batch does not fit).
  CACHE_POLICY=lru|lfu (default lru): which device rows make room.
  Tiers work in FeatureSpec mode without dynamic expansion: USE_MODIFY_GRAPH=1
  or USE_DYNAMIC_EXPANSION=1 with HOST_VOCABULARY_SIZE > 0 exits with an error.
  Evaluation reads rows wherever they live; the final result includes each
  table's tier statistics (`tiers`: hits, misses, swaps, host/SSD rows used).

Example: HOST_VOCABULARY_SIZE=600 SSD_VOCABULARY_SIZE=1000 DEVICE_VOCABULARY_SIZE=600 \
  python examples/mxrec_quickstart/main.py --steps 200

Run: python examples/mxrec_quickstart/main.py [--steps 200] [--model-dir DIR]
"""

import argparse
import os
import sys

import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import dataset as dataset_lib  # noqa: E402  pylint: disable=wrong-import-position
import model as model_lib  # noqa: E402  pylint: disable=wrong-import-position

from mxrec_pipeline.constants.constants import ASCEND_SPARSE_LOOKUP_ID_OFFSET  # noqa: E402
from mxrec_pipeline.constants.constants import ASCEND_SPARSE_LOOKUP_LOCAL_EMB  # noqa: E402
from mxrec_pipeline.core.asc.feature_spec import FeatureSpec  # noqa: E402
from mxrec_pipeline.core.asc.helper import get_asc_insert_func  # noqa: E402
from mxrec_pipeline.core.asc.manager import start_asc_pipeline  # noqa: E402
from mxrec_pipeline.core.embedding import create_table, sparse_lookup  # noqa: E402
from mxrec_pipeline.graph.modifier import get_initializer  # noqa: E402
from mxrec_pipeline.graph.modifier import modify_graph_and_start_emb_cache  # noqa: E402
from mxrec_pipeline.optimizers import lazy_adam, lazy_adam_by_addr  # noqa: E402
from mxrec_pipeline.saver.saver import Saver  # noqa: E402
from mxrec_pipeline.util.initialize import init, terminate_config_initializer  # noqa: E402
from mxrec_pipeline.util.variable import get_dense_and_sparse_variable  # noqa: E402

BATCH_SIZE = 256
EVAL_STEPS = 20
USER_VOCAB, ITEM_VOCAB = 2000, 4000
DIM = 16


def make_batch_and_iterator(is_training, feature_spec_list, modify_graph, dump_graph=False,
                            num_batches=None, skip_batches=0):
  dataset = dataset_lib.generate_dataset(is_training, BATCH_SIZE)
  # A resumed run skips the batches its checkpoint has trained, before insertion:
  # skipped batches insert no ids, and training continues at the next batch.
  dataset = dataset.skip(skip_batches)
  if num_batches is not None:
    # Tiered tables: insertion plans no batch past the last step, so no plan
    # is left waiting for device-cache room that only training would free.
    dataset = dataset.take(num_batches)
  if not modify_graph:
    insert_fn = get_asc_insert_func(tgt_key_specs=feature_spec_list, is_training=is_training,
                                    dump_graph=dump_graph)
    dataset = dataset.map(insert_fn)
  dataset = dataset.prefetch(10)
  iterator = tf.compat.v1.data.make_initializable_iterator(dataset)
  return iterator.get_next(), iterator


def build_graph(tables, is_train, feature_spec_list, modify_graph, num_batches=None,
                skip_batches=0):
  batch, iterator = make_batch_and_iterator(is_train, feature_spec_list, modify_graph,
                                            num_batches=num_batches, skip_batches=skip_batches)
  ids = [batch["user_ids"], batch["item_ids"]] if modify_graph else feature_spec_list
  user_emb, item_emb = [
      sparse_lookup(table, feature, send_count=BATCH_SIZE, is_train=is_train,
                    name=f"{table.table_name}_lookup", modify_graph=modify_graph, batch=batch)
      for feature, table in zip(ids, tables)
  ]
  with tf.compat.v1.variable_scope("model", reuse=tf.compat.v1.AUTO_REUSE):
    loss, pred_0, pred_1 = model_lib.my_model(user_emb, item_emb, batch["label_0"],
                                              batch["label_1"])
  return iterator, loss, (batch["label_0"], pred_0)


def _env_int(name: str, default: int) -> int:
  value = os.getenv(name, "").strip()
  if not value:
    return default
  try:
    return int(value)
  except ValueError:
    raise SystemExit(f"mxrec_quickstart: environment variable {name} must be an integer, "
                     f"got {value!r}") from None


def tier_settings() -> dict:
  """The tier environment variables (module docstring) as create_table arguments.

  Returns:
    {"device_vocabulary_size": int or None (no override)} plus, when
    HOST_VOCABULARY_SIZE > 0, host_vocabulary_size, ssd_vocabulary_size,
    ssd_data_path (list of str; empty: the current directory) and cache_policy.
  """
  settings = {"device_vocabulary_size": _env_int("DEVICE_VOCABULARY_SIZE", 0) or None}
  host = _env_int("HOST_VOCABULARY_SIZE", 0)
  ssd = _env_int("SSD_VOCABULARY_SIZE", 0)
  if host or ssd:  # An SSD tier alone, or negative sizes: create_table says what is wrong.
    settings.update(
        host_vocabulary_size=host, ssd_vocabulary_size=ssd,
        ssd_data_path=[p for p in os.getenv("SSD_DATA_PATH", "").split(os.pathsep) if p],
        cache_policy=os.getenv("CACHE_POLICY", "lru").strip() or "lru")
  return settings


def main(argv=None) -> dict:
  """Runs the quick start; returns the last evaluation (step, losses, AUC).

  With tiers on (HOST_VOCABULARY_SIZE > 0), the result also holds `tiers`:
  per table the tier statistics at the end (core/tiers.py STATS_NAMES).

  Raises:
    SystemExit: tiers with USE_MODIFY_GRAPH=1 or USE_DYNAMIC_EXPANSION=1, or a
      tier environment variable that is not an integer.
  """
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--steps", type=int, default=200, help="TRAIN_STEPS")
  parser.add_argument("--train-interval", type=int, default=100, help="evaluate every N steps")
  parser.add_argument("--saving-interval", type=int, default=100, help="save every N steps")
  parser.add_argument("--model-dir", default="./saved-model", help="checkpoint directory")
  args = parser.parse_args(argv)
  modify_graph = bool(int(os.getenv("USE_MODIFY_GRAPH", "0")))
  use_dynamic_expansion = bool(int(os.getenv("USE_DYNAMIC_EXPANSION", "0")))
  tier_args = tier_settings()
  device_vocabulary_size = tier_args.pop("device_vocabulary_size")
  tiered = bool(tier_args)
  if tiered and (modify_graph or use_dynamic_expansion):
    raise SystemExit(
        "mxrec_quickstart: HOST_VOCABULARY_SIZE/SSD_VOCABULARY_SIZE > 0 (tiered tables) is not "
        "supported with " +
        " or ".join(name
                    for name, on in (("USE_MODIFY_GRAPH=1", modify_graph),
                                     ("USE_DYNAMIC_EXPANSION=1", use_dynamic_expansion)) if on) +
        "; run tiers in FeatureSpec mode (USE_MODIFY_GRAPH=0, USE_DYNAMIC_EXPANSION=0)")

  tf.compat.v1.disable_eager_execution()
  tf.compat.v1.set_random_seed(model_lib.SEED)
  init(train_steps=args.steps, eval_steps=EVAL_STEPS, use_dynamic_expansion=use_dynamic_expansion)
  train_specs = [
      FeatureSpec("user_ids", table_name="user_table", feat_count=1),
      FeatureSpec("item_ids", table_name="item_table", feat_count=1)
  ]
  eval_specs = [
      FeatureSpec("user_ids", table_name="user_table", feat_count=1),
      FeatureSpec("item_ids", table_name="item_table", feat_count=1)
  ]
  sparse_optimizer = None
  if tiered:
    # mxRec's DDR/SSD modes: the optimizer is known when the tables are
    # created, its slots moving between the tiers with the rows.
    sparse_optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.001)
    tier_args["optimizer_list"] = [sparse_optimizer]
  tables = [
      create_table(
          key_dtype=tf.int64, dim=tf.TensorShape([DIM]), name=name,
          emb_initializer=tf.compat.v1.truncated_normal_initializer(stddev=0.05,
                                                                    seed=model_lib.SEED + i),
          device_vocabulary_size=device_vocabulary_size or vocab, **tier_args)
      for i, (name, vocab) in enumerate((("user_table", USER_VOCAB), ("item_table", ITEM_VOCAB)))
  ]
  # The latest checkpoint's global step: the batches already trained.
  latest = tf.train.latest_checkpoint(args.model_dir)
  trained_batches = int(tf.train.load_variable(latest, "global_step")) if latest else 0
  train_iterator, train_loss, _ = build_graph(tables, True, train_specs, modify_graph,
                                              num_batches=args.steps if tiered else None,
                                              skip_batches=trained_batches)
  eval_iterator, eval_loss, (eval_label, eval_pred) = build_graph(tables, False, eval_specs,
                                                                  modify_graph)
  dense_variables, sparse_variables = get_dense_and_sparse_variable()
  dense_optimizer = tf.compat.v1.train.AdamOptimizer(0.001)
  global_step = tf.compat.v1.train.get_or_create_global_step()
  dense_op = dense_optimizer.apply_gradients(
      zip(tf.gradients(train_loss, dense_variables), dense_variables))
  if use_dynamic_expansion:
    # mxRec's convention: by-address optimizers take the gradients of the
    # looked-up embeddings, paired with their row addresses.
    sparse_optimizer = lazy_adam_by_addr.create_hash_optimizer_by_address(learning_rate=0.001)
    local_embeddings = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_LOCAL_EMB)
    addresses = tf.compat.v1.get_collection(ASCEND_SPARSE_LOOKUP_ID_OFFSET)
    sparse_op = sparse_optimizer.apply_gradients(
        zip(tf.gradients(train_loss, local_embeddings), addresses), global_step=global_step)
  else:
    if sparse_optimizer is None:
      sparse_optimizer = lazy_adam.create_hash_optimizer(learning_rate=0.001)
    sparse_op = sparse_optimizer.apply_gradients(
        zip(tf.gradients(train_loss, sparse_variables), sparse_variables), global_step=global_step)
  train_op = tf.group(dense_op, sparse_op)
  auc, auc_update = tf.compat.v1.metrics.auc(eval_label, eval_pred)
  saver = Saver()  # Dense checkpoint plus sparse-model-0-<step>/ beside it.
  tier_stats = {t.table_name: t.tiers.stats() for t in tables if t.tiers is not None}

  if modify_graph:
    modify_graph_and_start_emb_cache(dump_graph=True)
  else:
    start_asc_pipeline()

  os.makedirs(args.model_dir, exist_ok=True)
  save_path = os.path.join(args.model_dir, "model-0")
  with tf.compat.v1.Session() as sess:
    sess.run(tf.compat.v1.global_variables_initializer())
    if latest:
      saver.restore(sess, latest)
      print(
          f"restored {latest}: resuming at step {trained_batches}, after the "
          f"{trained_batches} batches it trained", flush=True)
    sess.run(get_initializer(True) if modify_graph else train_iterator.initializer)
    start = sess.run(global_step)
    loss, result = None, {}
    for step in range(start + 1, start + args.steps + 1):
      loss, _ = sess.run([train_loss, train_op])
      if step % args.train_interval == 0 or step == start + args.steps:
        sess.run(tf.compat.v1.local_variables_initializer())
        sess.run(get_initializer(False) if modify_graph else eval_iterator.initializer)
        eval_losses = []
        for _ in range(EVAL_STEPS):
          value, _ = sess.run([eval_loss, auc_update])
          eval_losses.append(value)
        result = {
            "step": step, "train_loss": float(loss),
            "eval_loss": float(sum(eval_losses) / len(eval_losses)),
            "eval_auc": float(sess.run(auc))
        }
        print(
            f"step {step}: train loss {loss:.4f}, eval loss {result['eval_loss']:.4f}, "
            f"eval auc {result['eval_auc']:.4f}", flush=True)
      if step % args.saving_interval == 0:
        saver.save(sess, save_path, global_step=step)
    if tier_stats:
      tier_values = sess.run(tier_stats)
      result["tiers"] = {
          name: {k: int(v) for k, v in stats.items()} for name, stats in tier_values.items()
      }
      for name, stats in result["tiers"].items():
        print(f"{name} tiers: " + ", ".join(f"{k} {v}" for k, v in stats.items()), flush=True)
  terminate_config_initializer()
  return result


if __name__ == "__main__":
  main()

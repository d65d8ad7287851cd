"""Trains the keras_testlib task in a process of its own, for restart tests.

  python resume_worker.py TASK_DIR MODEL_DIR OUT_JSON [--epochs E] [--steps N]
      [--kill-at EPOCH:BATCH] [--no-resume] [--tiered-ssd-dir DIR] [--export-best]
      [--full-every N]

Writes OUT_JSON: per-epoch training losses of this process, the optimizers'
iterations, and, per table, the sorted (key, row) pairs of the key index with
the rows' values and lazy Adam slots; dense weights too. With --kill-at the
process SIGKILLs itself after that training batch (0-based epoch and batch);
MXREC_FAULT (util/faults.py) kills it at a named fault point. Exits 2 with the
error on stderr where the CLI would (a refused resume, a full disk).
"""

import argparse
import json
import os
import signal
import sys

import numpy as np
import tensorflow as tf

import keras_testlib as lib
from mxrec_pipeline.keras import pipeline as pipeline_lib
from mxrec_pipeline.util import initialize


class KillAt(tf.keras.callbacks.Callback):
  """SIGKILLs the process after training batch `batch` of epoch `epoch`."""

  def __init__(self, epoch: int, batch: int):
    super().__init__()
    self.kill_epoch, self.kill_batch, self.epoch = epoch, batch, None

  def on_epoch_begin(self, epoch, logs=None):
    self.epoch = epoch

  def on_train_batch_end(self, batch, logs=None):
    if self.epoch == self.kill_epoch and batch == self.kill_batch:
      os.kill(os.getpid(), signal.SIGKILL)


class FillDisk(tf.keras.callbacks.Callback):
  """Fills the filesystem of `path` after the validation of epoch `epoch` (0-based)."""

  def __init__(self, epoch: int, path: str):
    super().__init__()
    self.fill_epoch, self.path, self.epoch = epoch, path, None

  def on_epoch_begin(self, epoch, logs=None):
    self.epoch = epoch

  def on_test_end(self, logs=None):
    if self.epoch != self.fill_epoch:
      return
    try:
      with open(self.path, "wb", buffering=0) as f:
        while True:
          f.write(b"\0" * 4096)
    except OSError:  # Full.
      pass


def state(model) -> dict:
  """Every table's sorted keys with their rows and slots, and the dense weights."""
  out = {
      "iterations": int(model.optimizer.iterations.numpy()),
      "sparse_iterations": int(model.sparse_optimizer.iterations.numpy()), "tables": {},
      "dense": [w.tolist() for w in model.get_weights()]
  }
  for name, table in initialize.get_config_initializer().tables.items():
    keys, rows = (t.numpy() for t in table.key_index.export())
    order = np.argsort(keys)
    keys, rows = keys[order], rows[order]
    out["tables"][name] = {"keys": keys.tolist(), "rows": rows.tolist()}
    if table.is_tiered:  # Rows with their slots, wherever they live, and the tiers' counters.
      whole = table.tiers.read_rows(table.variable, tf.constant(rows, tf.int64)).numpy()
      dim = table.variable.shape[1]
      out["tables"][name] |= {
          "values": whole[:, :dim].tolist(),
          "slots": {"m": whole[:, dim:2 * dim].tolist(), "v": whole[:, 2 * dim:].tolist()},
          "tier_stats": {k: int(v) for k, v in table.tiers.stats().items()}
      }
    else:
      out["tables"][name] |= {
          "values": table.variable.numpy()[rows].tolist(), "slots": {
              slot: model.sparse_optimizer.get_slot(name, slot).numpy()[rows].tolist()
              for slot in ("m", "v")
          }
      }
  return out


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("task_dir")
  parser.add_argument("model_dir")
  parser.add_argument("out_json")
  parser.add_argument("--epochs", type=int, default=3)
  parser.add_argument("--steps", type=int)
  parser.add_argument("--kill-at")
  parser.add_argument("--no-resume", action="store_true")
  parser.add_argument("--tiered-ssd-dir", help="tier the item table, SSD files here")
  parser.add_argument("--fill-disk-at", metavar="EPOCH:PATH",
                      help="fill PATH's filesystem after the validation of that epoch (0-based)")
  parser.add_argument("--export-best", action="store_true",
                      help="export_best_model by validation loss")
  parser.add_argument("--full-every", type=int, default=1,
                      help="pipeline.checkpoint.full_every_epochs (delta checkpoints between)")
  parser.add_argument("--checkpoint", type=json.loads,
                      help="pipeline.checkpoint as JSON (instead of --full-every)")
  args = parser.parse_args()
  train, valid = (os.path.join(args.task_dir, f) for f in ("train.tfrecord", "valid.tfrecord"))
  hparams = pipeline_lib.PipelineHparams(
      model_dir=args.model_dir, num_epochs=args.epochs, num_train_steps=args.steps,
      learning_rate=0.05, seed=7, resume=not args.no_resume, export_best_model=args.export_best,
      best_exporter_metric="loss", best_exporter_metric_higher_better=False,
      checkpoint=args.checkpoint or {"full_every_epochs": args.full_every})
  if args.tiered_ssd_dir:  # Batches of 2 lists: each batch's items fit the 12 device rows.
    model_builder = lib.model_builder(tables=lib.tiered_tables(args.tiered_ssd_dir))
    datasets = lib.dataset_builder(train, valid, train_batch_size=2)
  else:
    model_builder, datasets = lib.model_builder(), lib.dataset_builder(train, valid)
  pipe = pipeline_lib.SimplePipeline(model_builder, datasets, hparams)
  extra = []
  if args.kill_at:
    extra.append(KillAt(*(int(v) for v in args.kill_at.split(":"))))
  if args.fill_disk_at:
    epoch, path = args.fill_disk_at.split(":", 1)
    extra.append(FillDisk(int(epoch), path))
  try:
    metrics = pipe.train_and_validate(callbacks=extra)
  except FileExistsError as e:
    print(f"refused: {e}", file=sys.stderr)
    return 3
  except (ValueError, OSError) as e:  # What the CLI reports with exit status 2.
    print(f"error: {e}", file=sys.stderr)
    return 2
  history = pipe.history.history
  with open(args.out_json, "w", encoding="utf-8") as f:
    json.dump(
        {
            "loss": history.get("loss", []), "epochs": pipe.history.epoch, "metrics": metrics,
            **state(pipe.model)
        }, f)
  return 0


if __name__ == "__main__":
  sys.exit(main())

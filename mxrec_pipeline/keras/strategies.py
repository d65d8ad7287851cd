"""The Keras pipeline's strategy and where its tables live: the one place that decides.

`get_strategy` builds the tf.distribute strategy PipelineHparams.strategy names;
`placement_for` (core/placement.table_placement) decides once, from the
strategy, where a run's tables live (`TablePlacement`): in this process (one
host, any number of replicas), sharded by key over MultiWorkerMirroredStrategy
workers (keras/sharded.py), or over the ps tasks of ParameterServerStrategy
(keras/ps.py). The pipeline branches on the placement, never on the strategy's
type. See docs/distributed.md.
"""

from __future__ import annotations

import tensorflow as tf

from mxrec_pipeline.core import placement
from mxrec_pipeline.hparams import MULTI_WORKER_MIRRORED, PARAMETER_SERVER, STRATEGIES

TablePlacement = placement.TablePlacement


def placement_for(strategy: tf.distribute.Strategy, sparse_features: bool) -> TablePlacement:
  """Where the tables of a run under `strategy` live: core/placement.table_placement."""
  return placement.table_placement(strategy, sparse_features)


def splits_batches(strategy: tf.distribute.Strategy, placement: TablePlacement,
                   sparse_features: bool) -> bool:
  """Whether each inserted global batch is split per replica (one host, N > 1, sparse features).

  See core/asc/replicas.py.
  """
  return (placement is TablePlacement.ONE_HOST and strategy.num_replicas_in_sync > 1 and
          sparse_features)


def mirrored_devices(gpus: list[str], cpus: list[str], rows_on_gpu: bool) -> list[str]:
  """The devices of PipelineHparams.strategy "MirroredStrategy"; [] for the default strategy.

  Every GPU, else every logical CPU. One GPU whose device has no kernels for
  the table rows' in-place updates (`rows_on_gpu` false: today's CPU-only
  native kernels) gives [] instead: a single replica needs no mirroring, and
  without a strategy the tables stay on the host while the dense model runs
  on the GPU (core/placement.py). Several such GPUs stay a MirroredStrategy,
  whose tables create_table then refuses, naming the fix.
  """
  if len(gpus) == 1 and not rows_on_gpu:
    return []
  return gpus or cpus


def get_strategy(name: str | None,
                 collective_timeout_s: float | None = None) -> tf.distribute.Strategy:
  """The strategy of PipelineHparams.strategy (hparams.STRATEGIES).

  None -> the default strategy; "MirroredStrategy" -> every local GPU, else
  every logical CPU (one unless the process split the CPU with
  `tf.config.set_logical_device_configuration` before TensorFlow started, as
  the replica tests do), see `mirrored_devices` for one GPU; "MultiWorkerMirroredStrategy" ->
  tf.distribute.MultiWorkerMirroredStrategy over the cluster of the TF_CONFIG
  environment variable (jobs.train checks it first with
  mxrec_pipeline.cluster.tf_config), its collective ops failing after
  `collective_timeout_s` seconds without their peers
  (CommunicationOptions.timeout_seconds; None: no timeout);
  "ParameterServerStrategy" -> tf.distribute.experimental.ParameterServerStrategy
  over the TF_CONFIG cluster (this process is its chief, the coordinator;
  jobs.train first waits until every ps and worker task is reachable).

  Raises:
    ValueError: an unknown name.
  """
  if name is None:
    return tf.distribute.get_strategy()
  if name == "MirroredStrategy":
    devices = mirrored_devices([d.name for d in tf.config.list_logical_devices("GPU")],
                               [d.name for d in tf.config.list_logical_devices("CPU")],
                               placement.accelerator_holds_rows())
    return tf.distribute.MirroredStrategy(devices) if devices else tf.distribute.get_strategy()
  if name == MULTI_WORKER_MIRRORED:
    options = tf.distribute.experimental.CommunicationOptions(timeout_seconds=collective_timeout_s)
    return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options)
  if name == PARAMETER_SERVER:
    return tf.distribute.experimental.ParameterServerStrategy(
        tf.distribute.cluster_resolver.TFConfigClusterResolver())
  raise ValueError(f"unknown strategy {name!r}; supported: {list(STRATEGIES)}")

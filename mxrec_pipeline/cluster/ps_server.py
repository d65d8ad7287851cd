"""A ps or worker task of ParameterServerStrategy: `python -m mxrec_pipeline.cluster.ps_server`.

Under ParameterServerStrategy the "ps" and "worker" tasks run no Python
training code: they start a `tf.distribute.Server` and execute what the
coordinator (the chief) sends them, as in TF's "Parameter server training with
ParameterServerStrategy" tutorial. Our tables' key index is a native
resource (the MxKeyIndex* ops of mxrec_pipeline/ops): its kernels must be
registered in the task's process BEFORE the server starts, so this entry
point loads the op library first, then serves until killed.

The task reads its cluster and its own job/index from TF_CONFIG (validated by
cluster/tf_config.parse, which names the key or task at fault).

Raises (exits non-zero with the message):
  TFConfigError: TF_CONFIG missing or malformed, or this task is not a "ps"
    or "worker" task, or the cluster has no "ps" job.
  ImportError: the op library is missing or built for another TensorFlow.
"""

from __future__ import annotations

import os
import sys

from mxrec_pipeline.cluster import tf_config

SERVED_JOBS = (tf_config.PS, tf_config.WORKER)


def check_ps_config(config: tf_config.TFConfig) -> None:
  """Raises TFConfigError unless `config` is a ps/worker task of a cluster with a "ps" job."""
  if config.task_type not in SERVED_JOBS:
    raise tf_config.TFConfigError(
        f"ps_server: task {config.task_name} is not a {' or '.join(SERVED_JOBS)} task; the "
        "chief (coordinator) runs the training program itself")
  if not config.cluster.get(tf_config.PS):
    raise tf_config.TFConfigError(
        f"ps_server: task {config.task_name}: the cluster has no \"ps\" job (jobs: "
        f"{sorted(config.cluster)}); ParameterServerStrategy needs at least one ps task")


def main() -> int:
  try:
    config = tf_config.parse(os.environ.get(tf_config.ENV_VAR, ""))
    check_ps_config(config)
  except tf_config.TFConfigError as e:
    print(f"ps_server: {e}", file=sys.stderr)
    return 2
  # pylint: disable=import-outside-toplevel
  import tensorflow as tf

  from mxrec_pipeline import ops
  ops.load()  # Kernels of the key index exist in this process before the server starts.
  resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
  try:
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=config.task_type,
                                  task_index=config.task_index, protocol=config.rpc_layer or "grpc",
                                  start=True)
  except tf.errors.UnknownError as e:  # "Could not start gRPC server": the port is taken.
    print(f"ps_server: {config.server_start_error(e.message)}", file=sys.stderr)
    return 2
  print(f"ps_server: {config.task_name} serving at {config.address}", flush=True)
  server.join()
  return 0


if __name__ == "__main__":
  sys.exit(main())

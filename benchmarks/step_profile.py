"""Where the time of Keras training steps goes, from a tf.profiler trace.

`ProfileSteps` (a Keras callback) traces some training steps of one epoch with
`tf.profiler.experimental`; `summarize` reads the trace it wrote (the XSpace
protobuf of TensorFlow's profiler, parsed with the `xplane_pb2` module TF ships,
no TensorBoard plugin needed) and sums the durations of the TensorFlow ops of
those steps by stage (`STAGES`), per step:

  input: parsing       tf.data ops that decode the ELWC records (ParseExampleV2, ...);
  input: ids           tf.data ops of the id features: our key-index insertion
                       (MxKeyIndex*, StringToHashBucketFast) or the dense
                       pipeline's IntegerLookup/StringLookup when it runs there;
  input: other         the other ops of tf.data's functions (ragged, masks);
  forward: lookups     ops under a lookup's name scope (`sparse_lookup_*`,
                       Keras `embedding*`, `*_lookup`) outside the gradient;
  forward: dense       the model's other forward ops;
  backward: lookups    gradient ops of lookups (segment sums of the id gradients);
  backward: dense      the other gradient ops;
  optimizer: sparse    ops under the hash optimizer's name scope (MxLazyAdamRows);
  optimizer: dense     ops under the Keras optimizer's name scope;
  loss and metrics     the rest (loss, tfr's ranking metrics).

Op durations are summed over every thread, so a stage's figure is close to the
CPU time its ops took (ops that wait for a core on a loaded machine count their
wait too). `wall_ms` is the median wall time of a traced step and
`input_wait_ms` the mean time a step waited for its batch from tf.data
(IteratorGetNext), i.e. what the input pipeline added to the step.
"""

from __future__ import annotations

import collections
import glob
import os
import statistics
import time

STAGES = ("input: parsing", "input: ids", "input: other", "forward: lookups", "forward: dense",
          "backward: lookups", "backward: dense", "optimizer: sparse", "optimizer: dense",
          "loss and metrics")

_PARSING_OPS = ("ParseExample", "ParseSequenceExample", "DecodeProto", "ParseSingleExample")
_ID_OPS = ("MxKeyIndex", "MxDeviceCache", "StringToHashBucket", "LookupTableFind",
           "LookupTableSize")
TOP_OPS = 25  # (stage, op type, layer) entries summarize returns, largest first.
_WAIT_EVENTS = ("IteratorGetNextAsOptionalOp::DoCompute", "IteratorGetNextOp::DoCompute")


def profile_callback(logdir: str, epoch: int, steps: int, skip: int = 10):
  """A Keras callback tracing `steps` training steps of `epoch`, after `skip` of them.

  Args:
    logdir: Where tf.profiler writes the trace.
    epoch: 0-based epoch whose steps are traced (>= 1: the first traces the
      train function).
    steps: Steps to trace, > 0.
    skip: Steps of the epoch not traced first: the epoch's start (a new
      iterator filling its prefetch buffers) is not a steady step.

  Returns:
    A tf.keras.callbacks.Callback; after training its `summary()` returns
    `summarize`'s result for the traced steps.
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel

  class ProfileSteps(tf.keras.callbacks.Callback):
    """Traces `steps` steps of `epoch` after `skip`; records their wall times."""

    def __init__(self):
      super().__init__()
      self.step_seconds: list[float] = []
      self._epoch = -1
      self._seen = 0
      self._on = False
      self._last = None

    def on_epoch_begin(self, epoch_now, logs=None):
      self._epoch, self._seen = epoch_now, 0

    def on_train_batch_end(self, batch, logs=None):
      now = time.perf_counter()
      if self._on:
        self.step_seconds.append(now - self._last)
        if len(self.step_seconds) == steps:
          tf.profiler.experimental.stop()
          self._on = False
      self._seen += 1
      if self._epoch == epoch and self._seen == skip and not self.step_seconds:
        tf.profiler.experimental.start(logdir)
        self._on = True
      self._last = time.perf_counter()

    def on_epoch_end(self, epoch_now, logs=None):
      if self._on:  # The epoch had fewer steps.
        tf.profiler.experimental.stop()
        self._on = False

    def summary(self) -> dict:
      optimizers = [self.model.optimizer]
      if getattr(self.model, "sparse_optimizer", None) is not None:
        optimizers.append(self.model.sparse_optimizer)
      names = [_scope_name(o) for o in optimizers]
      return summarize(logdir, self.step_seconds, self.model.name, dense_optimizer=names[0],
                       sparse_optimizer=names[1] if len(names) > 1 else None)

  return ProfileSteps()


def _scope_name(optimizer) -> str:
  """The name scope of an optimizer's ops: a hash optimizer's name, or a Keras one's."""
  for attr in ("optimizer_name", "name", "_name"):  # Keras' legacy optimizers: _name.
    value = getattr(optimizer, attr, None)
    if isinstance(value, str):
      return value
  return type(optimizer).__name__


def stage_of(thread: str, op_name: str, model_scope: str, dense_optimizer: str,
             sparse_optimizer: str | None) -> str:
  """The stage (one of STAGES) of the op event `op_name` ("scope/name:Type") on `thread`."""
  scope, op_type = op_name.rsplit(":", 1)
  if thread.startswith("tf_data"):
    if op_type.startswith(_PARSING_OPS):
      return "input: parsing"
    if op_type.startswith(_ID_OPS):
      return "input: ids"
    return "input: other"
  root = scope.split("/", 1)[0]
  if sparse_optimizer and root == sparse_optimizer:
    return "optimizer: sparse"
  if root == dense_optimizer:
    return "optimizer: dense"
  parts = scope.split("/")
  lookup = any(p.startswith(("sparse_lookup", "embedding")) or p.endswith("_lookup") for p in parts)
  if root == "gradient_tape":
    return "backward: lookups" if lookup else "backward: dense"
  if root == model_scope:
    return "forward: lookups" if lookup else "forward: dense"
  return "loss and metrics"


def summarize(logdir: str, step_seconds: list[float], model_scope: str, dense_optimizer: str,
              sparse_optimizer: str | None = None) -> dict:
  """Per-step milliseconds by stage of the newest trace under `logdir`.

  Args:
    logdir: The profiler's log directory.
    step_seconds: Wall seconds of the traced steps.
    model_scope: The model's name (its ops' top name scope).
    dense_optimizer, sparse_optimizer: Name scopes of the optimizers.

  Returns:
    {"steps", "wall_ms" (median), "input_wait_ms" (mean), "op_ms" (sum of
    the stages), "stages": {stage: ms per step}, "top_ops": the TOP_OPS
    largest [stage, "OpType in layer", ms per step], largest first}.

  Raises:
    FileNotFoundError: no trace under logdir.
  """
  from tensorflow.tsl.profiler.protobuf import xplane_pb2  # pylint: disable=import-outside-toplevel
  paths = sorted(glob.glob(os.path.join(logdir, "plugins", "profile", "*", "*.xplane.pb")))
  if not paths or not step_seconds:
    raise FileNotFoundError(f"no profiler trace of training steps under {logdir}")
  space = xplane_pb2.XSpace()
  with open(paths[-1], "rb") as f:
    space.ParseFromString(f.read())
  stages = collections.Counter({stage: 0 for stage in STAGES})
  by_op = collections.Counter()  # (stage, op type, scope of the lookup or layer) -> ps
  wait_ps = 0
  for plane in space.planes:
    if plane.name != "/host:CPU":
      continue
    for line in plane.lines:
      # Op events are on TF's threads (tf_Compute, tf_data_*): the Python
      # thread's events are whole function calls.
      if not line.name.startswith("tf_"):
        continue
      for event in line.events:
        name = plane.event_metadata[event.metadata_id].name
        if name in _WAIT_EVENTS:
          wait_ps += event.duration_ps
        elif ":" in name and "::" not in name and not name.startswith("RemoteCall"):
          stage = stage_of(line.name, name, model_scope, dense_optimizer, sparse_optimizer)
          stages[stage] += event.duration_ps
          by_op[(stage, _op_key(name))] += event.duration_ps
  steps = len(step_seconds)
  per_step = {stage: ps / 1e9 / steps for stage, ps in stages.items()}
  top = [[stage, op, ps / 1e9 / steps] for (stage, op), ps in by_op.most_common(TOP_OPS)]
  return {
      "steps": steps, "wall_ms": 1000 * statistics.median(step_seconds),
      "input_wait_ms": wait_ps / 1e9 / steps, "op_ms": sum(per_step.values()), "stages": per_step,
      "top_ops": top
  }


def _op_key(op_name: str) -> str:
  """"Type in layer" of an op event "scope/.../name:Type": its type and first model layer.

  The layer is the scope part after the model's (or the gradient tape's) own
  scope, so the ops of one layer's lookup or combiner add up across steps.
  """
  scope, op_type = op_name.rsplit(":", 1)
  parts = scope.split("/")
  layer = parts[1] if len(parts) > 2 else parts[0]
  return f"{op_type} in {layer}"

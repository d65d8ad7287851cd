"""A variable of this process alone, even inside a tf.distribute strategy's scope.

Keras runs callbacks (hence exports) inside the strategy's scope, where
`tf.Variable` makes a MirroredVariable under MultiWorkerMirroredStrategy (its
initial value broadcast from the chief: a collective every worker must join)
or places it on a ps task under ParameterServerStrategy. An export's serving
rows and keys belong to the exporting process only: `local_variable` builds a
plain ResourceVariable on this process's device, bypassing the strategy's
variable creator (TF applies creators to `tf.Variable(...)` calls only).
"""

from __future__ import annotations

import tensorflow as tf
# The concrete class of tf.Variable: constructing it directly skips the variable creators.
from tensorflow.python.ops import resource_variable_ops  # pylint: disable=g-direct-tensorflow-import


def local_variable(initial_value, name: str) -> tf.Variable:
  """A non-trainable variable of this process (eagerly): initial_value a value or a callable."""
  return resource_variable_ops.ResourceVariable(initial_value, trainable=False, name=name)

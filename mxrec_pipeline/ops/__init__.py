"""Loads the native op library (native/ built against the installed TensorFlow).

The library is loaded lazily, on first use, so importing `mxrec_pipeline` (or a
SavedModel it exported) never needs it.
"""

import functools
import pathlib

import tensorflow as tf

_LIBRARY = pathlib.Path(__file__).with_name("_mxrec_ops.so")
_BUILT_FOR = _LIBRARY.with_suffix(".tf_version")


@functools.lru_cache(maxsize=None)
def load():
  """Returns the op module of `_mxrec_ops.so` (the `MxKeyIndex*` ops).

  Raises:
    ImportError: the library is missing or was built for another TensorFlow;
      the message says how to rebuild it.
  """
  running = tf.__version__
  if not _LIBRARY.exists():
    raise ImportError(f"native ops not built: {_LIBRARY} is missing. Build them with `make native` "
                      f"(or `pip install -e .`) for the running TensorFlow {running}.")
  built = _BUILT_FOR.read_text().strip() if _BUILT_FOR.exists() else "unknown"
  if built != running:
    raise ImportError(f"{_LIBRARY.name} was built for TensorFlow {built}, running {running}; "
                      "rebuild with `make native` (or `pip install -e .`).")
  try:
    return tf.load_op_library(str(_LIBRARY))
  except tf.errors.NotFoundError as e:
    raise ImportError(f"cannot load {_LIBRARY}: {e}. Rebuild with `make native` "
                      f"(built for TensorFlow {built}, running {running}).") from e

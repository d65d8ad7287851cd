"""Storage that runs out: a full disk during a checkpoint or an export, told in one line.

`StorageFullError` (an OSError; the CLI exits 2 with its message) replaces
the error a write raises when its filesystem is full (ENOSPC), over quota
(EDQUOT) or past the process's file-size limit (EFBIG), from Python (OSError)
or from TensorFlow's file layer (an OpError whose message says so). The
module imports TensorFlow only when it checks an error, so the CLI can catch
StorageFullError without importing it.
"""

from __future__ import annotations

import contextlib
import errno
from typing import Iterator

_FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
_FULL_MESSAGES = ("No space left on device", "Disk quota exceeded", "File too large")


class StorageFullError(OSError):
  """A write failed because its storage is full; names the path and what stays intact."""


def is_full(error: BaseException) -> bool:
  """Whether `error` says the storage written to is full (see the module docstring)."""
  if isinstance(error, OSError) and error.errno in _FULL_ERRNOS:
    return True
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  if isinstance(error, tf.errors.OpError):
    return any(text in error.message for text in _FULL_MESSAGES)
  return False


@contextlib.contextmanager
def full_storage_named(what: str, path: str, intact: str) -> Iterator[None]:
  """Turns a full-storage error inside into StorageFullError naming `what`, `path` and `intact`.

  Args:
    what: What was being written, e.g. "checkpoint ckpt-4".
    path: Where.
    intact: What the failure left as it was, e.g. "the previous checkpoint ckpt-3 is intact".

  Raises:
    StorageFullError: the storage is full; other errors pass unchanged.
  """
  import tensorflow as tf  # pylint: disable=import-outside-toplevel
  try:
    yield
  except (OSError, tf.errors.OpError) as e:
    if not is_full(e):
      raise
    reason = next((text for text in _FULL_MESSAGES if text in str(e)), "storage full")
    raise StorageFullError(f"cannot write {what} to {path}: {reason}; {intact}; free space "
                           "there and run the same command again") from None

"""Helpers of the cluster tests: find the processes a test started, by an environment marker."""

from __future__ import annotations

import os
import pathlib
import signal
import time
import uuid

MARKER_VAR = "MXREC_CLUSTER_TEST_MARKER"


def marked_env(**extra: str) -> tuple[dict[str, str], str]:
  """os.environ plus a fresh marker (inherited by every process started with it), and the marker."""
  marker = uuid.uuid4().hex
  return {**os.environ, MARKER_VAR: marker, **extra}, marker


def marked_pids(marker: str) -> list[int]:
  """Live (non-zombie) processes whose environment holds `marker`, read from /proc."""
  pids = []
  for proc in pathlib.Path("/proc").iterdir():
    if not proc.name.isdigit():
      continue
    try:
      environ = (proc / "environ").read_bytes()
      state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:  # Gone, or not ours.
      continue
    if f"{MARKER_VAR}={marker}".encode() in environ.split(b"\0") and state != "Z":
      pids.append(int(proc.name))
  return pids


def kill_marked(marker: str) -> None:
  """SIGKILLs every live process holding `marker` (a test's cleanup in `finally`)."""
  for pid in marked_pids(marker):
    try:
      os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
      pass


def wait_for_text(path: pathlib.Path, text: str, timeout_s: float, process=None) -> None:
  """Returns once the file at `path` holds `text`; fails after `timeout_s` or if `process` ends.

  Polls (every 0.05 s): the writer is another process whose progress shows only in its log.
  """
  deadline = time.monotonic() + timeout_s
  while time.monotonic() < deadline:
    if path.exists() and text in path.read_text(errors="replace"):
      return
    if process is not None and process.poll() is not None:
      raise AssertionError(f"process ended with {process.returncode} before {path} held {text!r}")
    time.sleep(0.05)
  raise AssertionError(f"{path} did not hold {text!r} within {timeout_s} s")

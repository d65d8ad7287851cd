"""One job per model_dir: a claim file with a heartbeat.

`ModelDirLock(model_dir).acquire()` writes `<model_dir>/.mxrec_lock.json`
({"host", "pid", "started", "heartbeat"}, seconds since the epoch) and a
daemon thread rewrites its heartbeat every `heartbeat_s`. A second job on the
same model_dir finds a live claim and gets `ModelDirInUse` naming the holder
(the CLI exits 2). A claim is dead, and is taken over, when its heartbeat is
older than `stale_after_s` or its pid no longer runs on this host: a killed
job's claim never blocks its restart for long. The same process acquiring
again (a pipeline inside `jobs.train`) shares the claim. Claims are created
with O_EXCL, so two jobs starting at once cannot both win.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

LOCK_FILE = ".mxrec_lock.json"


class ModelDirInUse(FileExistsError):
  """Another live job holds the model_dir."""


def _pid_alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:
    return True
  return True


class ModelDirLock:
  """The claim of one job on a model_dir; see the module docstring.

  Args:
    model_dir: The run's directory (created if absent).
    heartbeat_s: Seconds between heartbeats, > 0.
    stale_after_s: A claim whose heartbeat is older is dead, > heartbeat_s.
  """

  def __init__(self, model_dir: str, heartbeat_s: float = 10.0, stale_after_s: float = 60.0):
    if not 0 < heartbeat_s < stale_after_s:
      raise ValueError(f"ModelDirLock: need 0 < heartbeat_s ({heartbeat_s}) < stale_after_s "
                       f"({stale_after_s})")
    self.path = os.path.join(model_dir, LOCK_FILE)
    self._model_dir = model_dir
    self._heartbeat_s, self._stale_after_s = heartbeat_s, stale_after_s
    self._me = {"host": socket.gethostname(), "pid": os.getpid()}
    self._stop = threading.Event()
    self._thread = None
    self._owner = False  # This object wrote the claim (and removes it on release).

  def holder(self) -> dict | None:
    """The claim in the file, or None (no file, or unreadable: a claim torn by a kill)."""
    try:
      with open(self.path, encoding="utf-8") as f:
        claim = json.load(f)
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
      return None
    return claim if isinstance(claim, dict) else None

  def _is_live(self, claim: dict) -> bool:
    if time.time() - float(claim.get("heartbeat", 0)) > self._stale_after_s:
      return False
    if claim.get("host") == self._me["host"]:
      return _pid_alive(int(claim.get("pid", -1)))
    return True

  def _write(self, claim: dict, exclusive: bool) -> bool:
    """Writes `claim`: exclusive creation (False if the file exists) or replace via rename."""
    data = json.dumps(claim).encode()
    if exclusive:
      try:
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
      except FileExistsError:
        return False
      with os.fdopen(fd, "wb") as f:
        f.write(data)
      return True
    temp = f"{self.path}.{self._me['pid']}.tmp"
    with open(temp, "wb") as f:
      f.write(data)
    os.replace(temp, self.path)
    return True

  def acquire(self) -> "ModelDirLock":
    """Claims model_dir and starts the heartbeat; returns self.

    Raises:
      ModelDirInUse: a live claim of another process (host and pid named).
    """
    os.makedirs(self._model_dir, exist_ok=True)
    now = time.time()
    claim = {**self._me, "started": now, "heartbeat": now}
    if not self._write(claim, exclusive=True):
      held = self.holder()
      if held is not None and {k: held.get(k) for k in self._me} == self._me:
        return self  # This process holds it already: shared, not re-owned.
      if held is not None and self._is_live(held):
        age = time.time() - float(held.get("heartbeat", 0))
        raise ModelDirInUse(
            f"model_dir {self._model_dir} is in use by another job (host {held.get('host')}, "
            f"pid {held.get('pid')}, heartbeat {age:.0f} s ago; {self.path}): wait for it to end "
            f"or use another model_dir (a dead job's claim expires after "
            f"{self._stale_after_s:g} s)")
      if held is not None:
        print(
            f"model_dir {self._model_dir}: taking over the claim of a job that is gone "
            f"(host {held.get('host')}, pid {held.get('pid')})", flush=True)
      self._write(claim, exclusive=False)
    self._owner = True
    self._thread = threading.Thread(target=self._beat, args=(claim,), daemon=True,
                                    name="mxrec-model-dir-heartbeat")
    self._thread.start()
    return self

  def _beat(self, claim: dict) -> None:
    while not self._stop.wait(self._heartbeat_s):
      claim["heartbeat"] = time.time()
      try:
        self._write(claim, exclusive=False)
      except OSError:
        pass  # A full disk: the next beat tries again; the claim ages meanwhile.

  def release(self) -> None:
    """Stops the heartbeat and removes the claim if this object made it and still holds it."""
    self._stop.set()
    if self._thread is not None:
      self._thread.join()
    held = self.holder()
    if self._owner and held is not None and {k: held.get(k) for k in self._me} == self._me:
      os.remove(self.path)
    self._owner = False

  def __enter__(self) -> "ModelDirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()

"""One job per model_dir: a claim file with a heartbeat.

`ModelDirLock(model_dir).acquire()` writes `<model_dir>/.mxrec_lock.json`
({"host", "pid", "started", "heartbeat"}, seconds since the epoch) and a
daemon thread rewrites its heartbeat every `heartbeat_s`. A second job on the
same model_dir finds a live claim and gets `ModelDirInUse` naming the holder
(the CLI exits 2). A claim is dead, and is taken over, when its heartbeat is
older than `stale_after_s` or its pid no longer runs on this host: a killed
job's claim never blocks its restart for long. The same process acquiring
again (a pipeline inside `jobs.train`) shares the claim. Claims are created
with O_EXCL, and a dead claim is taken over under an O_EXCL takeover file,
so two jobs starting at once cannot both win.
"""

from __future__ import annotations

import json
import os
import socket
import sys
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
      ModelDirInUse: a live claim of another process (host and pid named),
        or another job taking over a dead claim at this moment.
    """
    os.makedirs(self._model_dir, exist_ok=True)
    now = time.time()
    claim = {**self._me, "started": now, "heartbeat": now}
    if not self._write(claim, exclusive=True):
      held = self.holder()
      if held is not None and self._is_mine(held):
        return self  # This process holds it already: shared, not re-owned.
      self._refuse_if_live(held)
      self._take_over(held, claim)
    self._owner = True
    self._thread = threading.Thread(target=self._beat, args=(claim,), daemon=True,
                                    name="mxrec-model-dir-heartbeat")
    self._thread.start()
    return self

  def _is_mine(self, claim: dict) -> bool:
    return {k: claim.get(k) for k in self._me} == self._me

  def _refuse_if_live(self, held: dict | None) -> None:
    if held is not None and self._is_live(held):
      age = time.time() - float(held.get("heartbeat", 0))
      raise ModelDirInUse(
          f"model_dir {self._model_dir} is in use by another job (host {held.get('host')}, "
          f"pid {held.get('pid')}, heartbeat {age:.0f} s ago; {self.path}): wait for it to end "
          f"or use another model_dir (a dead job's claim expires after "
          f"{self._stale_after_s:g} s)")

  def _take_over(self, dead: dict | None, claim: dict) -> None:
    """Replaces the dead claim `dead` by `claim`, one job at a time.

    Jobs that find the same dead claim at once would each replace it: the
    takeover runs under `<lock file>.takeover`, created exclusively, and
    re-reads the claim inside it, so the second job sees the first's live
    claim. A takeover file older than stale_after_s (its job was killed
    during the takeover) is removed.

    Raises:
      ModelDirInUse: another job is taking over now, or has taken over.
    """
    mutex = self.path + ".takeover"
    for _ in range(2):
      try:
        fd = os.open(mutex, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        break
      except FileExistsError:
        try:
          if time.time() - os.stat(mutex).st_mtime <= self._stale_after_s:
            raise ModelDirInUse(f"model_dir {self._model_dir}: another job is taking over the "
                                f"claim of a job that is gone ({mutex}); use another model_dir "
                                "or try again") from None
          os.remove(mutex)  # Left by a job killed during its takeover.
        except FileNotFoundError:
          pass  # That takeover just ended: try again.
    else:
      raise ModelDirInUse(f"model_dir {self._model_dir}: another job is taking over its claim "
                          f"({mutex}); try again")
    try:
      with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(json.dumps(self._me))
      held = self.holder()
      self._refuse_if_live(held)  # Another job took over in between.
      if dead is not None:
        print(
            f"model_dir {self._model_dir}: taking over the claim of a job that is gone "
            f"(host {dead.get('host')}, pid {dead.get('pid')})", flush=True)
      self._write(claim, exclusive=False)
    finally:
      os.remove(mutex)

  def _beat(self, claim: dict) -> None:
    while not self._stop.wait(self._heartbeat_s):
      held = self.holder()
      if held is not None and not self._is_mine(held):
        # Judged dead (e.g. this process was stopped past stale_after_s) and taken over.
        print(
            f"model_dir {self._model_dir}: the claim of this job was taken over by host "
            f"{held.get('host')}, pid {held.get('pid')}; two jobs may now write this model_dir",
            file=sys.stderr, flush=True)
        return
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
    if self._owner and held is not None and self._is_mine(held):
      os.remove(self.path)
    self._owner = False

  def __enter__(self) -> "ModelDirLock":
    return self.acquire()

  def __exit__(self, *exc) -> None:
    self.release()

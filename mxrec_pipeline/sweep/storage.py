"""The study's storage: opening it, the trial-start lock, and failing dead trials.

`open_storage` opens any SQLAlchemy URL (Optuna's RDBStorage): an SQLite file
for one machine, PostgreSQL or MySQL for workers on many machines sharing one
study (a bare `postgresql://` uses psycopg2); `check_storage` tries the URL
before the first trial and names it, password masked, when it fails.

`trial_start_lock` is held from counting a study's trials to creating the new
one, so parallel workers never start more than `--n-trials` needs: an fcntl
lock on `<database>.lock` for SQLite, pg_advisory_lock on PostgreSQL, GET_LOCK
on MySQL/MariaDB, none on other databases (a warning says so: each worker may
then run one extra trial). The OS or the server releases a dead holder's lock.

`fail_dead_trials` marks FAIL the trials a dead worker left RUNNING, with the
reason in their "error" user attribute: at once on the worker's own machine
(each trial records its worker's host, pid and process start time), from any
machine by Optuna's heartbeat (`fail_stale_trials`).
See docs/sweeps.md#storage-and-many-machines.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import warnings

import optuna
import sqlalchemy

from mxrec_pipeline.sweep import config as config_lib

# Trial user attributes written by the sweep.
WORKER_ATTR = "worker"  # {"host", "pid", "start_ticks", "index"} of the worker
ERROR_ATTR = "error"  # why a FAIL trial failed
TrialState = optuna.trial.TrialState
# Drivers for URLs that name none (`postgresql://`): the ones installed with
# the project, not SQLAlchemy's defaults.
DEFAULT_DRIVERS = {"postgresql": "psycopg2"}
CONNECT_TIMEOUT_S = 10  # For check_storage's connection to a database server.


class StorageError(ValueError):
  """The study's storage cannot be used; the message names its URL (password masked)."""


def resolve_url(url: str) -> str:
  """`url` with the project's driver where it names none (postgresql -> postgresql+psycopg2)."""
  parsed = sqlalchemy.engine.make_url(url)
  driver = DEFAULT_DRIVERS.get(parsed.drivername)
  if driver is None:
    return url
  return parsed.set(drivername=f"{parsed.drivername}+{driver}").render_as_string(
      hide_password=False)


def printable(url: str) -> str:
  """`url` with its password masked (`***`)."""
  return sqlalchemy.engine.make_url(url).render_as_string(hide_password=True)


def check_storage(url: str) -> None:
  """Connects once to a given study database, so that a bad URL fails before any trial.

  An SQLite file's directory must exist: it is not created (Optuna's
  RDBStorage would create it, even at the filesystem root).

  Raises:
    StorageError: naming the URL (password masked) and the problem: a driver
      that is not installed, a missing SQLite directory, a server that cannot
      be reached or refuses the credentials or database.
  """
  parsed = sqlalchemy.engine.make_url(resolve_url(url))
  shown = printable(url)
  backend = parsed.get_backend_name()
  if backend == "sqlite":
    directory = os.path.dirname(os.path.abspath(parsed.database))
    if not os.path.isdir(directory):
      raise StorageError(f"storage {shown}: the directory {directory} of the SQLite file does "
                         "not exist (create it, or give a file in an existing directory)")
  # psycopg2, pymysql and mysqlclient take connect_timeout; other drivers may not.
  connect_args = ({"connect_timeout": CONNECT_TIMEOUT_S} if backend in ("postgresql", "mysql",
                                                                        "mariadb") else {})
  try:
    parsed.get_dialect().import_dbapi()
  except sqlalchemy.exc.NoSuchModuleError as e:
    raise StorageError(f"storage {shown}: SQLAlchemy knows no database or driver "
                       f"'{parsed.drivername}' (e.g. postgresql+psycopg2, mysql+pymysql, "
                       "sqlite)") from e
  except ImportError as e:
    raise StorageError(f"storage {shown}: the module '{e.name}' of the database driver "
                       f"'{parsed.drivername}' is not installed (pip install it, or use a URL "
                       "with an installed driver)") from e
  engine = sqlalchemy.create_engine(parsed, poolclass=sqlalchemy.pool.NullPool,
                                    connect_args=connect_args)
  try:
    with engine.connect():
      pass
  except sqlalchemy.exc.DBAPIError as e:
    reason = " ".join(str(e.orig).split()) if e.orig is not None else str(e)
    raise StorageError(f"storage {shown}: cannot connect: {reason}") from e
  finally:
    engine.dispose()


def open_storage(config: config_lib.SweepConfig) -> optuna.storages.RDBStorage:
  """The study's RDBStorage, with the configured heartbeat (see `check_storage` first).

  SQLite waits up to 60 s for a lock held by another process (its default, 5 s,
  is short for several workers); other databases check connections before use.
  """
  url = resolve_url(config.storage_url)
  parsed = sqlalchemy.engine.make_url(url)
  if parsed.get_backend_name() == "sqlite":
    if config.storage is None:  # The default file in sweep_dir; given URLs: check_storage.
      os.makedirs(os.path.dirname(os.path.abspath(parsed.database)), exist_ok=True)
    engine_kwargs = {"connect_args": {"timeout": 60}}
  else:
    engine_kwargs = {"pool_pre_ping": True}

  def create():
    with warnings.catch_warnings():
      warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)  # Heartbeat.
      return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs,
                                        heartbeat_interval=config.heartbeat_interval_s,
                                        grace_period=config.heartbeat_grace_period_s)

  try:
    return create()
  except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError):
    return create()  # Another machine created the tables at the same moment; now they exist.
  except sqlalchemy.exc.OperationalError as e:
    # SQLite's form of the same race: "table studies already exists".
    if "already exists" not in str(e):
      raise
    return create()


def count_states(study: optuna.Study) -> dict[TrialState, int]:
  """Number of trials in each state."""
  counts = {state: 0 for state in TrialState}
  for trial in study.get_trials(deepcopy=False):
    counts[trial.state] += 1
  return counts


def finished(counts: dict[TrialState, int]) -> int:
  """COMPLETE + PRUNED: the trials `n_trials` counts."""
  return counts[TrialState.COMPLETE] + counts[TrialState.PRUNED]


# --- Dead trials -------------------------------------------------------------


def worker_identity(index: int) -> dict:
  """This process as a trial's owner: host, pid, start time (clock ticks), index."""
  return {
      "host": socket.gethostname(), "pid": os.getpid(), "start_ticks": _start_ticks(os.getpid()),
      "index": index
  }


def _start_ticks(pid: int) -> int | None:
  """Start time of a live, non-zombie process (clock ticks since boot), else None.

  Linux /proc/PID/stat; elsewhere 0 for any process that exists.
  """
  try:
    with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
      fields = f.read().rsplit(")", 1)[1].split()
  except FileNotFoundError:
    return None
  except OSError:
    try:
      os.kill(pid, 0)
    except ProcessLookupError:
      return None
    except PermissionError:
      pass
    return 0
  state, start = fields[0], int(fields[19])  # Fields 3 and 22 of proc(5).
  return None if state in ("Z", "X") else start


def is_alive(owner: dict) -> bool:
  """Whether the worker `owner` (a WORKER_ATTR of this host) still runs."""
  ticks = _start_ticks(int(owner["pid"]))
  return ticks is not None and (ticks == 0 or owner.get("start_ticks") in (None, ticks))


def fail_dead_trials(study: optuna.Study, storage: optuna.storages.BaseStorage) -> list[int]:
  """Marks FAIL the RUNNING trials whose worker is dead; returns their numbers.

  Trials of this host's workers are checked by pid; the others by Optuna's
  heartbeat (when enabled). Safe to call from several processes at once.
  """
  running = {t.number for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
  if not running:
    return []
  with warnings.catch_warnings():
    warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
    optuna.storages.fail_stale_trials(study)
  host = socket.gethostname()
  study_id = storage.get_study_id_from_name(study.study_name)
  failed = []
  for trial in study.get_trials(deepcopy=False):
    if trial.number not in running:
      continue
    if trial.state == TrialState.FAIL and ERROR_ATTR not in trial.user_attrs:
      failed.append(trial.number)  # By the heartbeat.
      continue
    owner = trial.user_attrs.get(WORKER_ATTR)
    if (trial.state != TrialState.RUNNING or not owner or owner.get("host") != host or
        is_alive(owner)):
      continue
    trial_id = storage.get_trial_id_from_study_id_trial_number(study_id, trial.number)
    try:
      storage.set_trial_user_attr(
          trial_id, ERROR_ATTR, f"worker process {owner['pid']} on {host} died while the "
          "trial ran (killed, or the machine stopped)")
      if storage.set_trial_state_values(trial_id, TrialState.FAIL):
        failed.append(trial.number)
    except optuna.exceptions.UpdateFinishedTrialError:
      pass  # It finished (or another process failed it) meanwhile.
  return sorted(failed)


# --- Trial-start lock --------------------------------------------------------


class TrialStartLock:
  """A lock among all workers of a study (see the module docstring).

  `acquire()` blocks; `release()` may be called more than once. Not
  reentrant; one per worker process.
  """

  def acquire(self) -> None:
    """Blocks until this worker holds the lock."""

  def release(self) -> None:
    """Releases the lock if held."""

  def __enter__(self):
    self.acquire()
    return self

  def __exit__(self, *exc):
    self.release()


class _FileLock(TrialStartLock):
  """fcntl.flock on a file beside the SQLite database."""

  def __init__(self, path: str):
    self.path = path
    self._file = None

  def acquire(self):
    self._file = open(self.path, "a", encoding="utf-8")  # pylint: disable=consider-using-with
    fcntl.flock(self._file, fcntl.LOCK_EX)

  def release(self):
    if self._file is not None:
      fcntl.flock(self._file, fcntl.LOCK_UN)
      self._file.close()
      self._file = None


class _SqlLock(TrialStartLock):
  """A database lock held by a connection of its own (PostgreSQL, MySQL)."""

  def __init__(self, url: str, lock_sql: str, unlock_sql: str, key):
    self._engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    self._lock_sql, self._unlock_sql = sqlalchemy.text(lock_sql), sqlalchemy.text(unlock_sql)
    self._key = key
    self._connection = None

  def acquire(self):
    self._connection = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
    self._connection.execute(self._lock_sql, {"key": self._key})

  def release(self):
    if self._connection is not None:
      with contextlib.suppress(sqlalchemy.exc.SQLAlchemyError):
        self._connection.execute(self._unlock_sql, {"key": self._key})
      self._connection.close()
      self._connection = None


def trial_start_lock(url: str, study_name: str) -> TrialStartLock:
  """The trial-start lock of a study in the database at `url`."""
  url = resolve_url(url)
  parsed = sqlalchemy.engine.make_url(url)
  backend = parsed.get_backend_name()
  digest = hashlib.sha256(f"mxrec_pipeline.sweep:{study_name}".encode()).digest()
  if backend == "sqlite":
    return _FileLock(parsed.database + ".lock")
  if backend == "postgresql":
    key = int.from_bytes(digest[:8], "big", signed=True)
    return _SqlLock(url, "SELECT pg_advisory_lock(:key)", "SELECT pg_advisory_unlock(:key)", key)
  if backend in ("mysql", "mariadb"):
    return _SqlLock(url, "SELECT GET_LOCK(:key, -1)", "SELECT RELEASE_LOCK(:key)",
                    "mxrec_sweep_" + digest.hex()[:32])
  warnings.warn(
      f"no trial-start lock for {backend} databases: parallel workers may run up to "
      "one trial each beyond n_trials", RuntimeWarning, stacklevel=2)
  return TrialStartLock()

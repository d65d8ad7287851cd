"""RankerRegistry: rankers by name, each imported only when it is used.

A ranker module imports TensorFlow; its config dataclasses live in a module
that does not (e.g. builders/movielens_config.py), so a job config validates,
and `mxrec-pipeline --help` answers, without importing TensorFlow. Entries
name their classes by "module:attribute" paths, resolved on first use:

  registry = RankerRegistry({"my_ranker": RankerEntry(
      ranker="my_pkg.ranker:MyRanker", data_config="my_pkg.ranker_config:MyDataConfig",
      model_config="my_pkg.ranker_config:MyModelConfig")})
  registry["my_ranker"]                  # imports my_pkg.ranker: the MyRanker class
  registry.config_classes("my_ranker")   # imports my_pkg.ranker_config only
  registry["other"] = OtherRanker        # a class: its DataConfig and ModelConfig
"""

from __future__ import annotations

import collections.abc
import dataclasses
import importlib
from typing import Iterator, Mapping


@dataclasses.dataclass(frozen=True)
class RankerEntry:
  """Where a ranker and its config dataclasses are.

  Each attribute is the class itself or its "module:attribute" path.

  Attributes:
    ranker: The RankerBuilder subclass.
    data_config: Its DataConfig dataclass (`ranker.DataConfig`).
    model_config: Its ModelConfig dataclass (`ranker.ModelConfig`).
  """

  ranker: type | str
  data_config: type | str
  model_config: type | str


def resolve(target: type | str) -> type:
  """`target` itself, or the attribute a "module:attribute" path names (imported).

  Raises:
    ValueError: a path without ":".
    ImportError, AttributeError: no such module or attribute.
  """
  if not isinstance(target, str):
    return target
  module, sep, attribute = target.partition(":")
  if not sep:
    raise ValueError(f"expected a 'module:attribute' path, got {target!r}")
  return getattr(importlib.import_module(module), attribute)


class RankerRegistry(collections.abc.MutableMapping):
  """Ranker name -> RankerBuilder subclass, imported on first lookup.

  Membership, `len`, iteration and `sorted(registry)` import nothing;
  `registry[name]` imports the ranker's module. See the module docstring.

  Args:
    entries: Name -> RankerEntry.
  """

  def __init__(self, entries: Mapping[str, RankerEntry] = ()):
    self._entries = dict(entries)

  def __getitem__(self, name: str) -> type:
    return resolve(self._entries[name].ranker)

  def __setitem__(self, name: str, ranker: type) -> None:
    """Registers a ranker class, with its DataConfig and ModelConfig."""
    self._entries[name] = RankerEntry(ranker, ranker.DataConfig, ranker.ModelConfig)

  def __delitem__(self, name: str) -> None:
    del self._entries[name]

  def __contains__(self, name) -> bool:
    return name in self._entries  # Mapping's default would import the ranker.

  def __iter__(self) -> Iterator[str]:
    return iter(self._entries)

  def __len__(self) -> int:
    return len(self._entries)

  def __repr__(self) -> str:
    return f"RankerRegistry({sorted(self._entries)})"

  def register(self, name: str, entry: RankerEntry) -> None:
    """Registers a ranker by its entry (classes or paths; nothing is imported)."""
    self._entries[name] = entry

  def entry(self, name: str) -> RankerEntry:
    """The entry of a name, as registered (KeyError when absent)."""
    return self._entries[name]

  def config_classes(self, name: str) -> tuple[type, type]:
    """(DataConfig, ModelConfig) of a ranker, without importing its module.

    Raises:
      KeyError: an unregistered name.
    """
    entry = self._entries[name]
    return resolve(entry.data_config), resolve(entry.model_config)

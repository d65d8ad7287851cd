"""Ready-made rankers (tasks) the CLI runs by name; users pick or subclass them.

`REGISTRY` maps names to ranker classes and imports a ranker's module (and so
TensorFlow) only when it is looked up; `get_config_classes` gives its config
dataclasses without TensorFlow. Register a ranker with
`REGISTRY[MyRanker.name] = MyRanker`, or lazily with `REGISTRY.register(name,
RankerEntry(...))` (see builders/registry.py).
"""

from builders.base_config import DatasetConfig
from builders.registry import RankerEntry, RankerRegistry

REGISTRY = RankerRegistry({
    "movielens_listwise":
        RankerEntry(ranker="builders.movielens:MovieLensListwise",
                    data_config="builders.movielens_config:MovieLensDataConfig",
                    model_config="builders.movielens_config:MovieLensModelConfig"),
    "movielens_dcn": RankerEntry(ranker="builders.movielens_dcn:MovieLensDcn",
                                 data_config="builders.movielens_config:MovieLensDataConfig",
                                 model_config="builders.movielens_dcn_config:DcnModelConfig"),
    "mslr_dnn": RankerEntry(ranker="builders.mslr:MslrDnn",
                            data_config="builders.mslr_config:MslrDataConfig",
                            model_config="builders.mslr_config:MslrModelConfig"),
    "letor_dasalc": RankerEntry(ranker="builders.letor_dasalc:LetorDasalc",
                                data_config="builders.mslr_config:MslrDataConfig",
                                model_config="builders.letor_dasalc_config:DasalcModelConfig"),
    "letor_leaves": RankerEntry(ranker="builders.letor_leaves:LetorLeaves",
                                data_config="builders.mslr_config:MslrDataConfig",
                                model_config="builders.letor_leaves_config:LeavesModelConfig"),
    "book_crossing_listwise": RankerEntry(
        ranker="builders.book_crossing:BookCrossingListwise",
        data_config="builders.book_crossing_config:BookCrossingDataConfig",
        model_config="builders.book_crossing_config:BookCrossingModelConfig"),
})

# Imported from builders.base (and so TensorFlow) on first use, by __getattr__.
_LAZY = ("DataPaths", "RankerBuilder")


def _check_known(name: str) -> None:
  if name not in REGISTRY:
    raise ValueError(f"unknown builder '{name}'; known: {sorted(REGISTRY)}")


def get_builder(name: str):
  """A ranker (a RankerBuilder instance) by name; imports its module.

  Raises:
    ValueError: an unknown name, listing the known ones.
  """
  _check_known(name)
  return REGISTRY[name]()


def get_config_classes(name: str) -> tuple[type, type]:
  """(DataConfig, ModelConfig) of a ranker by name, without importing TensorFlow.

  Raises:
    ValueError: an unknown name, listing the known ones.
  """
  _check_known(name)
  return REGISTRY.config_classes(name)


def __getattr__(name: str):
  if name in _LAZY:
    from builders import base  # pylint: disable=import-outside-toplevel
    return getattr(base, name)
  raise AttributeError(f"module 'builders' has no attribute {name!r}")


__all__ = [
    "REGISTRY", "DatasetConfig", "RankerEntry", "RankerRegistry", "get_builder",
    "get_config_classes", *_LAZY
]

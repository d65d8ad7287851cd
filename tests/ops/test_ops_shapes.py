"""Shape functions of every native op (native/ops/*.cc), in graph mode.

Each op is built in a fresh tf.Graph on placeholders, never run: once with
inputs of known shape, once with every input of unknown rank, and with inputs of
a wrong rank or mismatched dims, which the shape function must reject when the
graph is built (ValueError), before any kernel runs.
"""

import dataclasses
import re

import pytest
import tensorflow as tf

from mxrec_pipeline import ops as native_ops

RES, I64, F32 = tf.resource, tf.int64, tf.float32
HANDLE = (RES, [])
UNKNOWN_RANK = None  # An input or output shape of unknown rank.
RANK = "must be rank"  # TF's message when WithRank fails.
DIMS = "must be equal|[Ii]ncompatible"  # ... and when Merge fails.


@dataclasses.dataclass(frozen=True)
class Case:
  """An op's inputs and the static output shapes its shape function gives.

  Attributes:
    op: the registered op name, e.g. "MxKeyIndexInsert".
    inputs: (dtype, shape) of each input in order; shapes as lists, None dims
      unknown.
    outputs: the output shapes inferred from `inputs`.
    unknown_rank_outputs: the output shapes inferred when every input has unknown
      rank.
    attrs: the op's required attrs.
    bad: (input index, shape, error pattern) of inputs the shape function rejects
      (with the other inputs as in `inputs`). A scalar handle is checked for
      every op that takes one, without being listed here.
  """
  op: str
  inputs: tuple
  outputs: tuple
  unknown_rank_outputs: tuple
  attrs: dict = dataclasses.field(default_factory=dict)
  bad: tuple = ()


def _scalars(n):
  return ([],) * n


def _vectors(n):
  return ([None],) * n


def _handle_op(op):
  return Case(op, (), ([],), ([],), {"shared_name": "t"})


def _handle_only(op, outputs, attrs=None):
  """An op of the handle alone; its outputs do not depend on input shapes."""
  return Case(op, (HANDLE,), outputs, outputs, attrs or {})


TABLE = {"table_name": "t"}
DIM = {"dim": 4}
TIERS = {"width": 8, "host_rows": 10, "ssd_rows": 0, "total_rows": 20, **TABLE}
CACHE = {"device_rows": 4, "total_rows": 10, "policy": "lru", **TABLE}
# The inputs (handle, rows [3], grad [3, dim], hyperparameters...) of the fused
# row-store updates, and what their shape function rejects.
APPLY_INPUTS = (HANDLE, (I64, [3]), (F32, [3, 4]))
APPLY_BAD = ((1, [3, 1], RANK), (2, [3], RANK), (2, [2, 4], DIMS), (2, [3,
                                                                        5], DIMS), (3, [1], RANK))

CASES = (
    # Key index: native/ops/key_index_ops.cc.
    _handle_op("MxKeyIndexHandle"),
    _handle_only("MxKeyIndexCreate", (), {"capacity": 4, **TABLE}),
    Case("MxKeyIndexInsert", (HANDLE, (I64, [2, 3])), ([None], [2, 3], [None]),
         ([None], UNKNOWN_RANK, [None]), {"training": True}),
    _handle_only("MxKeyIndexSize", _scalars(2)),
    _handle_only("MxKeyIndexExport", _vectors(2)),
    Case("MxKeyIndexImport", (HANDLE, (I64, [5]), (I64, [5])), (), (), {"capacity": 4, **TABLE},
         bad=((1, [5, 1], RANK), (2, [4], DIMS))),
    Case("MxKeyIndexInsertAdmit", (HANDLE, (I64, [2, 3]), (I64, [2, 3]), (I64, []), (I64, [])),
         ([None], [2, 3], [None]), ([None], UNKNOWN_RANK, [None]),
         bad=((2, [3, 2], DIMS), (2, [2], DIMS), (3, [1], RANK), (4, [1], RANK))),
    Case("MxKeyIndexEvict", (HANDLE, (I64, [])), ([None],), ([None],), bad=((1, [1], RANK),)),
    _handle_only("MxKeyIndexStats", ([5],)),
    _handle_only("MxKeyIndexExportState",
                 _vectors(6) + ([3],)),
    _handle_only("MxKeyIndexExportChanges",
                 _vectors(6) + ([3], [None]), {"clear": False}),
    Case(
        "MxKeyIndexImportState", (HANDLE,) + ((I64, [4]),) * 3 + ((I64, [2]),) * 3 + ((I64, [3]),),
        (), (), {"capacity": 4, **TABLE},
        bad=((1, [4, 1], RANK), (2, [3], DIMS), (3, [3], DIMS), (4, [], RANK), (5, [3], DIMS),
             (6, [3], DIMS), (7, [3, 1], RANK))),
    # Row initializer: native/ops/row_init_ops.cc.
    Case("MxRowInit", ((I64, [5]),), ([5, 4],), ([None, 4],), {"kind": "uniform", **DIM},
         bad=((0, [5, 1], RANK),)),
    # Fused row optimizers: native/ops/row_optimizer_ops.cc.
    Case(
        "MxLazyAdamRows", (HANDLE,) * 3 + ((I64, [3]), (F32, [3, 4])) + ((F32, []),) * 4, (), (),
        bad=((1, [2], RANK), (3, [3, 1], RANK), (4, [3], RANK), (4, [2, 4], DIMS), (5, [1], RANK),
             (8, [1], RANK))),
    Case("MxAdagradRows", (HANDLE, HANDLE, (I64, [3]), (F32, [3, 4]), (F32, [])), (), (),
         bad=((1, [2], RANK), (3, [2, 4], DIMS), (4, [1], RANK))),
    Case("MxFtrlRows", (HANDLE,) * 3 + ((I64, [3]), (F32, [3, 4])) + ((F32, []),) * 5, (), (),
         bad=((2, [2], RANK), (4, [3, 5, 1], RANK), (9, [1], RANK))),
    Case("MxSgdRows", (HANDLE, (I64, [3]), (F32, [3, 4]), (F32, []), (F32, [])), (), (),
         bad=((1, [3, 1], RANK), (2, [4, 4], DIMS), (4, [1], RANK))),
    Case("MxGatherByRestore", ((F32, [5, 4]), (tf.int32, [2, 3])), ([2, 3, 4],), (UNKNOWN_RANK,),
         bad=((0, [5], RANK), (0, [5, 4, 1], RANK))),
    Case("MxSumByRestore", ((F32, [6, 4]), (tf.int32, [6]), (tf.int32, [])), ([None, 4],),
         ([None, None],), bad=((0, [6], RANK), (1, [6, 1], RANK), (1, [5], DIMS), (2, [1], RANK))),
    # Ragged combiner: native/ops/segment_combine_ops.cc.
    Case("MxSegmentCombine", ((F32, [5, 4]), (I64, [4])), ([3, 4],), ([None, None],),
         {"combiner": "mean"}, bad=((0, [5], RANK), (1, [], RANK), (1, [4, 1], RANK))),
    Case("MxSegmentCombineGrad", ((F32, [3, 4]), (I64, [4])), ([None, 4],), ([None, None],),
         {"combiner": "sqrtn"}, bad=((0, [3], RANK), (1, [4, 1], RANK))),
    # Row store: native/ops/row_store_ops.cc.
    _handle_op("MxRowStoreHandle"),
    _handle_only("MxRowStoreCreate", (), {**DIM, **TABLE}),
    _handle_only("MxRowStoreSize", _scalars(3)),
    Case("MxRowStoreAppend", (HANDLE, (I64, []), (F32, [3, 4])), ([],), ([],), DIM,
         bad=((1, [1], RANK), (2, [3], RANK), (2, [3, 5], DIMS))),
    Case("MxRowStoreSetSlots", (HANDLE, (F32, [2])), (), (), bad=((1, [2, 1], RANK),)),
    Case("MxRowStoreLookup", (HANDLE, (I64, [3]), (F32, [0, 4])), ([3, 4], [3]),
         ([None, 4], [None]), {**DIM, **TABLE},
         bad=((1, [3, 1], RANK), (2, [4], RANK), (2, [0, 5], DIMS))),
    Case("MxRowStoreReadRows", (HANDLE, (I64, [3])), ([3, None], [None]), ([None, None], [None]),
         bad=((1, [], RANK),)),
    Case("MxRowStoreWriteRows", (HANDLE, (I64, [3]), (F32, [3, 8])), (), (),
         bad=((1, [3, 1], RANK), (2, [3], RANK), (2, [2, 8], DIMS))),
    _handle_only("MxRowStoreExport", ([None, None], [None])),
    Case("MxRowStoreImport", (HANDLE, (F32, [5, 8]), (F32, [2])), (), (), {**DIM, **TABLE},
         bad=((1, [5], RANK), (2, [2, 1], RANK))),
    Case("MxRowStoreApplySgd", APPLY_INPUTS + ((F32, []),) * 2, (), (), DIM, bad=APPLY_BAD),
    Case("MxRowStoreApplyAdagrad", APPLY_INPUTS + ((F32, []),), (), (), DIM, bad=APPLY_BAD),
    Case("MxRowStoreApplyAdam", APPLY_INPUTS + ((F32, []),) * 4, (), (), DIM,
         bad=APPLY_BAD + ((6, [2], RANK),)),
    # Host/SSD tiers: native/ops/tier_store_ops.cc.
    _handle_op("MxTierStoreHandle"),
    _handle_only("MxTierStoreCreate", (), TIERS),
    Case(
        "MxTierStoreSwap", (HANDLE, (I64, [2]), (I64, [3]), (I64, [4]), (F32, [4, 8])),
        ([3, 8], [3]), ([None, None], [None]),
        bad=((1, [2, 1], RANK), (2, [], RANK), (3, [4, 1], RANK), (4, [4], RANK), (4, [5,
                                                                                       8], DIMS))),
    Case("MxTierStoreRead", (HANDLE, (I64, [3])), ([3, None], [3]), ([None, None], [None]),
         bad=((1, [3, 1], RANK),)),
    Case("MxTierStoreExport", (HANDLE, (I64, [2])), ([None], [None, None]), ([None], [None, None]),
         bad=((1, [], RANK),)),
    Case("MxTierStoreImport", (HANDLE, (I64, [3]), (F32, [3, 8])), (), (), TIERS,
         bad=((1, [3, 1], RANK), (2, [3], RANK), (2, [2, 8], DIMS), (2, [3, 7], DIMS))),
    _handle_only("MxTierStoreStats", _scalars(4)),
    # Device cache: native/ops/device_cache_ops.cc.
    _handle_op("MxDeviceCacheHandle"),
    _handle_only("MxDeviceCacheCreate", (), CACHE),
    Case("MxDeviceCachePlan", (HANDLE, (I64, [3])), ([3], []), ([None], []), bad=((1, [3,
                                                                                       1], RANK),)),
    Case("MxDeviceCacheApply", (HANDLE, (I64, [])), _vectors(6), _vectors(6),
         bad=((1, [1], RANK),)),
    Case("MxDeviceCacheFinish", (HANDLE, (I64, [])), (), (), bad=((1, [1], RANK),)),
    Case("MxDeviceCacheRelease", (HANDLE, (I64, [3])), (), (), bad=((1, [], RANK),)),
    Case("MxDeviceCacheLocate", (HANDLE, (I64, [3])), ([3],), ([None],), bad=((1, [3, 1], RANK),)),
    _handle_only("MxDeviceCacheExportState",
                 _vectors(5) + ([5],)),
    Case("MxDeviceCacheImportState", (HANDLE,) + ((I64, [4]),) * 5 + ((I64, [5]),), (), (), CACHE,
         bad=tuple((i, [4, 1], RANK) for i in range(1, 7))),
    _handle_only("MxDeviceCacheStats", _scalars(6)),
)

BAD_CASES = [(case, i, shape, error) for case in CASES for i, shape, error in case.bad]
BAD_CASES += [(case, 0, [2], RANK) for case in CASES if case.inputs[:1] == (HANDLE,)]


def _snake(op):
  """The wrapper name of `op`: MxKeyIndexInsert -> mx_key_index_insert."""
  return re.sub(r"(?<!^)(?=[A-Z])", "_", op).lower()


def _output_shapes(case, shapes):
  """Builds `case.op` on placeholders of `shapes`; returns its static output shapes."""
  with tf.Graph().as_default():
    inputs = [
        tf.compat.v1.placeholder(dtype, shape) for (dtype, _), shape in zip(case.inputs, shapes)
    ]
    result = getattr(native_ops.load(), _snake(case.op))(*inputs, **case.attrs)
    op = result if isinstance(result, tf.Operation) else tf.nest.flatten(result)[0].op
    assert op.type == case.op
    return tuple(None if out.shape.rank is None else out.shape.as_list() for out in op.outputs)


def test_every_registered_op_has_a_case():
  library = native_ops.load()
  registered = {name for name in dir(library) if hasattr(library, name + "_eager_fallback")}
  assert {_snake(case.op) for case in CASES} == registered
  assert len(CASES) == len(registered)


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.op)
def test_output_shapes_of_known_inputs(case):
  assert _output_shapes(case, [shape for _, shape in case.inputs]) == case.outputs


@pytest.mark.parametrize("case", CASES, ids=lambda case: case.op)
def test_output_shapes_of_unknown_rank_inputs(case):
  assert _output_shapes(case, [UNKNOWN_RANK] * len(case.inputs)) == case.unknown_rank_outputs


@pytest.mark.parametrize("case,index,shape,error", BAD_CASES,
                         ids=[f"{c.op}-input{i}-{s}" for c, i, s, _ in BAD_CASES])
def test_bad_input_shapes_rejected_at_graph_construction(case, index, shape, error):
  shapes = [shape if i == index else known for i, (_, known) in enumerate(case.inputs)]
  with pytest.raises(ValueError, match=error):
    _output_shapes(case, shapes)

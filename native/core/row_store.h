// Row store of a dynamic-expansion table (mxRec's `use_dynamic_expansion`): a
// growable array of rows, each [embedding | optimizer slots] contiguously, with
// the fused lazy optimizer updates that work on them. No TensorFlow includes: the
// op layer in native/kernels wraps this class in a tensorflow::ResourceBase.
//
// A row is addressed by its row id (its "address"), which the table's key index
// hands out (a growable mxrec::KeyIndex). Rows live in fixed-size blocks that are
// never moved when the store grows, so growth costs one allocation per block and
// never copies existing rows. The slot layout is chosen once, by the first
// optimizer that updates the table (SetSlots); rows then hold
//   [embedding (dim) | slot 0 (dim) | ... | slot k-1 (dim)]    (float32)
// and rows appended later start with each slot at its initial value.
//
// Thread safety: every public method is thread-safe. Readers (Lookup, ReadRows,
// Export, size, ...) take a shared lock; writers (Append, SetSlots, WriteRows,
// Import, Apply*, Clear) an exclusive one, so an update never interleaves with a
// lookup of the same table.
#ifndef MXREC_PIPELINE_NATIVE_CORE_ROW_STORE_H_
#define MXREC_PIPELINE_NATIVE_CORE_ROW_STORE_H_

#include <cstdint>
#include <memory>
#include <shared_mutex>
#include <string>
#include <vector>

#include "key_index.h"  // kMissingRow
#include "status.h"

namespace mxrec {

class RowStore {
 public:
  // Most rows a store holds (as KeyIndex::kMaxCapacity).
  static constexpr int64_t kMaxRows = int64_t{1} << 40;
  // Most optimizer slots a row holds.
  static constexpr int64_t kMaxSlots = 8;
  // Rows per block used by the op layer: 16k rows, so a block of a [dim=64 | 2
  // slots] row is 12 MiB and a small table wastes little.
  static constexpr int64_t kDefaultBlockRows = int64_t{1} << 14;

  // `dim`: embedding dimension, >= 1. `block_rows`: rows per storage block, >= 1.
  // `name`: the table name, used in error messages. Callers check the ranges.
  RowStore(int64_t dim, int64_t block_rows, std::string name);

  RowStore(const RowStore&) = delete;
  RowStore& operator=(const RowStore&) = delete;

  // Appends `n` rows whose embeddings are `values` and whose slots start at their
  // initial values -- if size() == expected_size; otherwise (another caller grew
  // the store first) appends nothing. Either way *new_size is the size after.
  // ResourceExhausted, appending nothing, past kMaxRows or when the host cannot
  // allocate the blocks.
  Status Append(int64_t expected_size,
                const float* values,  // (n, dim)
                int64_t n, int64_t* new_size);

  // Sets the optimizer slots: `num_slots` slots starting at initial_values[j].
  // The first call (on an empty or filled store) lays every row out again with
  // the slots at their initial values; later calls must give the same slots
  // (FailedPrecondition otherwise: one slot layout per table). Zero slots is a
  // layout too (plain SGD).
  Status SetSlots(const float* initial_values,  // (num_slots)
                  int64_t num_slots);

  // Copies the embeddings of `rows` to `out`; row kMissingRow (-1) reads zeros.
  // InvalidArgument when a row is outside [-1, size()).
  Status Lookup(const int64_t* rows,  // (n)
                int64_t n,
                float* out) const;  // out: (n, dim)

  // Copies whole rows, [embedding | slots], to `out`, their width to *width and
  // the slots' initial values (empty before SetSlots) to *slot_initial_values,
  // all under one lock (a concurrent first SetSlots cannot split them). Rows in
  // [0, size()).
  Status ReadRows(const int64_t* rows,  // (n)
                  int64_t n,
                  std::vector<float>* out,  // out: (n, *width)
                  int64_t* width,
                  std::vector<float>* slot_initial_values) const;

  // Overwrites rows, in [0, size()). `width` is row_width() (whole rows) or
  // dim (embeddings only: the rows' slots go back to their initial values).
  Status WriteRows(const int64_t* rows,  // (n)
                   int64_t n,
                   const float* values,  // (n, width)
                   int64_t width);

  // Replaces the whole content: `n` rows of width dim * (1 + num_slots), slots
  // set as by SetSlots. Zero slots leaves the layout unset (num_slots() == -1),
  // as Export cannot tell SGD's zero slots from none: the next SetSlots, of any
  // optimizer, defines it. Validates first and changes nothing on error.
  Status Import(const float* values,  // (n, dim * (1 + num_slots))
                int64_t n,
                const float* slot_initial_values,  // (num_slots)
                int64_t num_slots);

  // Copies every row, [embedding | slots], in row order, and the slots' initial
  // values (empty before SetSlots).
  void Export(std::vector<float>* values,  // out: (size(), row_width())
              std::vector<float>* slot_initial_values) const;

  // Fused lazy updates of distinct rows in [0, size()) (a row given twice is
  // updated twice), with their gradients `grad` (n, dim). Each needs its slot
  // layout (FailedPrecondition otherwise). Per element of a row:
  //   ApplySgd:     w -= lr * (g + weight_decay * w)                    (0 slots)
  //   ApplyAdagrad: a += g^2;  w -= lr * g / sqrt(a)                     (1 slot)
  //   ApplyAdam:    m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2;
  //                 w -= lr_t * m / (sqrt(v) + epsilon)                  (2 slots)
  Status ApplySgd(const int64_t* rows, int64_t n, const float* grad, float lr,
                  float weight_decay);
  Status ApplyAdagrad(const int64_t* rows, int64_t n, const float* grad, float lr);
  Status ApplyAdam(const int64_t* rows, int64_t n, const float* grad, float lr_t, float beta1,
                   float beta2, float epsilon);

  // Removes every row and the slot layout.
  void Clear();

  int64_t dim() const { return dim_; }
  const std::string& name() const { return name_; }
  int64_t size() const;
  // Slots per row; -1 before SetSlots.
  int64_t num_slots() const;
  // Floats per row: dim * (1 + max(num_slots, 0)).
  int64_t row_width() const;
  // Bytes of the row blocks.
  int64_t MemoryBytes() const;

 private:
  int64_t WidthLocked() const { return dim_ * (1 + (num_slots_ < 0 ? 0 : num_slots_)); }
  float* RowLocked(int64_t row) const;
  // InvalidArgument naming the first row outside [lowest, size_).
  Status CheckRowsLocked(const int64_t* rows, int64_t n, int64_t lowest) const;
  Status CheckLayoutLocked(int64_t want_slots, const char* optimizer) const;
  // Adds blocks until `rows` rows fit; nothing on failure.
  Status ReserveLocked(int64_t rows);
  // Writes the slot initial values into `row`.
  void ResetSlotsLocked(float* row) const;

  const int64_t dim_;
  const int64_t block_rows_;
  const std::string name_;

  mutable std::shared_mutex mu_;
  int64_t size_ = 0;                             // guarded by mu_
  int64_t num_slots_ = -1;                       // guarded by mu_: -1 until SetSlots
  std::vector<float> slot_initial_values_;       // guarded by mu_
  std::vector<std::unique_ptr<float[]>> blocks_;  // guarded by mu_: block_rows_ rows each
};

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_CORE_ROW_STORE_H_

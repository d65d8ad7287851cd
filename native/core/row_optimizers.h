// Fused row updates of the lazy table optimizers: one pass over a batch's
// distinct rows updates each row and its slots together (mxRec's "fusion
// optimizer" idea; the math of tf.keras / TF's sparse apply ops, row-wise).
// No TensorFlow includes: native/kernels/row_optimizer_kernels.cc calls these
// on the buffers of the table variable and its slot variables, and the Python
// hash optimizers (mxrec_pipeline/optimizers) keep a TF-op reference of each.
//
// Every update function: `var` and its slots are [capacity, dim] row-major
// float32; rows (n) are distinct and in [0, capacity) (callers check); grad is
// [n, dim], grad[i] the summed gradient of rows[i]. Rows are independent:
// callers may split [begin, end) ranges of the batch over threads. Gradients of
// repeated rows (an IndexedSlices gradient as autodiff gives it) are summed
// first by SumRepeatedRows; the gradients of a lookup's ids, whose insertion
// gave their restore indices, are summed per distinct row by SumByRestore
// instead (no hashing: the restore index is the row's position).
#ifndef MXREC_PIPELINE_NATIVE_CORE_ROW_OPTIMIZERS_H_
#define MXREC_PIPELINE_NATIVE_CORE_ROW_OPTIMIZERS_H_

#include <cstdint>
#include <vector>

namespace mxrec {

// Sums the gradients of repeated rows, as TF's sparse apply ops do (tf.unique +
// unsorted_segment_sum, in one pass). rows (n) may repeat; grad is [n, dim].
// Returns false when the rows are distinct (the common case: the callers then
// use rows and grad as they are, nothing copied). Otherwise `unique` holds the
// distinct rows in first-occurrence order and `summed` [u, dim] the sum of
// their gradients, added in order of position. n < 2^31.
// `capacity`: rows are in [0, capacity) (callers check); a bitmap of capacity
// bits then tells distinct rows apart without hashing when it is small next to
// the rows' gradients (capacity <= 1024 * n).
bool SumRepeatedRows(const int64_t* rows,  // (n)
                     const float* grad,    // (n, dim)
                     int64_t n, int64_t dim, int64_t capacity,
                     std::vector<int64_t>* unique,  // out: (u)
                     std::vector<float>* summed);   // out: (u, dim)

// Whether rows (n), each in [0, capacity), are distinct, by a bitmap of
// capacity bits (capacity / 8 bytes, zeroed per call).
bool RowsAreDistinct(const int64_t* rows, int64_t n, int64_t capacity);

// The first position whose restore value is outside [0, num_unique), or -1.
int64_t FindBadRestore(const int32_t* restore, int64_t n, int64_t num_unique);

// summed[u] = the sum of grad[i] over the positions i with restore[i] == u,
// added in order of i, for u in [begin, end) (zeros for a u without
// positions): rows [begin, end) of TF's unsorted_segment_sum(grad, restore,
// num_unique). restore (n) holds positions among a batch's distinct rows (key
// index insertion's restore indices), checked by FindBadRestore. Reads grad in
// order (rows of other ranges skipped), so that ranges of distinct rows can be
// summed on different threads, each reading restore whole.
void SumByRestore(const float* grad,  // (n, dim)
                  const int32_t* restore, int64_t n, int64_t dim, int64_t begin, int64_t end,
                  float* summed);  // out: (num_unique, dim), rows [begin, end) written

// out[i] = unique[restore[i]] for the ids i in [begin, end): rows [begin, end)
// of tf.gather(unique, restore), the forward half of SumByRestore's pair. unique
// is [num_unique, dim]; restore values are in [0, num_unique) (checked by
// FindBadRestore); out is [n, dim]. Ranges of ids may go to different threads.
void GatherByRestore(const float* unique, const int32_t* restore, int64_t dim, int64_t begin,
                     int64_t end, float* out);

// Lazy Adam (tf.keras / mxRec lazy Adam, Kingma & Ba 2015 with the bias
// correction folded into lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t)):
//   m = beta1 * m + (1 - beta1) * g
//   v = beta2 * v + (1 - beta2) * g^2
//   var -= lr_t * m / (sqrt(v) + epsilon)
// or, with `epsilon_inside_sqrt` (TPUEmbedding's Adam, sum_inside_sqrt=True),
//   var -= lr_t * m / sqrt(v + epsilon^2)
void LazyAdamRows(float* var, float* m, float* v, int64_t dim, const int64_t* rows,
                  const float* grad, int64_t begin, int64_t end, float lr_t, float beta1,
                  float beta2, float epsilon, bool epsilon_inside_sqrt = false);

// Adagrad (TF's ResourceSparseApplyAdagrad without update_slots=false):
//   acc += g^2;  var -= lr * g / sqrt(acc)
void AdagradRows(float* var, float* acc, int64_t dim, const int64_t* rows, const float* grad,
                 int64_t begin, int64_t end, float lr);

// SGD with optional weight decay (mxRec's GradientDescent):
//   var -= lr * (g + weight_decay * var)
void SgdRows(float* var, int64_t dim, const int64_t* rows, const float* grad, int64_t begin,
             int64_t end, float lr, float weight_decay);

// FTRL-Proximal (McMahan et al. 2013, as TF's ApplyFtrlV2), n = accum,
// z = linear, p = power = -learning_rate_power:
//   g_s = g + 2 * l2_shrinkage * w;  n_new = n + g^2
//   z += g_s - (n_new^p - n^p) / lr * w
//   w = |z| > l1 ? (sign(z) * l1 - z) / (n_new^p / lr + 2 * l2) : 0;  n = n_new
void FtrlRows(float* var, float* accum, float* linear, int64_t dim, const int64_t* rows,
              const float* grad, int64_t begin, int64_t end, float lr, float power, float l1,
              float l2, float l2_shrinkage);

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_CORE_ROW_OPTIMIZERS_H_

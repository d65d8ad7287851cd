// See segment_combine.h.
#include "segment_combine.h"

#include <cmath>
#include <cstdint>

namespace mxrec {

float CombinerNorm(Combiner combiner, int64_t count) {
  if (count <= 1 || combiner == Combiner::kSum) return 1.0f;
  const float n = static_cast<float>(count);
  return combiner == Combiner::kMean ? n : std::sqrt(n);
}

template <typename Split>
void SegmentCombine(Combiner combiner, const float* values, const Split* row_splits, int64_t dim,
                    int64_t begin, int64_t end, float* out) {
  for (int64_t s = begin; s < end; ++s) {
    const int64_t first = row_splits[s], last = row_splits[s + 1];
    float* o = out + s * dim;
    for (int64_t j = 0; j < dim; ++j) o[j] = 0.0f;
    for (int64_t i = first; i < last; ++i) {
      const float* v = values + i * dim;
      for (int64_t j = 0; j < dim; ++j) o[j] += v[j];
    }
    const float norm = CombinerNorm(combiner, last - first);
    if (norm != 1.0f) {
      for (int64_t j = 0; j < dim; ++j) o[j] /= norm;
    }
  }
}

template <typename Split>
void SegmentCombineGrad(Combiner combiner, const float* grad, const Split* row_splits,
                        int64_t dim, int64_t begin, int64_t end, float* values_grad) {
  for (int64_t s = begin; s < end; ++s) {
    const int64_t first = row_splits[s], last = row_splits[s + 1];
    const float norm = CombinerNorm(combiner, last - first);
    const float* g = grad + s * dim;
    for (int64_t i = first; i < last; ++i) {
      float* out = values_grad + i * dim;
      for (int64_t j = 0; j < dim; ++j) out[j] = g[j] / norm;
    }
  }
}

template void SegmentCombine<int32_t>(Combiner, const float*, const int32_t*, int64_t, int64_t,
                                      int64_t, float*);
template void SegmentCombine<int64_t>(Combiner, const float*, const int64_t*, int64_t, int64_t,
                                      int64_t, float*);
template void SegmentCombineGrad<int32_t>(Combiner, const float*, const int32_t*, int64_t,
                                          int64_t, int64_t, float*);
template void SegmentCombineGrad<int64_t>(Combiner, const float*, const int64_t*, int64_t,
                                          int64_t, int64_t, float*);

}  // namespace mxrec

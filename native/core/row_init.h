// Initial rows of an embedding table as a function of (seed, global row,
// column) alone: the math behind mxrec_pipeline.core.initializers.RowInitializer,
// which a flat table (all rows at once, by position) and a tiered table (each
// row when its id first reaches the device cache) share, so that a key gets the
// same initial embedding wherever it lives. No TensorFlow includes: the MxRowInit
// op (native/kernels/row_init_kernels.cc) wraps InitialRows.
//
// Element (g, j) of a table of `dim` columns is drawn from SplitMix64 (Steele,
// Lea, Flood, "Fast splittable pseudorandom number generators", OOPSLA 2014) at
// counter c = g * dim + j (mod 2^64):
//   x = c * 0x9E3779B97F4A7C15 + seed;
//   x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9;
//   x = (x ^ (x >> 27)) * 0x94D049BB133111EB;
//   x ^= x >> 31;
//   u = ((x >> 11) + 0.5) * 2^-53, a uniform in (0, 1).
// Then, by kind:
//   uniform:          minval + u * (maxval - minval), u rounded to double, and
//                     kept below maxval once rounded to float32: in [minval,
//                     maxval) as Keras' RandomUniform.
//   truncated_normal: mean + stddev * Phi^-1(Phi(-2) + u * (Phi(2) - Phi(-2))),
//                     exactly the normal truncated at 2 stddev (Keras'
//                     TruncatedNormal), by inversion instead of resampling.
//   normal:           mean + stddev * Phi^-1(u).
//   constant:         value.
// and then out = (float)(value * scale). For the normal kinds u is held
// exactly, as its distance to the nearer end (u or 1 - u, in (0, 1/2), exact in
// double) and a side, so that the tails are as accurate as the centre and the
// distributions exactly symmetric. The math is in double throughout.
//
// Phi^-1 (Ndtri) is Wichura's rational approximation, "Algorithm AS 241: The
// percentage points of the normal distribution", Applied Statistics 37(3),
// 477-484, 1988 (PPND16), in double: about 1e-16 relative error (within 3e-14
// of the root found with std::erfc, native/tests/row_init_test.cc), with no
// iteration and no erf/exp calls (the tails, p < 0.075, take one log and one
// sqrt).
#ifndef MXREC_PIPELINE_NATIVE_CORE_ROW_INIT_H_
#define MXREC_PIPELINE_NATIVE_CORE_ROW_INIT_H_

#include <cstdint>

namespace mxrec {

enum class RowInitKind { kTruncatedNormal, kNormal, kUniform, kConstant };

// The distribution of the initial values (the fields of its kind are used, the
// others ignored) and the factor applied to every value.
struct RowInitSpec {
  RowInitKind kind;
  double mean, stddev;    // truncated_normal, normal (stddev > 0).
  double minval, maxval;  // uniform (minval <= maxval).
  double value;           // constant.
  double scale;           // Applied to every value, after the distribution.
  uint64_t seed;
};

// Writes the initial rows of `globals[0..n)` (each >= 0; the caller checks) to
// `out`, n x dim row-major: row i is global row globals[i], whatever the other
// globals and n. Deterministic; no allocation; single-threaded (split `globals`
// to parallelize: the rows do not depend on one another).
void InitialRows(const RowInitSpec& spec, const int64_t* globals, int64_t n, int64_t dim,
                 float* out);

// The inverse of the standard normal CDF (AS 241): x with Phi(x) = p, for p in
// (0, 1); -inf at 0, +inf at 1, NaN outside [0, 1] or for NaN.
double Ndtri(double p);

// The uniform u of element counter `counter` (g * dim + j) of a table with
// `seed`, as above, rounded to double (in (0, 1]: the top value, 1 - 2^-54,
// rounds to 1).
double RowInitUniform(uint64_t seed, uint64_t counter);

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_CORE_ROW_INIT_H_

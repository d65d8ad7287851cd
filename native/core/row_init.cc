#include "row_init.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace mxrec {
namespace {

constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;
constexpr uint64_t kMix1 = 0xBF58476D1CE4E5B9ULL;
constexpr uint64_t kMix2 = 0x94D049BB133111EBULL;
// The low 52 of the 53 bits of x >> 11.
constexpr uint64_t kLow52 = (uint64_t{1} << 52) - 1;
constexpr double kTwoToMinus53 = 1.0 / 9007199254740992.0;  // 2^-53

// SplitMix64's output function of the state `x` (= counter * kGolden + seed).
inline uint64_t Mix(uint64_t x) {
  x = (x ^ (x >> 30)) * kMix1;
  x = (x ^ (x >> 27)) * kMix2;
  return x ^ (x >> 31);
}

// u = ((bits >> 11) + 0.5) * 2^-53 as its distance to the nearer end, t = u
// for u < 1/2 and 1 - u above (the top bit of `bits` says which): in (0, 1/2),
// exact (t * 2^53 = m + 0.5 with m < 2^52).
inline double HalfUniform(uint64_t bits) {
  const uint64_t k = bits >> 11;
  // 2^53 - 1 - k in the upper half (the complement of k's low 52 bits), else k.
  const uint64_t m = (k ^ (uint64_t{0} - (k >> 52))) & kLow52;
  // Through int64: the signed conversion is one instruction, the unsigned one
  // a branch.
  return (static_cast<double>(static_cast<int64_t>(m)) + 0.5) * kTwoToMinus53;
}

// x with its sign bit flipped where `sign_bit` (0 or 1 << 63) has it: a
// negation without a branch, which would mispredict half the time.
inline double FlipSign(double x, uint64_t sign_bit) {
  uint64_t bits;
  std::memcpy(&bits, &x, sizeof bits);
  bits ^= sign_bit;
  std::memcpy(&x, &bits, sizeof x);
  return x;
}

// u = ((bits >> 11) + 0.5) * 2^-53 rounded to double: in (0, 1], 1 only for
// the top value of bits >> 11.
inline double Uniform(uint64_t bits) {
  return (static_cast<double>(static_cast<int64_t>(bits >> 11)) + 0.5) * kTwoToMinus53;
}

// a[0] + a[1] r + ... + a[7] r^7.
inline double Poly7(const double (&a)[8], double r) {
  return ((((((a[7] * r + a[6]) * r + a[5]) * r + a[4]) * r + a[3]) * r + a[2]) * r + a[1]) * r +
         a[0];
}

// The coefficients of AS 241 (PPND16): numerator and denominator of the centre
// (|p - 1/2| <= 0.425), the near tail (r = sqrt(-log p) <= 5) and the far tail.
constexpr double kCentreNum[8] = {
    3.3871328727963666080e+0, 1.3314166789178437745e+2, 1.9715909503065514427e+3,
    1.3731693765509461125e+4, 4.5921953931549871457e+4, 6.7265770927008700853e+4,
    3.3430575583588128105e+4, 2.5090809287301226727e+3};
constexpr double kCentreDen[8] = {
    1.0,                      4.2313330701600911252e+1, 6.8718700749205790830e+2,
    5.3941960214247511077e+3, 2.1213794301586595867e+4, 3.9307895800092710610e+4,
    2.8729085735721942674e+4, 5.2264952788528545610e+3};
constexpr double kNearNum[8] = {
    1.42343711074968357734e+0, 4.63033784615654529590e+0, 5.76949722146069140550e+0,
    3.64784832476320460504e+0, 1.27045825245236838258e+0, 2.41780725177450611770e-1,
    2.27238449892691845833e-2, 7.74545014278341407640e-4};
constexpr double kNearDen[8] = {
    1.0,                       2.05319162663775882187e+0, 1.67638483018380384940e+0,
    6.89767334985100004550e-1, 1.48103976427480074590e-1, 1.51986665636164571966e-2,
    5.47593808499534494600e-4, 1.05075007164441684324e-9};
constexpr double kFarNum[8] = {
    6.65790464350110377720e+0, 5.46378491116411436990e+0, 1.78482653991729133580e+0,
    2.96560571828504891230e-1, 2.65321895265761230930e-2, 1.24266094738807843860e-3,
    2.71155556874348757815e-5, 2.01033439929228813265e-7};
constexpr double kFarDen[8] = {
    1.0,                       5.99832206555887937690e-1, 1.36929880922735805310e-1,
    1.48753612908506148525e-2, 7.86869131145613259100e-4, 1.84631831751005468180e-5,
    1.42151175831644588870e-7, 2.04426310338993978564e-15};

// The bound of AS 241's centre: |p - 1/2| <= 0.425, p >= 0.075 in the lower
// half.
constexpr double kCentreHalfWidth = 0.425;

// AS 241's centre, for q = p - 1/2 in [-0.425, 0.425].
inline double NdtriCentre(double q) {
  const double r = 0.180625 - q * q;
  return q * Poly7(kCentreNum, r) / Poly7(kCentreDen, r);
}

// AS 241's lower tail, for p in (0, 0.075): Phi^-1(p) < 0.
inline double NdtriLowerTail(double p) {
  const double r = std::sqrt(-std::log(p));
  if (r <= 5.0) {  // p >= exp(-25), about 1.4e-11.
    return -Poly7(kNearNum, r - 1.6) / Poly7(kNearDen, r - 1.6);
  }
  return -Poly7(kFarNum, r - 5.0) / Poly7(kFarDen, r - 5.0);
}

// AS 241 for p in (0, 1/2]: Phi^-1(p) <= 0.
inline double NdtriLowerHalf(double p) {
  const double q = p - 0.5;
  return q >= -kCentreHalfWidth ? NdtriCentre(q) : NdtriLowerTail(p);
}

// The row loop of the uniform kind: `value(bits)` is the unscaled value of the
// element whose SplitMix64 output is `bits`.
template <typename Value>
void Fill(const int64_t* globals, int64_t n, int64_t dim, uint64_t seed, double scale,
          Value&& value, float* out) {
  const uint64_t columns = static_cast<uint64_t>(dim);
  for (int64_t i = 0; i < n; ++i) {
    // SplitMix64's state at counter g * dim, then one kGolden per column.
    uint64_t state = static_cast<uint64_t>(globals[i]) * columns * kGolden + seed;
    float* row = out + i * dim;
    for (int64_t j = 0; j < dim; ++j, state += kGolden) {
      row[j] = static_cast<float>(value(Mix(state)) * scale);
    }
  }
}

// The row loop of the normal kinds: element value (mean + stddev * z) * scale,
// z = +-max(Phi^-1(low + t * width), z_min) for the HalfUniform t of its bits,
// negative for u < 1/2 (normal: low 0, width 1, z_min -inf; truncated: Phi(-2),
// 1 - 2 Phi(-2), -2).
//
// Written for speed (nearly 2x faster than one branchy loop): a row goes in
// blocks of up to 64 elements, in passes. The integer pass (SplitMix64, t, the
// sign) marks the elements in AS 241's tail (about one in seven) in a bit mask,
// not by a branch, which would mispredict. The centre formula then runs on
// every element without a branch, which the compiler vectorizes (its
// denominator stays positive, from 1 down to 0.002, over the tail's r =
// 0.180625 - q^2 in (-0.07, 0], so the tail elements get finite values there),
// and the marked elements are recomputed by the tail formula.
void FillNormal(const int64_t* globals, int64_t n, int64_t dim, uint64_t seed, double low,
                double width, double z_min, double mean, double stddev, double scale,
                float* out) {
  constexpr int kBlock = 64;  // The bits of the tail mask.
  constexpr uint64_t kSignBit = uint64_t{1} << 63;
  double p[kBlock];
  double z[kBlock];
  uint64_t sign[kBlock];  // The sign bit to give z: set for u > 1/2.
  const uint64_t columns = static_cast<uint64_t>(dim);
  for (int64_t i = 0; i < n; ++i) {
    uint64_t state = static_cast<uint64_t>(globals[i]) * columns * kGolden + seed;
    float* row = out + i * dim;
    for (int64_t begin = 0; begin < dim; begin += kBlock) {
      const int size = static_cast<int>(std::min<int64_t>(kBlock, dim - begin));
      uint64_t tail_mask = 0;  // Bit k: element k is in the tail.
      for (int k = 0; k < size; ++k, state += kGolden) {
        const uint64_t bits = Mix(state);
        p[k] = low + HalfUniform(bits) * width;
        sign[k] = bits & kSignBit;
        tail_mask |= static_cast<uint64_t>(p[k] < 0.5 - kCentreHalfWidth) << k;
      }
      for (int k = 0; k < size; ++k) z[k] = NdtriCentre(p[k] - 0.5);
      for (; tail_mask != 0; tail_mask &= tail_mask - 1) {
        const int k = __builtin_ctzll(tail_mask);
        z[k] = NdtriLowerTail(p[k]);
      }
      for (int k = 0; k < size; ++k) {
        const double signed_z = FlipSign(std::max(z[k], z_min), sign[k]);
        row[begin + k] = static_cast<float>((mean + stddev * signed_z) * scale);
      }
    }
  }
}

}  // namespace

double Ndtri(double p) {
  if (!(p > 0.0)) return p == 0.0 ? -std::numeric_limits<double>::infinity()
                                  : std::numeric_limits<double>::quiet_NaN();
  if (!(p < 1.0)) return p == 1.0 ? std::numeric_limits<double>::infinity()
                                  : std::numeric_limits<double>::quiet_NaN();
  // 1 - p is exact for p in [1/2, 1).
  return p <= 0.5 ? NdtriLowerHalf(p) : -NdtriLowerHalf(1.0 - p);
}

double RowInitUniform(uint64_t seed, uint64_t counter) {
  return Uniform(Mix(counter * kGolden + seed));
}

void InitialRows(const RowInitSpec& spec, const int64_t* globals, int64_t n, int64_t dim,
                 float* out) {
  if (n <= 0 || dim <= 0) return;
  switch (spec.kind) {
    case RowInitKind::kConstant:
      std::fill(out, out + n * dim, static_cast<float>(spec.value * spec.scale));
      return;
    case RowInitKind::kUniform: {
      const double minval = spec.minval, width = spec.maxval - spec.minval;
      // The largest value kept: the float below float(maxval), so that values
      // rounded to float32 stay below maxval (and never under minval).
      const double below_max = std::max<double>(
          std::nextafter(static_cast<float>(spec.maxval), -std::numeric_limits<float>::infinity()),
          spec.minval);
      Fill(globals, n, dim, spec.seed, spec.scale, [&](uint64_t bits) {
        return std::min(minval + Uniform(bits) * width, below_max);
      }, out);
      return;
    }
    case RowInitKind::kNormal:
      FillNormal(globals, n, dim, spec.seed, 0.0, 1.0, -std::numeric_limits<double>::infinity(),
                 spec.mean, spec.stddev, spec.scale, out);
      return;
    case RowInitKind::kTruncatedNormal: {
      // Phi(-2), and Phi(2) - Phi(-2) = 1 - 2 Phi(-2): t in (0, 1/2) maps into
      // (Phi(-2), 1/2), and 1 - t to its mirror image.
      const double low = 0.5 * std::erfc(std::sqrt(2.0));
      FillNormal(globals, n, dim, spec.seed, low, 1.0 - 2.0 * low, -2.0, spec.mean, spec.stddev,
                 spec.scale, out);
      return;
    }
  }
}

}  // namespace mxrec

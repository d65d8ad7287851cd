#include "row_optimizers.h"

#include <cmath>

#include "key_index.h"

namespace mxrec {

bool SumRepeatedRows(const int64_t* rows, const float* grad, int64_t n, int64_t dim,
                     std::vector<int64_t>* unique, std::vector<float>* summed) {
  std::vector<int32_t> position(static_cast<size_t>(n));
  Deduplicate(rows, n, unique, position.data());
  if (static_cast<int64_t>(unique->size()) == n) return false;
  summed->assign(unique->size() * static_cast<size_t>(dim), 0.0f);
  for (int64_t i = 0; i < n; ++i) {
    float* __restrict out = summed->data() + position[i] * dim;
    const float* __restrict g = grad + i * dim;
    for (int64_t j = 0; j < dim; ++j) out[j] += g[j];
  }
  return true;
}

void LazyAdamRows(float* var, float* m, float* v, int64_t dim, const int64_t* rows,
                  const float* grad, int64_t begin, int64_t end, float lr_t, float beta1,
                  float beta2, float epsilon, bool epsilon_inside_sqrt) {
  const float one_minus_beta1 = 1.0f - beta1;
  const float one_minus_beta2 = 1.0f - beta2;
  const float epsilon_squared = epsilon * epsilon;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t offset = rows[i] * dim;
    float* __restrict w = var + offset;
    float* __restrict mr = m + offset;
    float* __restrict vr = v + offset;
    const float* __restrict g = grad + i * dim;
    for (int64_t j = 0; j < dim; ++j) {
      const float m_new = beta1 * mr[j] + one_minus_beta1 * g[j];
      const float v_new = beta2 * vr[j] + one_minus_beta2 * (g[j] * g[j]);
      mr[j] = m_new;
      vr[j] = v_new;
      w[j] -= epsilon_inside_sqrt ? lr_t * m_new / std::sqrt(v_new + epsilon_squared)
                                  : lr_t * m_new / (std::sqrt(v_new) + epsilon);
    }
  }
}

void AdagradRows(float* var, float* acc, int64_t dim, const int64_t* rows, const float* grad,
                 int64_t begin, int64_t end, float lr) {
  for (int64_t i = begin; i < end; ++i) {
    const int64_t offset = rows[i] * dim;
    float* __restrict w = var + offset;
    float* __restrict a = acc + offset;
    const float* __restrict g = grad + i * dim;
    for (int64_t j = 0; j < dim; ++j) {
      const float a_new = a[j] + g[j] * g[j];
      a[j] = a_new;
      w[j] -= lr * g[j] / std::sqrt(a_new);
    }
  }
}

void SgdRows(float* var, int64_t dim, const int64_t* rows, const float* grad, int64_t begin,
             int64_t end, float lr, float weight_decay) {
  for (int64_t i = begin; i < end; ++i) {
    float* __restrict w = var + rows[i] * dim;
    const float* __restrict g = grad + i * dim;
    for (int64_t j = 0; j < dim; ++j) w[j] -= lr * (g[j] + weight_decay * w[j]);
  }
}

void FtrlRows(float* var, float* accum, float* linear, int64_t dim, const int64_t* rows,
              const float* grad, int64_t begin, int64_t end, float lr, float power, float l1,
              float l2, float l2_shrinkage) {
  const bool sqrt_power = power == 0.5f;
  for (int64_t i = begin; i < end; ++i) {
    const int64_t offset = rows[i] * dim;
    float* __restrict w = var + offset;
    float* __restrict n = accum + offset;
    float* __restrict z = linear + offset;
    const float* __restrict g = grad + i * dim;
    for (int64_t j = 0; j < dim; ++j) {
      const float shrunk = l2_shrinkage != 0.0f ? g[j] + 2.0f * l2_shrinkage * w[j] : g[j];
      const float n_new = n[j] + g[j] * g[j];
      const float n_new_p = sqrt_power ? std::sqrt(n_new) : std::pow(n_new, power);
      const float n_p = sqrt_power ? std::sqrt(n[j]) : std::pow(n[j], power);
      const float z_new = z[j] + shrunk - (n_new_p - n_p) / lr * w[j];
      const float quadratic = n_new_p / lr + 2.0f * l2;
      const float sign = z_new > 0.0f ? 1.0f : (z_new < 0.0f ? -1.0f : 0.0f);
      w[j] = std::fabs(z_new) > l1 ? (sign * l1 - z_new) / quadratic : 0.0f;
      z[j] = z_new;
      n[j] = n_new;
    }
  }
}

}  // namespace mxrec

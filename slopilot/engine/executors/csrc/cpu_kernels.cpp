// Fused float32 CPU kernels for the decode step's non-GEMM work (docs/benchmarks.md,
// "The step against its own GEMMs"): at decode's batch sizes each eager torch op costs
// more in dispatch, allocation and passes over memory than in arithmetic, and the K/V
// gather before attention copies the whole context of every row on every layer.
//
// Each op here replaces a handful of torch calls with one pass: RMSNorm, SwiGLU's
// silu-and-mul, the rotary embedding (in place), the KV-cache write of keys and values,
// decode attention read straight from the paged cache through each row's slots, and
// greedy sampling's argmax. One GEMM is here too, for the few rows a decode step has:
// see "Small-batch GEMM" below.
// Elementwise ops keep the torch path's rounding (the build turns off FMA contraction);
// the two reductions (RMSNorm's sum of squares, attention's softmax) sum in a different
// order, so they match torch to float32 rounding, not bit for bit.
//
// Registered as torch.ops.slopilot.*; slopilot/engine/executors/native_kernels.py builds
// and loads this file, and tests/engine/test_native_kernels.py holds every op against
// the torch path it replaces.

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/cpu/vec/functional.h>
#include <ATen/cpu/vec/vec.h>
#include <torch/library.h>

#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
#include <immintrin.h>
#endif

#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

namespace {

using at::Tensor;
using Vec = at::vec::Vectorized<float>;
constexpr int64_t kLanes = Vec::size();

// Rows per parallel task: below this much work a fork-join costs more than it saves.
int64_t grain_rows(int64_t row_elems) {
  constexpr int64_t kWork = 32768;
  return std::max<int64_t>(1, kWork / std::max<int64_t>(1, row_elems));
}

void check_float_cpu(const Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.device().is_cpu(), name, " must be a CPU tensor");
  TORCH_CHECK(t.scalar_type() == at::kFloat, name, " must be float32, got ",
              t.scalar_type());
  TORCH_CHECK(t.dim() == dim, name, " must have ", dim, " dims, got ", t.dim());
  TORCH_CHECK(t.stride(dim - 1) == 1, name, "'s last dim must be contiguous");
}

void check_slots(const Tensor& slots, const char* name) {
  TORCH_CHECK(slots.device().is_cpu() && slots.scalar_type() == at::kLong,
              name, " must be a CPU int64 tensor");
  TORCH_CHECK(slots.is_contiguous(), name, " must be contiguous");
}

float lane_sum(Vec v) {
  return at::vec::vec_reduce_all<float>([](Vec& a, Vec& b) { return a + b; }, v);
}

float dot(const float* a, const float* b, int64_t n) {
  Vec acc(0.f);
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    acc = at::vec::fmadd(Vec::loadu(a + i), Vec::loadu(b + i), acc);
  float total = lane_sum(acc);
  for (; i < n; ++i) total += a[i] * b[i];
  return total;
}

// The eight sums of a0..a7's lanes, into out[0..7].
void sum_lanes8(const Vec* a, float* out) {
#if defined(CPU_CAPABILITY_AVX2) || defined(CPU_CAPABILITY_AVX512)
  __m256 h[8];
  for (int j = 0; j < 8; ++j) {
#if defined(CPU_CAPABILITY_AVX512)
    // A 16-lane vector folds to 8 lanes (its halves added), then goes on as AVX2's.
    const __m512 v = a[j];
    h[j] = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
#else
    h[j] = a[j];
#endif
  }
  const __m256 s01 = _mm256_hadd_ps(h[0], h[1]), s23 = _mm256_hadd_ps(h[2], h[3]);
  const __m256 s45 = _mm256_hadd_ps(h[4], h[5]), s67 = _mm256_hadd_ps(h[6], h[7]);
  const __m256 lo4 = _mm256_hadd_ps(s01, s23), hi4 = _mm256_hadd_ps(s45, s67);
  // Each 128-bit half holds a partial sum of the eight: add the halves across.
  _mm256_storeu_ps(out, _mm256_add_ps(_mm256_permute2f128_ps(lo4, hi4, 0x20),
                                      _mm256_permute2f128_ps(lo4, hi4, 0x31)));
#else
  for (int j = 0; j < 8; ++j) out[j] = lane_sum(a[j]);
#endif
}

// q . k for eight keys at once: eight independent FMA chains instead of one, and one
// horizontal reduction for all eight.
void dot8(const float* q, const float* const* keys, int64_t n, float* out) {
  Vec acc[8] = {Vec(0.f), Vec(0.f), Vec(0.f), Vec(0.f),
                Vec(0.f), Vec(0.f), Vec(0.f), Vec(0.f)};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    const Vec qv = Vec::loadu(q + i);
    for (int j = 0; j < 8; ++j) acc[j] = at::vec::fmadd(qv, Vec::loadu(keys[j] + i), acc[j]);
  }
  sum_lanes8(acc, out);
  for (; i < n; ++i)
    for (int j = 0; j < 8; ++j) out[j] += q[i] * keys[j][i];
}

// weight * (x * rsqrt(mean(x^2) + eps)), Hugging Face's LlamaRMSNorm in float32.
Tensor rms_norm(const Tensor& x, const Tensor& weight, double eps) {
  check_float_cpu(x, "x", 2);
  check_float_cpu(weight, "weight", 1);
  const int64_t rows = x.size(0), cols = x.size(1);
  TORCH_CHECK(weight.size(0) == cols, "weight has ", weight.size(0),
              " elements for rows of ", cols);
  Tensor out = at::empty({rows, cols}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xs = x.stride(0);
  at::parallel_for(0, rows, grain_rows(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * xs;
      float* dst = op + r * cols;
      const float inv = 1.f / std::sqrt(dot(row, row, cols) / cols +
                                        static_cast<float>(eps));
      const Vec vinv(inv);
      int64_t i = 0;
      for (; i + kLanes <= cols; i += kLanes)
        ((Vec::loadu(row + i) * vinv) * Vec::loadu(wp + i)).store(dst + i);
      for (; i < cols; ++i) dst[i] = (row[i] * inv) * wp[i];
    }
  });
  return out;
}

// torch's own CPU silu, x / (1 + exp(-x)), times up: the vector body (Sleef's exp) and
// the scalar one torch's loop ends on.
inline Vec silu_mul(Vec g, Vec up) { return (g / (Vec(1.f) + g.neg().exp())) * up; }
inline float silu_mul(float g, float up) { return (g / (1.f + std::exp(-g))) * up; }

// Where torch's vectorized silu loop hands a row of n over to its scalar tail: it takes
// two vectors a step.
inline int64_t silu_vector_end(int64_t n) { return n / (2 * kLanes) * (2 * kLanes); }

// silu(gate) * up over the fused [gate | up] projection output [rows, 2 * inter].
Tensor silu_and_mul(const Tensor& gate_up) {
  check_float_cpu(gate_up, "gate_up", 2);
  const int64_t rows = gate_up.size(0), inter = gate_up.size(1) / 2;
  TORCH_CHECK(gate_up.size(1) == 2 * inter, "gate_up's last dim must be even");
  Tensor out = at::empty({rows, inter}, gate_up.options());
  const float* gp = gate_up.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t gs = gate_up.stride(0);
  const int64_t vector_end = silu_vector_end(inter);
  at::parallel_for(0, rows, grain_rows(inter), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* gate = gp + r * gs;
      const float* up = gate + inter;
      float* dst = op + r * inter;
      // The vector body up to where torch's ends, its scalar tail after: same bits.
      int64_t i = 0;
      for (; i < vector_end; i += kLanes)
        silu_mul(Vec::loadu(gate + i), Vec::loadu(up + i)).store(dst + i);
      for (; i < inter; ++i) dst[i] = silu_mul(gate[i], up[i]);
    }
  });
  return out;
}

// In place: x[t, h] = x[t, h] * cos[t] + swap_halves(x[t, h]) * signed_sin[t], the
// rotation Rope.apply computes (signed_sin's first half is -sin). x: [tokens, heads,
// head_dim] with any token and head strides; cos, signed_sin: [tokens, 1, head_dim].
void rotary_(Tensor x, const Tensor& cos, const Tensor& signed_sin) {
  check_float_cpu(x, "x", 3);
  check_float_cpu(cos, "cos", 3);
  check_float_cpu(signed_sin, "signed_sin", 3);
  const int64_t tokens = x.size(0), heads = x.size(1), dim = x.size(2);
  TORCH_CHECK(dim % 2 == 0, "head_dim must be even, got ", dim);
  TORCH_CHECK(cos.size(0) == tokens && cos.size(2) == dim && cos.is_contiguous() &&
                  signed_sin.sizes() == cos.sizes() && signed_sin.is_contiguous(),
              "cos and signed_sin must be contiguous [tokens, 1, head_dim] tables");
  const int64_t half = dim / 2;
  float* xp = x.data_ptr<float>();
  const float* cp = cos.data_ptr<float>();
  const float* sp = signed_sin.data_ptr<float>();
  const int64_t ts = x.stride(0), hs = x.stride(1);
  at::parallel_for(0, tokens, grain_rows(heads * dim), [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float* c = cp + t * dim;
      const float* s = sp + t * dim;
      for (int64_t h = 0; h < heads; ++h) {
        float* a = xp + t * ts + h * hs;
        float* b = a + half;
        int64_t i = 0;
        for (; i + kLanes <= half; i += kLanes) {
          Vec va = Vec::loadu(a + i), vb = Vec::loadu(b + i);
          (va * Vec::loadu(c + i) + vb * Vec::loadu(s + i)).store(a + i);
          (vb * Vec::loadu(c + half + i) + va * Vec::loadu(s + half + i)).store(b + i);
        }
        for (; i < half; ++i) {
          const float va = a[i], vb = b[i];
          a[i] = va * c[i] + vb * s[i];
          b[i] = vb * c[half + i] + va * s[half + i];
        }
      }
    }
  });
}

void check_cache(const Tensor& cache, const char* name) {
  check_float_cpu(cache, name, 3);
  TORCH_CHECK(cache.is_contiguous(), name, " must be contiguous [slots, kv_heads, head_dim]");
}

// k_cache[slots[t]] = k[t] and v_cache[slots[t]] = v[t] for every token, in one pass.
void write_kv(Tensor k_cache, Tensor v_cache, const Tensor& slots, const Tensor& k,
              const Tensor& v) {
  check_cache(k_cache, "k_cache");
  check_cache(v_cache, "v_cache");
  check_slots(slots, "slots");
  check_float_cpu(k, "k", 3);
  check_float_cpu(v, "v", 3);
  const int64_t tokens = slots.size(0), kv_heads = k_cache.size(1), dim = k_cache.size(2);
  const int64_t capacity = k_cache.size(0);
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), "k_cache and v_cache differ in shape");
  TORCH_CHECK(k.size(0) == tokens && k.size(1) == kv_heads && k.size(2) == dim &&
                  v.sizes() == k.sizes(),
              "k and v must be [", tokens, ", ", kv_heads, ", ", dim, "]");
  const int64_t* sl = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < tokens; ++t)
    TORCH_CHECK(sl[t] >= 0 && sl[t] < capacity, "slot ", sl[t], " of token ", t,
                " is outside the cache's ", capacity, " slots");
  const int64_t row = kv_heads * dim;
  auto copy = [&](float* cache, const Tensor& src) {
    const float* sp = src.data_ptr<float>();
    const int64_t s0 = src.stride(0), s1 = src.stride(1);
    for (int64_t t = 0; t < tokens; ++t) {
      float* dst = cache + sl[t] * row;
      if (s1 == dim) {  // the token's heads lie back to back: one copy
        std::memcpy(dst, sp + t * s0, sizeof(float) * row);
        continue;
      }
      for (int64_t h = 0; h < kv_heads; ++h)
        std::memcpy(dst + h * dim, sp + t * s0 + h * s1, sizeof(float) * dim);
    }
  };
  copy(k_cache.data_ptr<float>(), k);
  copy(v_cache.data_ptr<float>(), v);
}

// Ask for the next rows' cache lines ahead of use: the rows sit at scattered slots, so
// the hardware prefetcher cannot see the stream, and the kernel would wait on DRAM.
void prefetch_rows(const float* base, int64_t row, const int64_t* slots, int64_t count,
                   int64_t dim) {
  constexpr int64_t kLineFloats = 16;
  for (int64_t j = 0; j < count; ++j) {
    const float* r = base + slots[j] * row;
    for (int64_t d = 0; d < dim; d += kLineFloats) __builtin_prefetch(r + d);
  }
}

// Raw scores of every query head of one KV head against the row's keys: scores[g *
// width + t] = q_g . k_t. Eight keys at a time, each block of keys used by every head
// while it is in L1 (the heads of a group share their keys).
void group_scores(const float* const* q_heads, int64_t group, const float* kbase,
                  int64_t row, const int64_t* ctx, int64_t len, int64_t dim, int64_t width,
                  float* scores) {
  int64_t t = 0;
  for (; t + 8 <= len; t += 8) {
    const float* keys[8];
    for (int j = 0; j < 8; ++j) keys[j] = kbase + ctx[t + j] * row;
    prefetch_rows(kbase, row, ctx + t + 8, std::min<int64_t>(8, len - t - 8), dim);
    for (int64_t g = 0; g < group; ++g) dot8(q_heads[g], keys, dim, scores + g * width + t);
  }
  for (; t < len; ++t) {
    const float* key = kbase + ctx[t] * row;
    for (int64_t g = 0; g < group; ++g) scores[g * width + t] = dot(q_heads[g], key, dim);
  }
}

// scores[0..len) <- exp(scale * s - max), in place; returns 1 / their sum.
float softmax_(float* scores, int64_t len, float scale) {
  float top = -std::numeric_limits<float>::infinity();
  for (int64_t t = 0; t < len; ++t) {
    scores[t] *= scale;
    top = std::max(top, scores[t]);
  }
  const Vec vtop(top);
  Vec vsum(0.f);
  int64_t t = 0;
  for (; t + kLanes <= len; t += kLanes) {
    Vec p = (Vec::loadu(scores + t) - vtop).exp();
    p.store(scores + t);
    vsum = vsum + p;
  }
  float total = lane_sum(vsum);
  for (; t < len; ++t) {
    scores[t] = std::exp(scores[t] - top);
    total += scores[t];
  }
  return 1.f / total;
}

// acc[g * dim ..] = sum_t p[g * width + t] * v_t for every head of the group: each value
// row is loaded once for all heads, four rows per pass over the accumulators.
void group_values(const float* probs, int64_t group, const float* vbase, int64_t row,
                  const int64_t* ctx, int64_t len, int64_t dim, int64_t width,
                  float* acc) {
  std::fill(acc, acc + group * dim, 0.f);
  int64_t t = 0;
  for (; t + 4 <= len; t += 4) {
    const float* v[4];
    for (int j = 0; j < 4; ++j) v[j] = vbase + ctx[t + j] * row;
    prefetch_rows(vbase, row, ctx + t + 8, std::min<int64_t>(4, len - t - 8), dim);
    for (int64_t g = 0; g < group; ++g) {
      const float* p = probs + g * width + t;
      const Vec p0(p[0]), p1(p[1]), p2(p[2]), p3(p[3]);
      float* a = acc + g * dim;
      int64_t d = 0;
      for (; d + kLanes <= dim; d += kLanes) {
        Vec x = Vec::loadu(a + d);
        x = at::vec::fmadd(p0, Vec::loadu(v[0] + d), x);
        x = at::vec::fmadd(p1, Vec::loadu(v[1] + d), x);
        x = at::vec::fmadd(p2, Vec::loadu(v[2] + d), x);
        at::vec::fmadd(p3, Vec::loadu(v[3] + d), x).store(a + d);
      }
      for (; d < dim; ++d) a[d] += p[0] * v[0][d] + p[1] * v[1][d] + p[2] * v[2][d] + p[3] * v[3][d];
    }
  }
  for (; t < len; ++t) {
    const float* vr = vbase + ctx[t] * row;
    for (int64_t g = 0; g < group; ++g) {
      const Vec p(probs[g * width + t]);
      float* a = acc + g * dim;
      int64_t d = 0;
      for (; d + kLanes <= dim; d += kLanes)
        at::vec::fmadd(p, Vec::loadu(vr + d), Vec::loadu(a + d)).store(a + d);
      for (; d < dim; ++d) a[d] += probs[g * width + t] * vr[d];
    }
  }
}

// Single-token attention for `rows` sequences, read in place from the paged cache.
// q: [rows, heads, head_dim] (any row and head strides); k_cache, v_cache: [slots,
// kv_heads, head_dim]; slots: [rows, width], row i's context in its first lengths[i]
// entries. The query heads that share a KV head are done together, so each key and
// value row is loaded once per KV head. Returns [rows, heads, head_dim].
Tensor decode_attention(const Tensor& q, const Tensor& k_cache, const Tensor& v_cache,
                        const Tensor& slots, const Tensor& lengths, double scale) {
  check_float_cpu(q, "q", 3);
  check_cache(k_cache, "k_cache");
  check_cache(v_cache, "v_cache");
  check_slots(slots, "slots");
  check_slots(lengths, "lengths");
  TORCH_CHECK(v_cache.sizes() == k_cache.sizes(), "k_cache and v_cache differ in shape");
  const int64_t rows = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t kv_heads = k_cache.size(1), capacity = k_cache.size(0);
  TORCH_CHECK(k_cache.size(2) == dim, "q's head_dim ", dim, " differs from the cache's ",
              k_cache.size(2));
  TORCH_CHECK(kv_heads > 0 && heads % kv_heads == 0, "heads (", heads,
              ") must be a multiple of kv_heads (", kv_heads, ")");
  TORCH_CHECK(slots.dim() == 2 && slots.size(0) == rows, "slots must be [", rows,
              ", width]");
  TORCH_CHECK(lengths.dim() == 1 && lengths.size(0) == rows, "lengths must be [", rows, "]");
  const int64_t width = slots.size(1), group = heads / kv_heads;
  const int64_t* sl = slots.data_ptr<int64_t>();
  const int64_t* lp = lengths.data_ptr<int64_t>();
  for (int64_t i = 0; i < rows; ++i) {
    TORCH_CHECK(lp[i] >= 1 && lp[i] <= width, "row ", i, " has context length ", lp[i],
                " for ", width, " slots");
    for (int64_t t = 0; t < lp[i]; ++t) {
      const int64_t s = sl[i * width + t];
      TORCH_CHECK(s >= 0 && s < capacity, "slot ", s, " of row ", i,
                  " is outside the cache's ", capacity, " slots");
    }
  }
  Tensor out = at::empty({rows, heads, dim}, q.options());
  const float* qp = q.data_ptr<float>();
  const float* kc = k_cache.data_ptr<float>();
  const float* vc = v_cache.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), row = kv_heads * dim;
  const float fscale = static_cast<float>(scale);
  at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * width);
    std::vector<float> acc(group * dim);
    std::vector<const float*> q_heads(group);
    std::vector<float> inv_sums(group);
    for (int64_t task = begin; task < end; ++task) {
      const int64_t i = task / kv_heads, kvh = task % kv_heads, len = lp[i];
      const int64_t* ctx = sl + i * width;
      for (int64_t g = 0; g < group; ++g) q_heads[g] = qp + i * qs0 + (kvh * group + g) * qs1;
      group_scores(q_heads.data(), group, kc + kvh * dim, row, ctx, len, dim, width,
                   scores.data());
      for (int64_t g = 0; g < group; ++g)
        inv_sums[g] = softmax_(scores.data() + g * width, len, fscale);
      group_values(scores.data(), group, vc + kvh * dim, row, ctx, len, dim, width,
                   acc.data());
      for (int64_t g = 0; g < group; ++g) {
        float* dst = op + (i * heads + kvh * group + g) * dim;
        const Vec inv(inv_sums[g]);
        const float* a = acc.data() + g * dim;
        int64_t d = 0;
        for (; d + kLanes <= dim; d += kLanes) (Vec::loadu(a + d) * inv).store(dst + d);
        for (; d < dim; ++d) dst[d] = a[d] * inv_sums[g];
      }
    }
  });
  return out;
}

// Index of each row's largest value, as torch.argmax(x, -1) answers: the first NaN if
// the row has one, else the first occurrence of the maximum. torch's CPU argmax walks
// the row one element at a time (1.1 ms for 24 x 49152 logits on the VM measured); a
// vectorised max and a vectorised search for its first position take a tenth of that.
Tensor argmax_rows(const Tensor& x) {
  check_float_cpu(x, "x", 2);
  const int64_t rows = x.size(0), cols = x.size(1);
  TORCH_CHECK(cols > 0, "x must have at least one column");
  Tensor out = at::empty({rows}, x.options().dtype(at::kLong));
  const float* xp = x.data_ptr<float>();
  int64_t* op = out.data_ptr<int64_t>();
  const int64_t xs = x.stride(0);
  at::parallel_for(0, rows, grain_rows(cols), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* row = xp + r * xs;
      Vec vmax(-std::numeric_limits<float>::infinity());
      int64_t i = 0;
      for (; i + kLanes <= cols; i += kLanes)
        vmax = at::vec::maximum(vmax, Vec::loadu(row + i));  // NaN-propagating
      float top = at::vec::vec_reduce_all<float>(
          [](Vec& a, Vec& b) { return at::vec::maximum(a, b); }, vmax);
      for (; i < cols; ++i)
        if (std::isnan(row[i]) || row[i] > top) top = row[i];
      int64_t found = 0;
      if (std::isnan(top)) {
        while (!std::isnan(row[found])) ++found;
      } else {
        const Vec vtop(top);
        for (i = 0; i + kLanes <= cols; i += kLanes) {
          // zero_mask() sets a bit for every lane where (x != top) is false.
          const int equal = (Vec::loadu(row + i) != vtop).zero_mask();
          if (equal != 0) break;
        }
        found = i;
        while (row[found] != top) ++found;
      }
      op[r] = found;
    }
  });
  return out;
}

// ---- Small-batch GEMM (AVX-512 and AVX2 builds) ----------------------------------------
// y = x @ W^T (+ bias) (+ residual) for the handful of rows a decode step has. At 24 rows
// oneDNN's packed kernel runs these shapes at 125-170 GFLOP/s with their weights coming
// from DRAM, half its in-cache rate: at so few rows every weight is used 24 times and then
// never again, so the kernel waits on each weight's cache lines as it reaches them
// (docs/benchmarks.md, "A small-batch GEMM"). This one keeps every row's accumulator in a
// register (24 rows x 16 columns in 24 of the 32 zmm registers; 12 x 8 in 16 ymm on
// AVX2), walks the weight in one-vector-wide panels laid out K-major so each thread reads
// one sequential stream, and asks for each panel's lines 4 KB ahead of use.
//
// The weight is packed once: [N, K] -> [ceil(N/W), K, W] for a panel width W (16 or 8),
// zero columns past N. A fused [gate | up] weight can be packed with its halves
// interleaved instead, [ceil(N/2W), 2, K, W]: the gate panel of columns c..c+W-1 beside
// the up panel of the same columns, so one thread has both in hand and SwiGLU runs in
// the GEMM's epilogue (small_batch_swiglu) instead of a pass of its own over a [rows, N]
// intermediate.
// Each output is the in-order FMA chain over k, then + bias, then + residual (the order of
// oneDNN's post-ops), so it matches F.linear to float32 rounding, not bit for bit.

#if defined(CPU_CAPABILITY_AVX512) || defined(CPU_CAPABILITY_AVX2)
#define SLOPILOT_SMALL_BATCH_GEMM 1
#endif
// A panel is one vector wide: 16 columns on AVX-512, 8 on AVX2.
constexpr int64_t kPanel = kLanes;
// Rows one register block holds: an accumulator each, plus the weight vector and spares
// for the compiler, out of 32 zmm (AVX-512) or 16 ymm (AVX2) registers. More rows run as
// further blocks over the same panel, read again from cache.
#if defined(CPU_CAPABILITY_AVX512)
constexpr int64_t kBlockRows = 24;
#else
constexpr int64_t kBlockRows = 12;
#endif
// Floats ahead of use to prefetch, 4 KB (a sweep on an AVX-512 Xeon gave 32-64 k-steps
// of a 16-wide panel as the best distance; 16 and 256 were slower).
constexpr int64_t kPrefetchAhead = 1024;

// One packed weight's panels: panel q's floats, and the output columns it makes.
struct Panels {
  const float* base;
  int64_t k;
  int64_t count;   // panels
  int64_t n;       // output columns
  int64_t half;    // interleaved halves: columns per half; 0 for the plain packing

  const float* panel(int64_t q) const { return base + q * k * kPanel; }
  int64_t column(int64_t q) const {
    return half == 0 ? q * kPanel : (q % 2) * half + (q / 2) * kPanel;
  }
  int64_t columns(int64_t q) const {
    const int64_t end = half == 0 ? n : (q % 2 + 1) * half;
    return std::min(kPanel, end - column(q));
  }
};

Tensor pack_small_batch_weight(const Tensor& weight, bool halves) {
  check_float_cpu(weight, "weight", 2);
  const int64_t n = weight.size(0), k = weight.size(1);
  TORCH_CHECK(n > 0 && k > 0, "weight must be non-empty, got [", n, ", ", k, "]");
  TORCH_CHECK(!halves || n % 2 == 0, "a weight packed as two halves needs an even row "
              "count, got ", n);
  const Tensor w = weight.contiguous();
  const int64_t half = halves ? n / 2 : 0;
  const int64_t count = halves ? 2 * ((half + kPanel - 1) / kPanel) : (n + kPanel - 1) / kPanel;
  Tensor packed = halves ? at::zeros({count / 2, 2, k, kPanel}, weight.options())
                         : at::zeros({count, k, kPanel}, weight.options());
  const Panels panels{packed.data_ptr<float>(), k, count, n, half};
  const float* src = w.data_ptr<float>();
  float* dst = packed.data_ptr<float>();
  at::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q) {
      float* panel = dst + q * k * kPanel;
      for (int64_t c = 0; c < panels.columns(q); ++c) {
        const float* row = src + (panels.column(q) + c) * k;
        for (int64_t i = 0; i < k; ++i) panel[i * kPanel + c] = row[i];
      }
    }
  });
  return packed;
}

#if defined(SLOPILOT_SMALL_BATCH_GEMM)
// Rows [0, ROWS) of x against one panel: y[r, 0:cols] = x[r] . panel (+ bias, + residual).
template <int ROWS>
void panel_block(const float* x, int64_t k, const float* panel, const float* bias,
                 const float* residual, int64_t ldr, float* y, int64_t ldy, int64_t cols) {
  Vec acc[ROWS];
#pragma GCC unroll 32
  for (int r = 0; r < ROWS; ++r) acc[r] = Vec(0.f);
  for (int64_t i = 0; i < k; ++i) {
    // Past the panel's end the hint reads the next panel's lines, which come next anyway.
    _mm_prefetch(reinterpret_cast<const char*>(panel + i * kPanel + kPrefetchAhead),
                 _MM_HINT_T0);
    const Vec w = Vec::loadu(panel + i * kPanel);
#pragma GCC unroll 32
    for (int r = 0; r < ROWS; ++r) acc[r] = at::vec::fmadd(Vec(x[r * k + i]), w, acc[r]);
  }
  const bool whole = cols >= kPanel;
  const auto load = [whole, cols](const float* p) {
    return whole ? Vec::loadu(p) : Vec::loadu(p, cols);
  };
  const Vec b = bias != nullptr ? load(bias) : Vec(0.f);
#pragma GCC unroll 32
  for (int r = 0; r < ROWS; ++r) {
    Vec v = acc[r];
    if (bias != nullptr) v = v + b;
    if (residual != nullptr) v = v + load(residual + r * ldr);
    if (whole) {
      v.store(y + r * ldy);
    } else {
      v.store(y + r * ldy, cols);
    }
  }
}

using PanelFn = void (*)(const float*, int64_t, const float*, const float*, const float*,
                         int64_t, float*, int64_t, int64_t);

template <size_t... R>
constexpr std::array<PanelFn, sizeof...(R)> panel_table(std::index_sequence<R...>) {
  return {&panel_block<static_cast<int>(R) + 1>...};
}
// panel_blocks[r - 1] handles r rows, 1 <= r <= kBlockRows.
constexpr auto panel_blocks = panel_table(std::make_index_sequence<kBlockRows>{});
#endif

// The packed weight's panels, checked against x's rows and the n columns asked for.
Panels checked_panels(const Tensor& x, const Tensor& packed, int64_t n) {
  check_float_cpu(x, "x", 2);
  TORCH_CHECK(x.is_contiguous() && packed.is_contiguous(), "x and packed must be contiguous");
  TORCH_CHECK(packed.device().is_cpu() && packed.scalar_type() == at::kFloat,
              "packed must be a CPU float32 tensor");
  const int64_t k = x.size(1);
  const bool halves = packed.dim() == 4;
  const bool fits = halves ? packed.size(1) == 2 && packed.size(2) == k && packed.size(3) == kPanel
                           : packed.dim() == 3 && packed.size(1) == k && packed.size(2) == kPanel;
  TORCH_CHECK(fits, "packed is ", packed.sizes(), ", not a [panels, ", k, ", ", kPanel,
              "] or [pairs, 2, ", k, ", ", kPanel, "] packing for rows of ", k,
              "; pack with pack_small_batch_weight");
  const int64_t count = halves ? 2 * packed.size(0) : packed.size(0);
  const int64_t per = halves ? n / 2 : n, slots = halves ? count / 2 : count;
  TORCH_CHECK((!halves || n % 2 == 0) && per > (slots - 1) * kPanel && per <= slots * kPanel,
              "n=", n, " does not fit ", count, halves ? " interleaved" : "",
              " panels of ", kPanel, " columns");
  return Panels{packed.data_ptr<float>(), k, count, n, halves ? n / 2 : 0};
}

Tensor small_batch_linear(const Tensor& x, const Tensor& packed, int64_t n,
                          const c10::optional<Tensor>& bias,
                          const c10::optional<Tensor>& residual) {
#if defined(SLOPILOT_SMALL_BATCH_GEMM)
  const Panels panels = checked_panels(x, packed, n);
  const int64_t rows = x.size(0), k = panels.k;
  const float* bp = nullptr;
  if (bias.has_value() && bias->defined()) {
    check_float_cpu(*bias, "bias", 1);
    TORCH_CHECK(bias->size(0) == n, "bias has ", bias->size(0), " elements for ", n,
                " columns");
    bp = bias->data_ptr<float>();
  }
  const float* rp = nullptr;
  int64_t ldr = 0;
  if (residual.has_value() && residual->defined()) {
    check_float_cpu(*residual, "residual", 2);
    TORCH_CHECK(residual->size(0) == rows && residual->size(1) == n, "residual is ",
                residual->sizes(), ", the output is [", rows, ", ", n, "]");
    rp = residual->data_ptr<float>();
    ldr = residual->stride(0);
  }
  Tensor y = at::empty({rows, n}, x.options());
  if (rows == 0) return y;
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  // A thread takes a run of consecutive panels: one sequential stream through the weight.
  at::parallel_for(0, panels.count, 1, [&](int64_t begin, int64_t end) {
    for (int64_t q = begin; q < end; ++q) {
      const int64_t col = panels.column(q);
      for (int64_t r = 0; r < rows; r += kBlockRows) {
        const int64_t block = std::min(kBlockRows, rows - r);
        panel_blocks[block - 1](xp + r * k, k, panels.panel(q),
                                bp != nullptr ? bp + col : nullptr,
                                rp != nullptr ? rp + r * ldr + col : nullptr, ldr,
                                yp + r * n + col, n, panels.columns(q));
      }
    }
  });
  return y;
#else
  TORCH_CHECK(false, "small_batch_linear is built for AVX-512 and AVX2 only; this library "
              "is the generic build: run the projection through oneDNN (Projection does)");
  return x;
#endif
}

// silu(x @ gate^T) * (x @ up^T), [rows, inter], from a [gate | up] weight packed as
// interleaved halves: each pair of panels is computed into a small buffer and SwiGLU'd
// there, as silu_and_mul rounds it (torch's vector body, and its scalar tail from the
// same column), so only the [rows, inter] result is written.
Tensor small_batch_swiglu(const Tensor& x, const Tensor& packed, int64_t inter) {
#if defined(SLOPILOT_SMALL_BATCH_GEMM)
  TORCH_CHECK(packed.dim() == 4, "small_batch_swiglu needs a weight packed as two halves "
              "(pack_small_batch_weight(weight, True)), got ", packed.sizes());
  const Panels panels = checked_panels(x, packed, 2 * inter);
  const int64_t rows = x.size(0), k = panels.k, vector_end = silu_vector_end(inter);
  Tensor y = at::empty({rows, inter}, x.options());
  if (rows == 0) return y;
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, panels.count / 2, 1, [&](int64_t begin, int64_t end) {
    alignas(64) float gate[kBlockRows * kPanel];
    alignas(64) float up[kBlockRows * kPanel];
    for (int64_t pair = begin; pair < end; ++pair) {
      const int64_t col = pair * kPanel, cols = panels.columns(2 * pair);
      for (int64_t r = 0; r < rows; r += kBlockRows) {
        const int64_t block = std::min(kBlockRows, rows - r);
        panel_blocks[block - 1](xp + r * k, k, panels.panel(2 * pair), nullptr, nullptr, 0,
                                gate, kPanel, kPanel);
        panel_blocks[block - 1](xp + r * k, k, panels.panel(2 * pair + 1), nullptr, nullptr,
                                0, up, kPanel, kPanel);
        for (int64_t b = 0; b < block; ++b) {
          float* dst = yp + (r + b) * inter + col;
          const float* g = gate + b * kPanel;
          const float* u = up + b * kPanel;
          if (col + kPanel <= vector_end) {
            silu_mul(Vec::loadu(g), Vec::loadu(u)).store(dst);
          } else {
            for (int64_t c = 0; c < cols; ++c) dst[c] = silu_mul(g[c], u[c]);
          }
        }
      }
    }
  });
  return y;
#else
  TORCH_CHECK(false, "small_batch_swiglu is built for AVX-512 and AVX2 only; this library "
              "is the generic build: run the projection through oneDNN (Projection does)");
  return x;
#endif
}

}  // namespace

TORCH_LIBRARY(slopilot, m) {
  m.def("rms_norm(Tensor x, Tensor weight, float eps) -> Tensor");
  m.def("silu_and_mul(Tensor gate_up) -> Tensor");
  m.def("argmax_rows(Tensor x) -> Tensor");
  m.def("rotary_(Tensor(a!) x, Tensor cos, Tensor signed_sin) -> ()");
  m.def("write_kv(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slots, Tensor k, "
        "Tensor v) -> ()");
  m.def("decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor slots, "
        "Tensor lengths, float scale) -> Tensor");
  m.def("pack_small_batch_weight(Tensor weight, bool halves=False) -> Tensor");
  m.def("small_batch_linear(Tensor x, Tensor packed, int n, Tensor? bias, "
        "Tensor? residual) -> Tensor");
  m.def("small_batch_swiglu(Tensor x, Tensor packed, int inter) -> Tensor");
}

TORCH_LIBRARY_IMPL(slopilot, CPU, m) {
  m.impl("rms_norm", &rms_norm);
  m.impl("silu_and_mul", &silu_and_mul);
  m.impl("argmax_rows", &argmax_rows);
  m.impl("rotary_", &rotary_);
  m.impl("write_kv", &write_kv);
  m.impl("decode_attention", &decode_attention);
  m.impl("pack_small_batch_weight", &pack_small_batch_weight);
  m.impl("small_batch_linear", &small_batch_linear);
  m.impl("small_batch_swiglu", &small_batch_swiglu);
}

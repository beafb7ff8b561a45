#include "threewalls/backend/decode_attention.hpp"

#include <string>

#include "threewalls/backend/error.hpp"
#include "threewalls/core/decode_attention_geometry.hpp"

namespace threewalls::backend {

bool decode_attention_supports(const AttentionShape& s, std::string* why) {
  try {
    validate_decode_attention(s);
  } catch (const InputError& e) {
    if (why != nullptr) *why = e.what();
    return false;
  }
  return true;
}

void validate_decode_attention(const AttentionShape& s, std::int64_t capacity) {
  validate_attention(s, "decode attention");
  const std::string shape = " (" + std::to_string(s.batch) + " x " + std::to_string(s.heads) + " heads, kv_heads " +
                            std::to_string(s.kv_head_count()) + ", dqk " + std::to_string(s.head_dim_qk) + ", dv " +
                            std::to_string(s.head_dim_v) + ")";
  if (s.seq_q != 1) {
    throw InputError(rank_prefix() + "decode attention: seq_q must be 1, got " + std::to_string(s.seq_q) +
                     " (use Attention or FusedAttention for prefill)");
  }
  if (s.window > 0 && s.window < s.seq_kv) {
    throw InputError(rank_prefix() + "decode attention: a window of " + std::to_string(s.window) +
                     " keys over seq_kv " + std::to_string(s.seq_kv) +
                     " is not supported; pass the window's keys as the cache (seq_kv = " + std::to_string(s.window) +
                     "), or use FusedAttention");
  }
  const std::int64_t dqk = s.head_dim_qk, dv = s.head_dim_v;
  const bool dims_ok = (dqk == 64 && dv == 64) || (dqk == 128 && dv == 128) || (dqk == 128 && dv == 64) ||
                       (dqk == 192 && dv == 128) || (dqk == 256 && dv == 256);
  if (!dims_ok) {
    throw InputError(
        rank_prefix() + "decode attention: head dims" + shape +
        " not supported; (dqk, dv) must be one of (64, 64), (128, 128), (128, 64), (192, 128), (256, 256)");
  }
  const std::int64_t group = s.heads / s.kv_head_count();
  if (group > (dqk > 128 ? 8 : 16)) {
    throw InputError(rank_prefix() + "decode attention: " + std::to_string(group) + " query heads per kv head" + shape +
                     " exceeds the supported " + (dqk > 128 ? "8" : "16"));
  }
  if (capacity != 0 && capacity < s.seq_kv) {
    throw InputError(rank_prefix() + "decode attention: cache capacity " + std::to_string(capacity) + " < seq_kv " +
                     std::to_string(s.seq_kv));
  }
}

namespace {

std::size_t partial_bytes(const AttentionShape& s, int splits) {
  return static_cast<std::size_t>(s.batch * s.heads * splits * (2 + s.head_dim_v)) * sizeof(float);
}

}  // namespace

double decode_kv_bytes(const AttentionShape& s) {
  return 2.0 * static_cast<double>(s.batch * s.kv_head_count() * s.seq_kv) *
         static_cast<double>(s.head_dim_qk + s.head_dim_v);
}

DecodeAttention::DecodeAttention() {
  int dev = 0;
  TW_CUDA_CHECK(cudaGetDevice(&dev));
  TW_CUDA_CHECK(cudaDeviceGetAttribute(&sm_count_, cudaDevAttrMultiProcessorCount, dev));
}

int DecodeAttention::splits(const AttentionShape& s) const {
  return static_cast<int>(decode_attention_geometry(s.batch, s.kv_head_count(), s.seq_kv, sm_count_).splits);
}

void DecodeAttention::reserve(const AttentionShape& s) {
  validate_decode_attention(s, 0);
  const std::size_t need = partial_bytes(s, splits(s));
  if (partial_.size() < need) partial_ = DeviceBuffer(need);
}

void DecodeAttention::forward(const AttentionShape& s, const bf16* q, const bf16* k, const bf16* v, bf16* o, float* lse,
                              cudaStream_t stream, std::int64_t capacity) {
  validate_decode_attention(s, capacity);
  const int n = splits(s);
  reserve(s);  // no-op when reserved beforehand
  detail::DecodeLaunch l;
  l.q = q;
  l.k = k;
  l.v = v;
  l.o = o;
  l.lse = lse;
  l.partial = partial_.as<float>();
  l.batch = s.batch;
  l.heads = s.heads;
  l.kv_heads = s.kv_head_count();
  l.seq_kv = s.seq_kv;
  l.capacity = capacity > 0 ? capacity : s.seq_kv;
  l.dqk = s.head_dim_qk;
  l.dv = s.head_dim_v;
  l.splits = n;
  detail::launch_decode_attention(l, stream);
}

}  // namespace threewalls::backend

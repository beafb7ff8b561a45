#pragma once
// Attention forward and backward on the CPU in double: the reference both attention
// implementations and decode attention are tested against (layouts of attention.hpp; GQA when
// s.kv_heads < s.heads; the causal mask and its sliding window from core/attention_mask.hpp).
#include <vector>

#include "threewalls/backend/attention.hpp"

namespace threewalls::backend::testing {

struct AttentionRef {
  std::vector<double> o, lse, dq, dk, dv;
};

AttentionRef cpu_attention(const AttentionShape& s, const std::vector<float>& q, const std::vector<float>& k,
                           const std::vector<float>& v, const std::vector<float>& d_o);

}  // namespace threewalls::backend::testing

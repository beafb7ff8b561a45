#pragma once
// The launch geometry of the split-KV decode attention kernel (one query per sequence against a KV
// cache): how many splits of the cache it launches and what each of its blocks walks. The backend's
// DecodeAttention launches by it and the calibration's decode attention cost form
// (attention_decode_v2) counts its waves with it, so both follow one rule. C++17 (CUDA sources
// include it).
#include <algorithm>
#include <cstdint>

namespace threewalls {

// Blocks per SM the split count aims for (enough to hide memory latency across the GPU).
inline constexpr std::int64_t kDecodeBlocksPerSm = 4;
// Keys per split below which splitting further costs more (partials, the combine) than it gains.
inline constexpr std::int64_t kDecodeMinKeysPerSplit = 256;
// A block's warps and the keys a warp takes at a time (one per lane): a block walks its split's keys
// in rounds of kDecodeWarps * kDecodeChunkKeys, one chunk per warp.
inline constexpr std::int64_t kDecodeWarps = 4;
inline constexpr std::int64_t kDecodeChunkKeys = 32;
// The most splits a launch takes (the grid's x dimension).
inline constexpr std::int64_t kDecodeMaxSplits = 65535;

struct DecodeAttentionGeometry {
  std::int64_t splits = 1;          // splits of each (sequence, kv head)'s cache
  std::int64_t blocks = 0;          // batch * kv_heads * splits: one block per (split, kv head, sequence)
  std::int64_t keys_per_split = 0;  // ceil(seq_kv / splits): the longest split's keys
  std::int64_t rounds = 0;          // ceil(keys_per_split / (warps * chunk)): the busiest warp's chunks
  std::int64_t blocks_per_sm = 0;   // ceil(blocks / sm_count): the busiest SM's blocks
};

// Every argument >= 1 (a non-positive one is taken as 1).
inline DecodeAttentionGeometry decode_attention_geometry(std::int64_t batch, std::int64_t kv_heads, std::int64_t seq_kv,
                                                         std::int64_t sm_count) {
  batch = std::max<std::int64_t>(1, batch);
  kv_heads = std::max<std::int64_t>(1, kv_heads);
  seq_kv = std::max<std::int64_t>(1, seq_kv);
  sm_count = std::max<std::int64_t>(1, sm_count);
  DecodeAttentionGeometry g;
  const std::int64_t heads = batch * kv_heads;
  const std::int64_t want = (sm_count * kDecodeBlocksPerSm + heads - 1) / heads;
  const std::int64_t most = std::max<std::int64_t>(1, seq_kv / kDecodeMinKeysPerSplit);
  g.splits = std::clamp<std::int64_t>(want, 1, std::min<std::int64_t>(most, kDecodeMaxSplits));
  g.blocks = heads * g.splits;
  g.keys_per_split = (seq_kv + g.splits - 1) / g.splits;
  constexpr std::int64_t kRoundKeys = kDecodeWarps * kDecodeChunkKeys;
  g.rounds = (g.keys_per_split + kRoundKeys - 1) / kRoundKeys;
  g.blocks_per_sm = (g.blocks + sm_count - 1) / sm_count;
  return g;
}

}  // namespace threewalls

#pragma once
// Copies between host and device memory, and reads from disk into pinned memory (the expert-offload
// disk tier).
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "threewalls/backend/handles.hpp"

namespace threewalls::backend {

// Asynchronous copies on `stream` (cudaMemcpyAsync). From/to pageable host memory CUDA stages
// through its own pinned buffers, so these calls may block the host until the copy is staged: that
// cost is what an h2d_pageable / d2h_pageable op measures.
void copy_h2d(void* device_dst, const void* host_src, std::size_t bytes, cudaStream_t stream);
void copy_d2h(void* host_dst, const void* device_src, std::size_t bytes, cudaStream_t stream);
void copy_d2d(void* device_dst, const void* device_src, std::size_t bytes, cudaStream_t stream);

// How a file read went.
struct FileReadResult {
  std::size_t bytes = 0;   // bytes placed into the buffer (== requested)
  bool direct = false;     // true when O_DIRECT was used (page cache bypassed)
};

// Reads `bytes` from `path` at `offset` into `dst` (synchronous, on the calling thread). Uses
// O_DIRECT when the file system supports it and offset, size and buffer are 4096-aligned (a
// PinnedBuffer is page aligned; the tail is read into the buffer's slack, so the buffer must hold
// `bytes` rounded up to 4096); otherwise a buffered pread. Throws SystemError naming the file on
// I/O errors or a short file.
FileReadResult read_file_into(const std::string& path, std::uint64_t offset, std::size_t bytes, PinnedBuffer& dst,
                              bool try_direct = true);

// Creates (or overwrites) `path` with `bytes` of seeded pseudo-random data, for disk-tier ops and
// benchmarks, and syncs it to the device (so a later O_DIRECT read does not wait for write-back).
void write_random_file(const std::string& path, std::size_t bytes, std::uint64_t seed);

// The disk tier's file layout: a deployment reads every expert from its own place on disk,
// so reads of one offset again and again (which a host's page cache, the VM's included, may serve)
// are not what it does. The file holds `disk_slots(slot_bytes)` slots of `slot_bytes` (4096-aligned)
// each, at most kDiskFileCap bytes and kDiskSlots slots; a read picks its slot by key (layer and
// expert in OpRunner, a counter in the calibration's disk-read benchmark).
inline constexpr std::size_t kDiskSlots = 64;
inline constexpr std::size_t kDiskFileCap = std::size_t{4} << 30;  // 4 GiB
[[nodiscard]] std::size_t disk_slots(std::size_t slot_bytes);
[[nodiscard]] std::uint64_t disk_slot_offset(std::size_t slot_bytes, std::uint64_t key);

inline constexpr std::size_t kDirectIoAlign = 4096;
[[nodiscard]] inline std::size_t round_up_direct(std::size_t bytes) {
  return (bytes + kDirectIoAlign - 1) / kDirectIoAlign * kDirectIoAlign;
}

}  // namespace threewalls::backend

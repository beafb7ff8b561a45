#pragma once
// A caching device allocator with the behaviour of PyTorch's CUDACachingAllocator, as the memory model
// assumes a framework holds memory (docs/backend.md, "Memory"; docs/memory_model.md):
//  * every request is rounded up to a multiple of 512 bytes;
//  * requests up to 1 MiB come from the small pool, carved out of 2 MiB segments; larger ones from the
//    large pool, whose new segments are 20 MiB for requests below 10 MiB and the request rounded up
//    to 2 MiB otherwise;
//  * a request takes the smallest free block of its pool that fits (best fit, lowest address on a
//    tie) and splits it when the rest is worth keeping (small pool: at least 512 bytes; large pool:
//    more than 1 MiB); a freed block merges with free neighbours of its segment and stays cached;
//  * when the device refuses a new segment, every cached segment with nothing allocated in it is
//    returned and the request is tried once more; then it fails with OutOfMemory.
// One stream: blocks are not tracked per stream (the executor allocates and frees in host issue
// order). Device-independent: segments come from the functions given at construction (cudaMalloc
// and cudaFree on a GPU, fake addresses in tests), so the bookkeeping is tested without a GPU.
// Not thread-safe: one allocator per rank thread.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "threewalls/core/error.hpp"

namespace threewalls::backend {

// A request the device could not serve even after the cache was emptied.
class OutOfMemory : public SystemError {
 public:
  using SystemError::SystemError;
};

class CachingAllocator {
 public:
  // Returns a new segment of exactly `bytes`, or nullptr when the device has no room for it.
  using SegmentAlloc = std::function<void*(std::size_t bytes)>;
  using SegmentFree = std::function<void(void* p, std::size_t bytes)>;

  static constexpr std::size_t kMinBlockBytes = 512;                  // rounding of every request
  static constexpr std::size_t kSmallRequestBytes = 1024 * 1024;      // small pool: requests up to this
  static constexpr std::size_t kSmallSegmentBytes = 2 * 1024 * 1024;  // a small-pool segment
  static constexpr std::size_t kMidRequestBytes = 10 * 1024 * 1024;   // large requests below: a 20 MiB segment
  static constexpr std::size_t kLargeSegmentBytes = 20 * 1024 * 1024;
  static constexpr std::size_t kLargeRoundingBytes = 2 * 1024 * 1024;  // larger requests: rounded to this

  // The bytes a request of `bytes` is served with (rounded up to kMinBlockBytes; 0 -> 512).
  [[nodiscard]] static std::size_t round_request(std::size_t bytes);
  // The size of the segment created for a (rounded) request that no cached block fits.
  [[nodiscard]] static std::size_t segment_bytes(std::size_t rounded);

  struct Stats {
    std::size_t allocated = 0;  // bytes of the blocks handed out (rounded, split as the pool splits)
    std::size_t reserved = 0;   // bytes of the segments held from the device
    std::size_t peak_allocated = 0;
    std::size_t peak_reserved = 0;
    std::size_t requested = 0;      // bytes asked for, not rounded, of the blocks handed out now
    std::size_t segments = 0;       // segments held
    std::size_t device_allocs = 0;  // segments obtained from the device so far
    std::size_t retries = 0;        // times the cache was emptied to retry a refused segment
  };

  CachingAllocator(SegmentAlloc alloc, SegmentFree free);
  ~CachingAllocator();  // returns every segment (blocks still handed out become invalid)
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes`; throws OutOfMemory naming the request, allocated and reserved bytes.
  [[nodiscard]] void* allocate(std::size_t bytes);
  // Returns a block to its pool. `p` must come from allocate() and not be freed yet (else InputError).
  void free(void* p);
  // Returns every segment with nothing allocated in it to the device.
  void release_cached();
  [[nodiscard]] const Stats& stats() const { return stats_; }
  // Restarts the peaks at the current values (a new measurement window).
  void reset_peaks();

 private:
  struct Block {
    std::uintptr_t addr = 0;
    std::size_t size = 0;
    std::size_t requested = 0;
    bool allocated = false;
    bool small = false;
    Block* prev = nullptr;  // neighbours within the segment
    Block* next = nullptr;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      return a->size != b->size ? a->size < b->size : a->addr < b->addr;
    }
  };
  using Pool = std::set<Block*, BySize>;
  Pool& pool_of(bool small) { return small ? small_ : large_; }
  Block* new_segment(std::size_t rounded, bool small);
  // `b` takes over its next neighbour (free, or being freed) within the segment.
  void absorb_next(Block* b, Pool& pool);
  void note_peaks();

  SegmentAlloc alloc_;
  SegmentFree free_;
  Pool small_;
  Pool large_;
  std::map<std::uintptr_t, std::unique_ptr<Block>> blocks_;  // every block by address
  Stats stats_;
};

}  // namespace threewalls::backend

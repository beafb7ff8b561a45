// backend/caching_allocator.hpp: the pools, splitting, merging, the retry after emptying the cache and
// the allocated / reserved bookkeeping, on fake device memory (addresses from a counter, a capacity).
#include "threewalls/backend/caching_allocator.hpp"

#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace threewalls::backend {
namespace {

constexpr std::size_t kMiB = 1024 * 1024;

// Device memory of `capacity` bytes: segments get fresh, never reused addresses (a gap between two),
// so a block that strays outside its segment would overlap nothing and be caught by the checks below.
struct FakeMemory {
  explicit FakeMemory(std::size_t bytes) : capacity(bytes) {}
  std::size_t capacity = 0;
  std::size_t used = 0;
  std::uintptr_t next = 1U << 20;
  std::map<std::uintptr_t, std::size_t> live;
  CachingAllocator make() {
    return CachingAllocator(
        [this](std::size_t bytes) -> void* {
          if (used + bytes > capacity) return nullptr;
          used += bytes;
          const std::uintptr_t at = next;
          next += bytes + 4096;
          live[at] = bytes;
          return reinterpret_cast<void*>(at);
        },
        [this](void* p, std::size_t bytes) {
          const auto it = live.find(reinterpret_cast<std::uintptr_t>(p));
          ASSERT_NE(it, live.end());
          ASSERT_EQ(it->second, bytes);
          used -= bytes;
          live.erase(it);
        });
  }
};

TEST(CachingAllocator, RoundsRequestsAndSizesSegmentsAsPyTorch) {
  EXPECT_EQ(CachingAllocator::round_request(0), 512U);
  EXPECT_EQ(CachingAllocator::round_request(1), 512U);
  EXPECT_EQ(CachingAllocator::round_request(512), 512U);
  EXPECT_EQ(CachingAllocator::round_request(513), 1024U);
  EXPECT_EQ(CachingAllocator::segment_bytes(512), 2 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_bytes(kMiB), 2 * kMiB);         // still the small pool
  EXPECT_EQ(CachingAllocator::segment_bytes(kMiB + 512), 20 * kMiB);  // large pool, below 10 MiB
  EXPECT_EQ(CachingAllocator::segment_bytes(10 * kMiB - 512), 20 * kMiB);
  EXPECT_EQ(CachingAllocator::segment_bytes(10 * kMiB), 10 * kMiB);  // rounded to 2 MiB from here
  EXPECT_EQ(CachingAllocator::segment_bytes(11 * kMiB), 12 * kMiB);
}

TEST(CachingAllocator, SmallRequestsShareATwoMiBSegment) {
  FakeMemory mem(64 * kMiB);
  CachingAllocator a = mem.make();
  void* p = a.allocate(1000);
  void* q = a.allocate(1000);
  EXPECT_EQ(a.stats().reserved, 2 * kMiB);
  EXPECT_EQ(a.stats().allocated, 2048U);
  EXPECT_EQ(a.stats().requested, 2000U);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(q) - reinterpret_cast<std::uintptr_t>(p), 1024U);
  EXPECT_EQ(a.stats().segments, 1U);
}

TEST(CachingAllocator, LargeRequestsSplitATwentyMiBSegmentUntilTheRestIsOneMiB) {
  FakeMemory mem(64 * kMiB);
  CachingAllocator a = mem.make();
  std::vector<void*> ps;
  for (int i = 0; i < 4; ++i) ps.push_back(a.allocate(5 * kMiB));  // 4 x 5 MiB fill one 20 MiB segment
  EXPECT_EQ(a.stats().reserved, 20 * kMiB);
  EXPECT_EQ(a.stats().allocated, 20 * kMiB);
  // 11 MiB: a 12 MiB segment, and the 1 MiB rest is not split off (only a rest over 1 MiB is).
  void* big = a.allocate(11 * kMiB);
  EXPECT_EQ(a.stats().reserved, 32 * kMiB);
  EXPECT_EQ(a.stats().allocated, 32 * kMiB);
  a.free(big);
  EXPECT_EQ(a.stats().allocated, 20 * kMiB);
  EXPECT_EQ(a.stats().reserved, 32 * kMiB);  // cached, not returned
  EXPECT_EQ(a.stats().peak_allocated, 32 * kMiB);
  for (void* p : ps) a.free(p);
  EXPECT_EQ(a.stats().allocated, 0U);
}

TEST(CachingAllocator, FreedNeighboursMergeAndServeALargerRequestBestFit) {
  FakeMemory mem(64 * kMiB);
  CachingAllocator a = mem.make();
  void* p0 = a.allocate(5 * kMiB);
  void* p1 = a.allocate(5 * kMiB);
  void* p2 = a.allocate(5 * kMiB);
  void* p3 = a.allocate(5 * kMiB);
  a.free(p1);
  a.free(p0);  // merges with p1: one free 10 MiB block at p0
  void* q = a.allocate(8 * kMiB);
  EXPECT_EQ(q, p0);
  EXPECT_EQ(a.stats().reserved, 20 * kMiB);  // no new segment
  // The 2 MiB left behind q is a block of its own (over 1 MiB): a 2 MiB request takes it.
  void* r = a.allocate(2 * kMiB);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(r), reinterpret_cast<std::uintptr_t>(p0) + 8 * kMiB);
  EXPECT_EQ(a.stats().reserved, 20 * kMiB);
  a.free(p2);
  a.free(p3);
  a.free(q);
  a.free(r);
  EXPECT_EQ(a.stats().allocated, 0U);
  a.release_cached();  // everything merged back into one whole segment: returned
  EXPECT_EQ(a.stats().reserved, 0U);
  EXPECT_TRUE(mem.live.empty());
}

TEST(CachingAllocator, ARefusedSegmentEmptiesTheCacheOnceThenFailsNamingTheBytes) {
  FakeMemory mem(64 * kMiB);
  CachingAllocator a = mem.make();
  a.free(a.allocate(40 * kMiB));    // 40 MiB cached
  void* p = a.allocate(50 * kMiB);  // 40 + 50 > 64: the cache is returned, then it fits
  EXPECT_EQ(a.stats().retries, 1U);
  EXPECT_EQ(a.stats().reserved, 50 * kMiB);
  EXPECT_EQ(a.stats().peak_reserved, 50 * kMiB);
  try {
    static_cast<void>(a.allocate(30 * kMiB));
    FAIL() << "expected OutOfMemory";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("31457280 bytes"), std::string::npos) << msg;  // the request
    EXPECT_NE(msg.find("52428800 bytes) allocated"), std::string::npos) << msg;
  }
  a.free(p);
  EXPECT_THROW(a.free(p), InputError);
}

TEST(CachingAllocator, RandomTrafficKeepsBlocksDisjointAndTheBookkeepingExact) {
  FakeMemory mem(512 * kMiB);
  CachingAllocator a = mem.make();
  std::mt19937_64 rng(7);
  std::map<std::uintptr_t, std::size_t> held;  // address -> rounded request
  std::size_t requested = 0;
  std::size_t peak = 0;
  for (int i = 0; i < 4000; ++i) {
    if (held.empty() || rng() % 3 != 0) {
      const std::size_t bytes = rng() % 2 == 0 ? 1 + rng() % (2 * kMiB) : 1 + rng() % (24 * kMiB);
      void* p = nullptr;
      try {
        p = a.allocate(bytes);
      } catch (const OutOfMemory&) {
        continue;
      }
      const auto at = reinterpret_cast<std::uintptr_t>(p);
      // Disjoint from every held block.
      const auto next = held.lower_bound(at);
      if (next != held.end()) {
        ASSERT_LE(at + bytes, next->first);
      }
      if (next != held.begin()) {
        ASSERT_LE(std::prev(next)->first + std::prev(next)->second, at);
      }
      held[at] = bytes;
      requested += bytes;
    } else {
      auto it = held.begin();
      std::advance(it, static_cast<long>(rng() % held.size()));
      requested -= it->second;
      a.free(reinterpret_cast<void*>(it->first));
      held.erase(it);
    }
    ASSERT_EQ(a.stats().requested, requested);
    ASSERT_GE(a.stats().allocated, requested);
    ASSERT_LE(a.stats().allocated, a.stats().reserved);
    ASSERT_EQ(a.stats().reserved, mem.used);
    peak = std::max(peak, a.stats().allocated);
    ASSERT_EQ(a.stats().peak_allocated, peak);
  }
  for (const auto& [at, bytes] : held) a.free(reinterpret_cast<void*>(at));
  EXPECT_EQ(a.stats().allocated, 0U);
  a.release_cached();
  EXPECT_EQ(mem.used, 0U);
}

}  // namespace
}  // namespace threewalls::backend

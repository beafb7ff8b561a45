// The caching allocator's pools and bookkeeping (rules in caching_allocator.hpp).
#include "threewalls/backend/caching_allocator.hpp"

#include <algorithm>
#include <string>
#include <utility>

#include "threewalls/core/units.hpp"

namespace threewalls::backend {

namespace {

std::size_t round_up(std::size_t v, std::size_t to) { return (v + to - 1) / to * to; }

std::string bytes_text(std::size_t b) {
  return format_bytes(Bytes(static_cast<double>(b))) + " (" + std::to_string(b) + " bytes)";
}

}  // namespace

std::size_t CachingAllocator::round_request(std::size_t bytes) {
  return bytes < kMinBlockBytes ? kMinBlockBytes : round_up(bytes, kMinBlockBytes);
}

std::size_t CachingAllocator::segment_bytes(std::size_t rounded) {
  if (rounded <= kSmallRequestBytes) return kSmallSegmentBytes;
  if (rounded < kMidRequestBytes) return kLargeSegmentBytes;
  return round_up(rounded, kLargeRoundingBytes);
}

CachingAllocator::CachingAllocator(SegmentAlloc alloc, SegmentFree free)
    : alloc_(std::move(alloc)), free_(std::move(free)) {}

CachingAllocator::~CachingAllocator() {
  for (auto& [addr, b] : blocks_) {
    if (b->prev == nullptr) {  // a segment's first block: the segment starts here
      std::size_t bytes = 0;
      for (const Block* x = b.get(); x != nullptr; x = x->next) bytes += x->size;
      try {
        free_(reinterpret_cast<void*>(addr), bytes);
      } catch (...) {  // NOLINT(bugprone-empty-catch): a failed device is torn down anyway
      }
    }
  }
}

void CachingAllocator::note_peaks() {
  stats_.peak_allocated = std::max(stats_.peak_allocated, stats_.allocated);
  stats_.peak_reserved = std::max(stats_.peak_reserved, stats_.reserved);
}

void CachingAllocator::reset_peaks() {
  stats_.peak_allocated = stats_.allocated;
  stats_.peak_reserved = stats_.reserved;
}

CachingAllocator::Block* CachingAllocator::new_segment(std::size_t rounded, bool small) {
  const std::size_t bytes = segment_bytes(rounded);
  void* p = alloc_(bytes);
  if (p == nullptr && stats_.reserved > stats_.allocated) {
    ++stats_.retries;
    release_cached();
    p = alloc_(bytes);
  }
  if (p == nullptr) return nullptr;
  auto b = std::make_unique<Block>();
  b->addr = reinterpret_cast<std::uintptr_t>(p);
  b->size = bytes;
  b->small = small;
  Block* raw = b.get();
  blocks_.emplace(raw->addr, std::move(b));
  stats_.reserved += bytes;
  ++stats_.segments;
  ++stats_.device_allocs;
  return raw;
}

void* CachingAllocator::allocate(std::size_t bytes) {
  const std::size_t rounded = round_request(bytes);
  const bool small = rounded <= kSmallRequestBytes;
  Pool& pool = pool_of(small);
  Block key;
  key.size = rounded;
  Block* b = nullptr;
  if (const auto it = pool.lower_bound(&key); it != pool.end()) {
    b = *it;
    pool.erase(it);
  } else {
    b = new_segment(rounded, small);
    if (b == nullptr) {
      throw OutOfMemory("out of memory: the device refused a new segment of " + bytes_text(segment_bytes(rounded)) +
                        " for a request of " + bytes_text(bytes) + " with " + bytes_text(stats_.allocated) +
                        " allocated and " + bytes_text(stats_.reserved) + " reserved by the caching allocator");
    }
  }
  // Split off the rest when it is worth keeping as a block of its own.
  const std::size_t rest = b->size - rounded;
  if (small ? rest >= kMinBlockBytes : rest > kSmallRequestBytes) {
    auto r = std::make_unique<Block>();
    r->addr = b->addr + rounded;
    r->size = rest;
    r->small = small;
    r->prev = b;
    r->next = b->next;
    if (b->next != nullptr) b->next->prev = r.get();
    b->next = r.get();
    b->size = rounded;
    pool.insert(r.get());
    blocks_.emplace(r->addr, std::move(r));
  }
  b->allocated = true;
  b->requested = bytes;
  stats_.allocated += b->size;
  stats_.requested += bytes;
  note_peaks();
  return reinterpret_cast<void*>(b->addr);
}

void CachingAllocator::free(void* p) {
  const auto it = blocks_.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == blocks_.end() || !it->second->allocated) {
    throw InputError("CachingAllocator::free: " + std::to_string(reinterpret_cast<std::uintptr_t>(p)) +
                     " is not an allocated block");
  }
  Block* b = it->second.get();
  b->allocated = false;
  stats_.allocated -= b->size;
  stats_.requested -= b->requested;
  b->requested = 0;
  Pool& pool = pool_of(b->small);
  // Merge with free neighbours: the block absorbs a free next, a free previous absorbs the block.
  if (b->next != nullptr && !b->next->allocated) absorb_next(b, pool);
  if (Block* v = b->prev; v != nullptr && !v->allocated) {
    pool.erase(v);  // keyed by size: out before it grows
    absorb_next(v, pool);
    b = v;
  }
  pool.insert(b);
}

void CachingAllocator::absorb_next(Block* b, Pool& pool) {
  Block* n = b->next;
  pool.erase(n);  // a no-op for a block handed out (not in the pool)
  b->size += n->size;
  b->next = n->next;
  if (n->next != nullptr) n->next->prev = b;
  blocks_.erase(n->addr);  // destroys n
}

void CachingAllocator::release_cached() {
  for (Pool* pool : {&small_, &large_}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev != nullptr || b->next != nullptr) {
        ++it;
        continue;
      }
      it = pool->erase(it);
      free_(reinterpret_cast<void*>(b->addr), b->size);
      stats_.reserved -= b->size;
      --stats_.segments;
      blocks_.erase(b->addr);
    }
  }
}

}  // namespace threewalls::backend

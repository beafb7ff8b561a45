#include "threewalls/core/heap.hpp"

#include <malloc.h>

namespace threewalls {

bool keep_freed_heap() {
  constexpr int kAll = 1 << 30;
  return mallopt(M_MMAP_THRESHOLD, kAll) == 1 && mallopt(M_TRIM_THRESHOLD, kAll) == 1;
}

}  // namespace threewalls

#pragma once

namespace threewalls {

// Makes glibc's malloc serve blocks of every size from the heap and keep the memory freed there (no
// mmap per large block, no trimming of the heap's top), for a process that allocates and frees large
// blocks in phases: what one phase frees (a simulation's executor state) is reused by the next (its
// records) instead of going back to the kernel and being faulted in again, page by page. Returns
// whether the allocator accepted both settings.
bool keep_freed_heap();

}  // namespace threewalls

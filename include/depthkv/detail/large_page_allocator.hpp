#pragma once
/// @file detail/large_page_allocator.hpp
/// @brief Allocator of HostLayer's key/value storage: blocks of at least 2 MiB are aligned to
/// 2 MiB (`posix_memalign`, POSIX systems) and, on Linux, advised for transparent huge pages
/// (`madvise(MADV_HUGEPAGE)`); smaller blocks, and every block elsewhere, are aligned to a 64-byte
/// cache line (aligned `operator new`), so the moves of a compaction are aligned for its streaming
/// stores (compact_runs.hpp).
///
/// Why: eviction reads the surviving tokens of a head scattered over its whole slot range (at keep
/// 10 % a 32K-token fp32 head spans 16 MiB, one survivor every ~5 KiB), so with 4 KiB pages nearly
/// every survivor costs a TLB miss. With 2 MiB pages the same head spans 8 TLB entries. Measured in
/// benchmarks/RESULTS.md. Where the kernel does not grant huge pages (THP "never") the advice is
/// ignored and nothing else changes. Engines that own their cache (`LayerView`) can do the same
/// with their own allocation. Defining `DEPTHKV_NO_LARGE_PAGES` turns this off (plain allocation),
/// e.g. to measure the difference.

#include <stdlib.h>  // posix_memalign (POSIX)

#include <cstddef>
#include <cstdlib>
#include <limits>
#include <new>

#if (defined(__unix__) || defined(__APPLE__)) && !defined(DEPTHKV_NO_LARGE_PAGES)
#define DEPTHKV_LARGE_PAGE_ALLOC 1  // posix_memalign is there
#endif
#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace depthkv {
namespace detail {

/// 2 MiB: the huge-page size of x86-64 and the common arm64 configuration.
constexpr std::size_t kLargePageBytes = std::size_t{2} << 20;
/// Alignment of the smaller blocks: one cache line.
constexpr std::size_t kCacheLineBytes = 64;

template <class T>
struct LargePageAllocator {
  using value_type = T;

  LargePageAllocator() noexcept = default;
  template <class U>
  LargePageAllocator(const LargePageAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
#if defined(DEPTHKV_LARGE_PAGE_ALLOC)
    const std::size_t bytes = n * sizeof(T);
    if (bytes >= kLargePageBytes) {
      void* p = nullptr;  // exactly `bytes` (no rounding up: bytes_allocated() stays true), 2 MiB-aligned
      if (posix_memalign(&p, kLargePageBytes, bytes) != 0 || p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
      const std::size_t page = 4096;  // whole pages; the tail past the last 2 MiB stays in small pages
      // advice: failure changes only speed
      (void)madvise(p, (bytes + page - 1) / page * page, MADV_HUGEPAGE);
#endif
      return static_cast<T*>(p);
    }
#endif
    return static_cast<T*>(::operator new (n * sizeof(T), std::align_val_t{kCacheLineBytes}));
  }

  void deallocate(T* p, std::size_t n) noexcept {
#if defined(DEPTHKV_LARGE_PAGE_ALLOC)
    if (n * sizeof(T) >= kLargePageBytes) {
      std::free(p);
      return;
    }
#endif
    ::operator delete (p, std::align_val_t{kCacheLineBytes});
  }

  friend bool operator==(const LargePageAllocator&, const LargePageAllocator&) noexcept { return true; }
  friend bool operator!=(const LargePageAllocator&, const LargePageAllocator&) noexcept { return false; }
};

}  // namespace detail
}  // namespace depthkv

#pragma once
/// @file detail/large_page_allocator.hpp
/// @brief Allocator of HostLayer's key/value storage: blocks of at least 2 MiB are aligned to
/// 2 MiB and, on Linux, advised for transparent huge pages (`madvise(MADV_HUGEPAGE)`); smaller
/// blocks come from `std::allocator`.
///
/// Why: eviction reads the surviving tokens of a head scattered over its whole slot range (at keep
/// 10 % a 32K-token fp32 head spans 16 MiB, one survivor every ~5 KiB), so with 4 KiB pages nearly
/// every survivor costs a TLB miss. With 2 MiB pages the same head spans 8 TLB entries. Measured in
/// benchmarks/RESULTS.md. Where the kernel does not grant huge pages (THP "never") the advice is
/// ignored and nothing else changes. Engines that own their cache (`LayerView`) can do the same
/// with their own allocation. Defining `DEPTHKV_NO_LARGE_PAGES` turns this off (plain allocation),
/// e.g. to measure the difference.

#include <cstddef>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace depthkv {
namespace detail {

/// 2 MiB: the huge-page size of x86-64 and the common arm64 configuration.
constexpr std::size_t kLargePageBytes = std::size_t{2} << 20;

template <class T>
struct LargePageAllocator {
  using value_type = T;

  LargePageAllocator() noexcept = default;
  template <class U>
  LargePageAllocator(const LargePageAllocator<U>&) noexcept {}

  T* allocate(std::size_t n) {
    if (n > std::numeric_limits<std::size_t>::max() / sizeof(T)) throw std::bad_array_new_length();
    const std::size_t bytes = n * sizeof(T);
    if (!large(bytes)) return std::allocator<T>().allocate(n);
    const std::size_t rounded = (bytes + kLargePageBytes - 1) / kLargePageBytes * kLargePageBytes;
    void* p = std::aligned_alloc(kLargePageBytes, rounded);
    if (p == nullptr) throw std::bad_alloc();
#if defined(__linux__) && defined(MADV_HUGEPAGE)
    (void)madvise(p, rounded, MADV_HUGEPAGE);  // advice only: failure changes nothing but speed
#endif
    return static_cast<T*>(p);
  }

  void deallocate(T* p, std::size_t n) noexcept {
    if (large(n * sizeof(T)))
      std::free(p);
    else
      std::allocator<T>().deallocate(p, n);
  }

  friend bool operator==(const LargePageAllocator&, const LargePageAllocator&) noexcept { return true; }
  friend bool operator!=(const LargePageAllocator&, const LargePageAllocator&) noexcept { return false; }

 private:
  static bool large(std::size_t bytes) {
#if defined(_WIN32) || defined(DEPTHKV_NO_LARGE_PAGES)
    (void)bytes;
    return false;  // no std::aligned_alloc on Windows; or turned off: plain allocation
#else
    return bytes >= kLargePageBytes;
#endif
  }
};

}  // namespace detail
}  // namespace depthkv

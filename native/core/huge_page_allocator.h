// A std::allocator for large arrays probed at random (the key index's slot
// array): blocks of at least kHugePageBytes are mapped on their own, aligned to
// 2 MB and advised MADV_HUGEPAGE, so that Linux's transparent huge pages (THP,
// mode "madvise" or "always") back them with 2-MB pages. A random probe then
// misses the TLB far less often (a 22-MB array is 11 huge pages instead of 5,600
// small ones) and growing the array takes 1 page fault per 2 MB instead of 512.
//
// Memory: only the block, rounded up to 4 KB, is mapped (the alignment slack of
// the reservation is unmapped again), so the resident size is what a plain
// allocation would hold; the tail past the last 2-MB boundary stays on 4-KB
// pages. Smaller blocks come from operator new. Without THP (mode "never", or
// not Linux) the advice is ignored and the block is an ordinary mapping.
// Stateless: any two instances are equal (a std::vector's swap and move keep
// working).
#ifndef MXREC_PIPELINE_NATIVE_CORE_HUGE_PAGE_ALLOCATOR_H_
#define MXREC_PIPELINE_NATIVE_CORE_HUGE_PAGE_ALLOCATOR_H_

#include <sys/mman.h>

#include <cstddef>
#include <cstdint>
#include <new>

namespace mxrec {

// Size (and alignment) of a transparent huge page on x86-64 and arm64 (4-KB
// base pages); blocks smaller than this gain nothing from the advice.
inline constexpr size_t kHugePageBytes = size_t{2} << 20;

// Base page size the block lengths are rounded up to.
inline constexpr size_t kBasePageBytes = size_t{4} << 10;

inline size_t RoundUpToBasePage(size_t bytes) {
  return (bytes + kBasePageBytes - 1) & ~(kBasePageBytes - 1);
}

// Maps `bytes` (>= kHugePageBytes) aligned to kHugePageBytes and advises
// MADV_HUGEPAGE. Throws std::bad_alloc when the mapping fails.
inline void* MapHugePages(size_t bytes) {
  const size_t length = RoundUpToBasePage(bytes);
  if (length > SIZE_MAX - kHugePageBytes) throw std::bad_alloc();
  // Reserve length + 2 MB, keep the 2-MB aligned `length` inside, unmap the rest.
  const size_t reserved = length + kHugePageBytes;
  void* raw = mmap(nullptr, reserved, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) throw std::bad_alloc();
  const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = (start + kHugePageBytes - 1) & ~(uintptr_t{kHugePageBytes} - 1);
  if (aligned > start) munmap(raw, aligned - start);
  const uintptr_t end = start + reserved;
  if (end > aligned + length) {
    munmap(reinterpret_cast<void*>(aligned + length), end - aligned - length);
  }
  void* block = reinterpret_cast<void*>(aligned);
#ifdef MADV_HUGEPAGE
  (void)madvise(block, length, MADV_HUGEPAGE);  // Advice only: ignored without THP.
#endif
  return block;
}

// Unmaps a block of `bytes` from MapHugePages.
inline void UnmapHugePages(void* block, size_t bytes) { munmap(block, RoundUpToBasePage(bytes)); }

template <typename T>
class HugePageAllocator {
 public:
  using value_type = T;

  HugePageAllocator() noexcept = default;
  template <typename U>
  HugePageAllocator(const HugePageAllocator<U>&) noexcept {}  // NOLINT: rebinding

  T* allocate(size_t n) {
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) return static_cast<T*>(::operator new(bytes));
    return static_cast<T*>(MapHugePages(bytes));
  }

  void deallocate(T* p, size_t n) noexcept {
    const size_t bytes = n * sizeof(T);
    if (bytes < kHugePageBytes) {
      ::operator delete(p);
    } else {
      UnmapHugePages(p, bytes);
    }
  }

  template <typename U>
  bool operator==(const HugePageAllocator<U>&) const noexcept {
    return true;
  }
  template <typename U>
  bool operator!=(const HugePageAllocator<U>&) const noexcept {
    return false;
  }
};

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_CORE_HUGE_PAGE_ALLOCATOR_H_

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
#include <cstring>
#include <new>
#include <type_traits>
#include <utility>

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

// Grows a block of `old_bytes` from MapHugePages to `new_bytes` (>= old_bytes)
// without copying it: a fresh 2-MB aligned block is mapped and the old block's
// 2-MB pages are moved to its start by mremap (page tables only: they stay
// 2-MB pages, nothing is copied or zeroed again), its last part (< 2 MB) is
// copied; the rest of the new block is fresh, zero pages. `old_bytes` >=
// kHugePageBytes. Returns the new block (the old address is no longer
// mapped), or nullptr, the old block unchanged, when either step fails or
// mremap is not there (not Linux): the caller then copies.
inline void* GrowHugePages(void* block, size_t old_bytes, size_t new_bytes) noexcept {
#ifdef MREMAP_FIXED
  void* grown;
  try {
    grown = MapHugePages(new_bytes);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
  // The old block's whole 2-MB pages move; its tail (< 2 MB, on 4-KB pages)
  // is copied, so that the new block's 2-MB page there is a huge one too.
  const size_t moved = old_bytes & ~(kHugePageBytes - 1);
  if (mremap(block, moved, moved, MREMAP_MAYMOVE | MREMAP_FIXED, grown) != MAP_FAILED) {
    char* tail = static_cast<char*>(block) + moved;
    std::memcpy(static_cast<char*>(grown) + moved, tail, old_bytes - moved);
    if (old_bytes > moved) munmap(tail, RoundUpToBasePage(old_bytes) - moved);
    return grown;
  }
  UnmapHugePages(grown, new_bytes);
#else
  (void)block, (void)old_bytes, (void)new_bytes;
#endif
  return nullptr;
}

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

// A fixed-size array of trivially copyable T (the key index's slots) on the
// blocks of HugePageAllocator, which can grow in place: Grow keeps the first
// size() elements where they are in memory when old and new blocks are both
// 2 MB or more (GrowHugePages: no copy, no second zeroing), so a growing
// array costs fresh memory only for what it adds. Move-only.
template <typename T>
class HugePageArray {
  static_assert(std::is_trivially_copyable_v<T>, "HugePageArray moves T with memcpy/mremap");

 public:
  HugePageArray() noexcept = default;
  // `n` copies of `value`. Throws std::bad_alloc.
  HugePageArray(size_t n, const T& value) : data_(HugePageAllocator<T>().allocate(n)), size_(n) {
    Fill(0, n, value);
  }
  HugePageArray(HugePageArray&& other) noexcept { swap(other); }
  HugePageArray& operator=(HugePageArray&& other) noexcept {
    HugePageArray(std::move(other)).swap(*this);
    return *this;
  }
  HugePageArray(const HugePageArray&) = delete;
  HugePageArray& operator=(const HugePageArray&) = delete;
  ~HugePageArray() {
    if (data_ != nullptr) HugePageAllocator<T>().deallocate(data_, size_);
  }

  void swap(HugePageArray& other) noexcept {
    std::swap(data_, other.data_);
    std::swap(size_, other.size_);
  }

  // Extends the array to `n` (>= size()) elements: the first size() keep their
  // values, the new ones are `value`. In place (see the class comment) when
  // both blocks are 2 MB or more, else (or when mremap fails) copied into a
  // new block. Throws std::bad_alloc, leaving the array unchanged.
  void Grow(size_t n, const T& value) {
    if (n <= size_) return;
    if (n > SIZE_MAX / sizeof(T)) throw std::bad_alloc();
    T* grown = nullptr;
    if (size_ * sizeof(T) >= kHugePageBytes) {
      grown = static_cast<T*>(GrowHugePages(data_, size_ * sizeof(T), n * sizeof(T)));
    }
    if (grown == nullptr) {
      grown = HugePageAllocator<T>().allocate(n);
      if (size_ > 0) std::memcpy(static_cast<void*>(grown), data_, size_ * sizeof(T));
      if (data_ != nullptr) HugePageAllocator<T>().deallocate(data_, size_);
    }
    data_ = grown;
    const size_t old_size = size_;
    size_ = n;
    Fill(old_size, n, value);
  }

  size_t size() const { return size_; }
  T* data() { return data_; }
  const T* data() const { return data_; }
  T& operator[](size_t i) { return data_[i]; }
  const T& operator[](size_t i) const { return data_[i]; }
  T* begin() { return data_; }
  T* end() { return data_ + size_; }
  const T* begin() const { return data_; }
  const T* end() const { return data_ + size_; }

 private:
  void Fill(size_t from, size_t to, const T& value) {
    for (size_t i = from; i < to; ++i) data_[i] = value;
  }

  T* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_CORE_HUGE_PAGE_ALLOCATOR_H_

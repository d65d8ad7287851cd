#include "key_index.h"

#include <algorithm>
#include <functional>
#include <iterator>
#include <limits>
#include <mutex>
#include <new>
#include <sstream>

namespace mxrec {
namespace {

// Finalizer of splitmix64 (Steele, Lea, Flood 2014): a bijective 64-bit mix,
// so consecutive or strided keys spread over the slots.
inline uint64_t Mix(int64_t key) {
  uint64_t z = static_cast<uint64_t>(key) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// Knuth's multiplicative ("Fibonacci") hash, TAOCP vol. 3, 6.4: the key times
// 2^64 / golden ratio; its top bits address a power-of-two table. One multiply
// (Mix: two, and shifts): Deduplicate's local table, probed once per raw key,
// runs 7% faster with it. Arithmetic progressions of keys spread evenly.
inline uint64_t FibonacciHash(int64_t key) {
  return static_cast<uint64_t>(key) * 0x9E3779B97F4A7C15ULL;
}

// Smallest power of two >= max(2 * n, 16).
uint64_t SlotCount(int64_t n) {
  uint64_t want = std::max<uint64_t>(16, 2 * static_cast<uint64_t>(n));
  uint64_t count = 1;
  while (count < want) count <<= 1;
  return count;
}

// Keys ahead whose slot is prefetched in the probing loops: hides the cache
// miss of a random slot behind the work on the keys before it.
constexpr int64_t kPrefetchDistance = 16;

// Cache lines prefetched from a key's home slot on: 12 slots of 16 B, as a
// probe for an absent key at load 0.8 passes 13 slots on average (Knuth's
// (1 + 1/(1 - a)^2) / 2), 5 at load 2/3. One line only left the probe's next
// lines to stall: the bench's insertion ran 12% slower.
constexpr int kPrefetchLines = 3;
constexpr int kCacheLineBytes = 64;

// Keys ImportLocked probes per chunk (homes on the stack: 8 KB).
constexpr int64_t kImportChunk = 1024;

// Slots Deduplicate starts with (64 KB): its table doubles as distinct keys come.
constexpr uint64_t kDedupInitialSlots = 1 << 14;

__extension__ using Uint128 = unsigned __int128;

// Lemire's multiply-shift range reduction ("A fast alternative to the modulo
// reduction", 2016): maps a uniform 64-bit hash onto [0, n) without division.
inline uint64_t Reduce(uint64_t hash, uint64_t n) {
  return static_cast<uint64_t>((static_cast<Uint128>(hash) * n) >> 64);
}

// Number of distinct keys[i] with rows[i] == mark.
int64_t CountDistinct(const int64_t* keys, const int64_t* rows, int64_t n, int64_t mark) {
  std::vector<int64_t> marked;
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] == mark) marked.push_back(keys[i]);
  }
  std::sort(marked.begin(), marked.end());
  return std::unique(marked.begin(), marked.end()) - marked.begin();
}

// Number of distinct keys[i] with rows[i] < 0 (misses).
int64_t CountDistinctMisses(const int64_t* keys, const int64_t* rows, int64_t n) {
  std::vector<int64_t> marked;
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0) marked.push_back(keys[i]);
  }
  std::sort(marked.begin(), marked.end());
  return std::unique(marked.begin(), marked.end()) - marked.begin();
}

}  // namespace

void Deduplicate(const int64_t* keys, int64_t n, std::vector<int64_t>* unique, int32_t* restore,
                 int64_t expected_unique) {
  unique->clear();
  if (n == 0) return;
  // The table is sized by the distinct keys expected or found so far, not by n,
  // and kept at load <= 1/2 by doubling: a batch of repeated (Zipf) keys probes
  // a table that stays in cache (2 MB for 200k distinct keys of 1M, not the
  // 8 MB of 2n slots).
  const uint64_t max_slots = SlotCount(n);
  const uint64_t initial = std::max(kDedupInitialSlots, SlotCount(std::min(expected_unique, n)));
  uint64_t mask = std::min(max_slots, initial) - 1;
  int shift = 64 - __builtin_ctzll(mask + 1);  // Slot = the hash's top log2(slots) bits.
  // Each slot holds a position in `unique`, or -1 when empty.
  std::vector<int32_t> slots(mask + 1, -1);
  unique->reserve(static_cast<size_t>(std::min<int64_t>(n, 1 << 20)));
  // Software pipelining: the hash of keys[i + kPrefetchDistance] is computed
  // (once), kept in a ring and its slot prefetched while keys[i] is probed.
  uint64_t hashes[kPrefetchDistance];
  for (int64_t i = 0; i < std::min(n, kPrefetchDistance); ++i) {
    hashes[i] = FibonacciHash(keys[i]);
    __builtin_prefetch(&slots[hashes[i] >> shift]);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = keys[i];
    uint64_t s = hashes[i % kPrefetchDistance] >> shift;
    if (i + kPrefetchDistance < n) {
      const uint64_t ahead = FibonacciHash(keys[i + kPrefetchDistance]);
      hashes[i % kPrefetchDistance] = ahead;
      __builtin_prefetch(&slots[ahead >> shift]);
    }
    while (true) {
      const int32_t pos = slots[s];
      if (pos < 0) {
        const int32_t added = static_cast<int32_t>(unique->size());
        slots[s] = added;
        restore[i] = added;
        unique->push_back(key);
        if (2 * unique->size() > mask + 1 && mask + 1 < max_slots) {
          mask = 2 * mask + 1;
          --shift;
          std::vector<int32_t>(mask + 1, -1).swap(slots);
          for (int32_t p = 0; p <= added; ++p) {
            uint64_t t = FibonacciHash((*unique)[p]) >> shift;
            while (slots[t] >= 0) t = (t + 1) & mask;
            slots[t] = p;
          }
        }
        break;
      }
      if ((*unique)[pos] == key) {
        restore[i] = pos;
        break;
      }
      s = (s + 1) & mask;
    }
  }
}

KeyIndex::KeyIndex(int64_t capacity, std::string name, bool growable, std::string rows_text,
                   std::string grow_text)
    : capacity_(capacity),
      name_(std::move(name)),
      growable_(growable),
      rows_text_(rows_text.empty()
                     ? "device_vocabulary_size=" + std::to_string(capacity) + " rows"
                     : std::move(rows_text)),
      grow_text_(grow_text.empty() ? "Create the table with a larger device_vocabulary_size"
                                   : std::move(grow_text)),
      num_slots_(kMinSlots),
      slots_(kMinSlots, Slot{0, kMissingRow}) {}

uint64_t KeyIndex::Home(int64_t key) const { return Reduce(Mix(key), num_slots_); }

template <typename Visit>
void KeyIndex::ProbePipelined(const int64_t* keys, int64_t n, int64_t* homes,
                              Visit&& visit) const {
  // Up to kPrefetchDistance probes in flight. The prefetch stays in this
  // loop, of the homes computed beforehand: GCC 12 drops a __builtin_prefetch
  // kept in a helper of its own once inlined (no instruction in the object code).
  for (int64_t i = 0; i < n; ++i) homes[i] = static_cast<int64_t>(Home(keys[i]));
  for (int64_t i = 0; i < n; ++i) {
    if (i + kPrefetchDistance < n) {
      const char* ahead = reinterpret_cast<const char*>(&slots_[homes[i + kPrefetchDistance]]);
      for (int line = 0; line < kPrefetchLines; ++line) {
        __builtin_prefetch(ahead + line * kCacheLineBytes);
      }
    }
    visit(i, ProbeFrom(static_cast<uint64_t>(homes[i]), keys[i]));
  }
}

uint64_t KeyIndex::SlotsFor(int64_t keys) const {
  const uint64_t k = static_cast<uint64_t>(keys);
  uint64_t count = k + k / 2;  // floor(1.5 * keys): load 2/3.
  if (!growable_) {
    const uint64_t c = static_cast<uint64_t>(capacity_);
    count = std::min(count, c + (c + 3) / 4);  // ceil(1.25 * capacity): load <= 0.8.
  }
  return std::max(count, kMinSlots);
}

bool KeyIndex::FitsLocked(int64_t keys) const {
  return 5 * static_cast<uint64_t>(keys) <= 4 * num_slots_;
}

Status KeyIndex::AllocationError(uint64_t count, int64_t keys) const {
  std::ostringstream msg;
  msg << "table '" << name_ << "': cannot grow the key index to " << keys << " keys ("
      << count * sizeof(Slot) << " bytes of host memory)";
  return Status::ResourceExhausted(msg.str());
}

Status KeyIndex::AllocateSlots(uint64_t count, int64_t keys, SlotArray* slots) const {
  try {
    *slots = SlotArray(count, Slot{0, kMissingRow});
  } catch (const std::bad_alloc&) {
    return AllocationError(count, keys);
  }
  return Status::Ok();
}

Status KeyIndex::RehashLocked(uint64_t count, int64_t keys) {
  if (count > num_slots_) return GrowLocked(count, keys);
  SlotArray old;
  Status allocated = AllocateSlots(count, keys, &old);
  if (!allocated.ok()) return allocated;
  std::swap(slots_, old);
  num_slots_ = count;
  // Keys are distinct: each goes to the first empty slot from its home, no key
  // compared. Old slots in order map to (nearly) ascending homes: Reduce keeps
  // the order of the hashes, so the writes sweep the new array.
  for (const Slot& slot : old) {
    if (slot.row == kMissingRow) continue;
    uint64_t s = Home(slot.key);
    while (slots_[s].row != kMissingRow) {
      if (++s == num_slots_) s = 0;
    }
    slots_[s] = slot;
  }
  return Status::Ok();
}

Status KeyIndex::GrowLocked(uint64_t count, int64_t keys) {
  const uint64_t old_count = num_slots_;
  try {
    slots_.Grow(count, Slot{0, kMissingRow});  // The old slots stay in place.
  } catch (const std::bad_alloc&) {
    return AllocationError(count, keys);
  }
  num_slots_ = count;
  // Rehash in place, old slots from the last down: a key's home in the larger
  // array is at or after its old home (Reduce grows with the slot count), so
  // it mostly lands above the scan, where every old key has been moved out
  // already: two descending sweeps. A key whose probe meets an old key below
  // the scan takes that slot and the old key is placed next (displaced); keys
  // placed below the scan carry kMovedBit in their row until the scan passes
  // them. A key's probe passes only slots of keys already placed, which stay,
  // so every key stays findable from its home.
  for (uint64_t p = old_count; p-- > 0;) {
    Slot& at = slots_[p];
    if (at.row == kMissingRow) continue;
    if (at.row & kMovedBit) {
      at.row &= ~kMovedBit;
      continue;
    }
    Slot moving = at;
    at = Slot{0, kMissingRow};
    uint64_t s = Home(moving.key);
    while (true) {
      Slot& to = slots_[s];
      const bool empty = to.row == kMissingRow;
      if (empty || (s < p && !(to.row & kMovedBit))) {
        const Slot displaced = to;
        to = Slot{moving.key, s < p ? moving.row | kMovedBit : moving.row};
        if (empty) break;
        moving = displaced;
        s = Home(moving.key);
        continue;
      }
      if (++s == num_slots_) s = 0;
    }
  }
  return Status::Ok();
}

std::string KeyIndex::FullMessage(int64_t new_keys, const char* verb) const {
  std::ostringstream msg;
  msg << "table '" << name_ << "' is full: " << rows_text_ << ", " << size_
      << " used, and this batch " << verb << " " << new_keys << " new keys. Nothing was inserted. "
      << grow_text_;
  return msg.str();
}

Status KeyIndex::ReserveLocked(int64_t keys) {
  // An overcount (repeated keys) must not regrow a full fixed-capacity array.
  if (!growable_) keys = std::min(keys, capacity_);
  if (FitsLocked(keys)) return Status::Ok();
  return RehashLocked(SlotsFor(keys), keys);
}

uint64_t KeyIndex::Probe(int64_t key) const { return ProbeFrom(Home(key), key); }

uint64_t KeyIndex::ProbeFrom(uint64_t s, int64_t key) const {
  while (slots_[s].row != kMissingRow && slots_[s].key != key) {
    if (++s == num_slots_) s = 0;
  }
  return s;
}

int64_t KeyIndex::TakeFreeRow() {
  if (!free_rows_.empty()) {
    const int64_t row = free_rows_.back();
    free_rows_.pop_back();
    return row;
  }
  return next_row_++;
}

Status KeyIndex::GrowForLocked(int64_t new_keys, const char* verb) {
  if (size_ + new_keys > kMaxCapacity) {
    std::ostringstream msg;
    msg << "table '" << name_ << "' is full: " << size_ << " keys, and this batch " << verb << " "
        << new_keys << " new keys; a table holds at most " << kMaxCapacity << " keys.";
    return Status::ResourceExhausted(msg.str());
  }
  return ReserveLocked(size_ + new_keys);
}

int64_t KeyIndex::InsertAtLocked(Slot& slot, int64_t key) {
  slot.key = key;
  slot.row = TakeFreeRow();
  ++size_;
  ++admissions_;
  if (slot.row < static_cast<int64_t>(last_seen_.size())) last_seen_[slot.row] = now_;
  return slot.row;
}

void KeyIndex::UndoInsertsLocked(const int64_t* keys, const int64_t* rows,
                                 const std::vector<int64_t>& inserted, int64_t next_row_before) {
  // Rows below next_row_before came from the free list, popped in this order:
  // pushed back in reverse, the list is as it was (descending).
  for (auto it = inserted.rbegin(); it != inserted.rend(); ++it) {
    EraseSlotLocked(Probe(keys[*it]));
    if (rows[*it] < next_row_before) free_rows_.push_back(rows[*it]);
  }
  const int64_t count = static_cast<int64_t>(inserted.size());
  size_ -= count;
  admissions_ -= count;
  next_row_ = next_row_before;
}

Status KeyIndex::FindOrInsert(const int64_t* keys, int64_t n, int64_t* rows,
                              const int64_t* occurrences) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  // Distinct keys (as the insert op passes them), n of them, bring at least
  // n - size_ new ones: when the array could not hold n keys while the rows
  // surely can hold size_ + n (the batch cannot fail), grow first, for n keys,
  // so that the batch is probed once (e.g. every batch into an empty index).
  const int64_t limit = growable_ ? kMaxCapacity : capacity_;
  if (n > size_ && n <= limit - size_ && !FitsLocked(n)) {
    Status reserved = ReserveLocked(n);
    if (!reserved.ok()) return reserved;
  }
  // One pass finds each key and inserts an absent one into the empty slot its
  // probe reached (already in cache), while the array has room (load <= 0.8)
  // and, for a fixed-capacity index, rows are left. From the first miss past
  // that point on, misses are deferred: each keeps that empty slot as a hint,
  // rows[i] = -2 - slot, and `deferred` counts it (a key repeated in `keys`
  // twice). Positions of the keys inserted are kept to undo them.
  const int64_t next_row_before = next_row_;
  const int64_t room = std::min<int64_t>(static_cast<int64_t>(4 * num_slots_ / 5), limit);
  std::vector<int64_t> inserted, deferred_at;
  // The homes go into rows[], as scratch.
  ProbePipelined(keys, n, rows, [&](int64_t i, uint64_t s) {
    Slot& slot = slots_[s];
    if (slot.row != kMissingRow) {
      rows[i] = slot.row;
    } else if (deferred_at.empty() && size_ < room) {
      rows[i] = InsertAtLocked(slot, keys[i]);
      inserted.push_back(i);
    } else {
      rows[i] = -2 - static_cast<int64_t>(s);
      deferred_at.push_back(i);
    }
  });
  if (deferred_at.empty()) {
    MarkChangedLocked(rows, n, occurrences);
    return Status::Ok();
  }
  int64_t deferred = static_cast<int64_t>(deferred_at.size());
  // Room for the deferred keys (at most one rehash), or the whole batch undone.
  const int64_t new_keys = static_cast<int64_t>(inserted.size());
  if (size_ + deferred > limit) {
    // `deferred` may count a repeated key twice: recount exactly before failing.
    deferred = CountDistinctMisses(keys, rows, n);
  }
  const uint64_t slots_before = num_slots_;
  Status reserved = Status::Ok();
  if (growable_ && size_ + deferred > kMaxCapacity) {
    UndoInsertsLocked(keys, rows, inserted, next_row_before);
    reserved = GrowForLocked(new_keys + deferred, "brings up to");
  } else if (!growable_ && size_ + deferred > capacity_) {
    UndoInsertsLocked(keys, rows, inserted, next_row_before);
    reserved = Status::ResourceExhausted(FullMessage(new_keys + deferred, "brings") +
                                         " (or drop rare keys before the lookup).");
  } else {
    reserved = ReserveLocked(size_ + deferred);
    if (!reserved.ok()) UndoInsertsLocked(keys, rows, inserted, next_row_before);
  }
  if (!reserved.ok()) return reserved;
  if (num_slots_ != slots_before) {
    // Rehashed: the hints are the keys' home slots in the new array.
    for (int64_t i : deferred_at) rows[i] = -2 - static_cast<int64_t>(Home(keys[i]));
  }
  // The deferred keys in order, pipelined as the first pass.
  const int64_t count = static_cast<int64_t>(deferred_at.size());
  for (int64_t j = 0; j < count; ++j) {
    if (j + kPrefetchDistance < count) {
      const char* ahead =
          reinterpret_cast<const char*>(&slots_[-2 - rows[deferred_at[j + kPrefetchDistance]]]);
      for (int line = 0; line < kPrefetchLines; ++line) {
        __builtin_prefetch(ahead + line * kCacheLineBytes);
      }
    }
    const int64_t i = deferred_at[j];
    Slot& slot = slots_[ProbeFrom(static_cast<uint64_t>(-2 - rows[i]), keys[i])];
    rows[i] = slot.row == kMissingRow ? InsertAtLocked(slot, keys[i]) : slot.row;
  }
  MarkChangedLocked(rows, n, occurrences);
  return Status::Ok();
}

void KeyIndex::MarkChangedLocked(const int64_t* rows, int64_t n, const int64_t* counts) {
  if (!tracking_) return;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[i];
    if (row < 0) continue;
    const size_t word = static_cast<size_t>(row) >> 6;
    if (word >= changed_.size()) {
      // Rows are handed out lowest first: grown to next_row_, by 1.25x at least.
      const size_t bound = (static_cast<size_t>(std::max(row + 1, next_row_)) + 63) >> 6;
      changed_.resize(std::max(bound, changed_.size() + changed_.size() / 4), 0);
    }
    changed_[word] |= uint64_t{1} << (row & 63);
  }
  if (!count_touches_) return;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t row = rows[i];
    if (row < 0) continue;
    if (static_cast<size_t>(row) >= touches_.size()) {
      const size_t bound = static_cast<size_t>(std::max(row + 1, next_row_));
      touches_.resize(std::max(bound, touches_.size() + touches_.size() / 4), 0);
    }
    // Saturating: a count above 2^32 - 1 reads as 2^32 - 1 (min_count is an int32).
    const int64_t count = counts != nullptr ? std::max<int64_t>(counts[i], 0) : 1;
    const uint64_t added = uint64_t{touches_[row]} + static_cast<uint64_t>(count);
    touches_[row] = static_cast<uint32_t>(
        std::min<uint64_t>(added, std::numeric_limits<uint32_t>::max()));
  }
}

bool KeyIndex::ChangedLocked(int64_t row) const {
  const size_t word = static_cast<size_t>(row) >> 6;
  return word < changed_.size() && ((changed_[word] >> (row & 63)) & 1) != 0;
}

void KeyIndex::TouchLocked(int64_t row, int64_t time) {
  if (row >= static_cast<int64_t>(last_seen_.size())) {
    // Grown by 1.25x, not the 2x of std::vector: at most 10 B per row.
    const size_t size = last_seen_.size();
    const size_t grown = std::max<size_t>({static_cast<size_t>(row) + 1,
                                           static_cast<size_t>(next_row_), size + size / 4, 64});
    if (grown > last_seen_.capacity()) last_seen_.reserve(grown);
    last_seen_.resize(grown, -1);
  }
  last_seen_[row] = time;
}

Status KeyIndex::FindOrInsertAdmitting(const int64_t* keys, const int64_t* counts, int64_t n,
                                       int64_t access_threshold, int64_t timestamp,
                                       int64_t* rows) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  const int64_t time = std::max(timestamp, now_);
  // Pass 1: find; mark absent keys whose count reaches the threshold (rows[i] = -2).
  constexpr int64_t kAdmit = -2;
  int64_t admit = 0;
  ProbePipelined(keys, n, rows, [&](int64_t i, uint64_t s) {
    rows[i] = slots_[s].row;
    if (rows[i] != kMissingRow) return;
    auto it = pending_.find(keys[i]);
    const int64_t count = (it == pending_.end() ? 0 : it->second.count) + counts[i];
    if (count >= access_threshold) {
      rows[i] = kAdmit;
      ++admit;
    }
  });
  if (admit > 0) {
    if (!FitsLocked(size_ + admit)) admit = CountDistinct(keys, rows, n, kAdmit);
    if (growable_) {
      Status reserved = GrowForLocked(admit, "admits");
      if (!reserved.ok()) return reserved;
    } else if (size_ + admit > capacity_ &&
               size_ + CountDistinct(keys, rows, n, kAdmit) > capacity_) {
      // `admit` may count a repeated key twice: the recount is exact.
      return Status::ResourceExhausted(FullMessage(admit, "admits") +
                                       ", raise access_threshold, or evict idle keys more often.");
    } else {
      Status reserved = ReserveLocked(size_ + admit);
      if (!reserved.ok()) return reserved;
    }
  }
  if (timestamp > now_) now_ = timestamp;
  // Pass 2: admit in order of appearance, count the others, touch everything.
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] == kAdmit) {
      // A key repeated in `keys` is marked twice: its first occurrence takes the row.
      Slot& slot = slots_[Probe(keys[i])];
      if (slot.row == kMissingRow) {
        slot.key = keys[i];
        slot.row = TakeFreeRow();
        ++size_;
        ++admissions_;
        pending_.erase(keys[i]);
      }
      rows[i] = slot.row;
    } else if (rows[i] == kMissingRow) {
      Pending& pending = pending_.try_emplace(keys[i], Pending{0, time}).first->second;
      pending.count += counts[i];
      pending.last_seen = time;
      continue;
    }
    TouchLocked(rows[i], time);
    MarkChangedLocked(&rows[i], 1, &counts[i]);
  }
  return Status::Ok();
}

void KeyIndex::EraseSlotLocked(uint64_t s) {
  // Backward-shift deletion (Knuth, TAOCP vol. 3, algorithm R): an entry after
  // the hole moves into it unless its home slot lies cyclically in (hole, j].
  uint64_t hole = s;
  uint64_t j = s;
  while (true) {
    if (++j == num_slots_) j = 0;
    if (slots_[j].row == kMissingRow) break;
    const uint64_t home = Home(slots_[j].key);
    const bool stays = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
    if (!stays) {
      slots_[hole] = slots_[j];
      hole = j;
    }
  }
  slots_[hole] = Slot{0, kMissingRow};
}

void KeyIndex::Evict(int64_t idle, std::vector<int64_t>* freed_rows) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  if (now_ < 0) return;
  const int64_t seen = static_cast<int64_t>(last_seen_.size());
  std::vector<int64_t> victims;
  for (const Slot& slot : slots_) {
    if (slot.row != kMissingRow && slot.row < seen && now_ - last_seen_[slot.row] > idle) {
      victims.push_back(slot.key);
    }
  }
  const size_t first = freed_rows->size();
  for (int64_t key : victims) {
    const uint64_t s = Probe(key);
    freed_rows->push_back(slots_[s].row);
    free_rows_.push_back(slots_[s].row);
    if (tracking_) deleted_.push_back(key);
    // A freed row's next key starts its count anew.
    if (static_cast<size_t>(slots_[s].row) < touches_.size()) touches_[slots_[s].row] = 0;
    EraseSlotLocked(s);
    --size_;
    ++evictions_;
  }
  std::sort(freed_rows->begin() + first, freed_rows->end());
  std::sort(free_rows_.begin(), free_rows_.end(), std::greater<int64_t>());
  for (auto it = pending_.begin(); it != pending_.end();) {
    it = now_ - it->second.last_seen > idle ? pending_.erase(it) : std::next(it);
  }
  // Sized by use after eviction too: below load 2/3 (more than 24 B per key),
  // rehash to load 0.75. Keeping the larger array is fine when the host
  // cannot allocate the smaller one.
  const uint64_t size = static_cast<uint64_t>(size_);
  if (num_slots_ > kMinSlots && 2 * num_slots_ > 3 * size + 3) {
    (void)RehashLocked(std::max(kMinSlots, size + (size + 2) / 3), size_);
  }
}

KeyIndex::Stats KeyIndex::stats() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  Stats stats;
  stats.size = size_;
  stats.capacity = capacity_;
  stats.admissions = admissions_;
  stats.evictions = evictions_;
  stats.pending = static_cast<int64_t>(pending_.size());
  return stats;
}

void KeyIndex::ExportState(State* state) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  ExportStateLocked(/*changed_only=*/false, state);
}

void KeyIndex::ExportStateLocked(bool changed_only, State* state, int64_t min_count) const {
  *state = State();
  const int64_t seen = static_cast<int64_t>(last_seen_.size());
  const int64_t counted = static_cast<int64_t>(touches_.size());
  for (const Slot& slot : slots_) {
    if (slot.row == kMissingRow || (changed_only && !ChangedLocked(slot.row))) continue;
    if (changed_only && min_count > 0 &&
        (slot.row < counted ? static_cast<int64_t>(touches_[slot.row]) : 0) < min_count) {
      continue;
    }
    state->keys.push_back(slot.key);
    state->rows.push_back(slot.row);
    state->last_seen.push_back(slot.row < seen ? last_seen_[slot.row] : -1);
  }
  for (const auto& [key, pending] : pending_) {
    state->pending_keys.push_back(key);
    state->pending_counts.push_back(pending.count);
    state->pending_last_seen.push_back(pending.last_seen);
  }
  state->counters = {admissions_, evictions_, now_};
}

void KeyIndex::ExportChanges(bool clear, Changes* changes, int64_t min_count) {
  std::unique_lock<std::shared_mutex> lock(mu_);
  // Before any count (tracking or counting just began): no key is filtered.
  ExportStateLocked(/*changed_only=*/tracking_, &changes->changed,
                    count_touches_ ? min_count : 0);
  changes->deleted = deleted_;
  if (clear) {
    std::fill(changed_.begin(), changed_.end(), 0);
    std::vector<int64_t>().swap(deleted_);
    tracking_ = true;
    count_touches_ = min_count > 0;
    if (count_touches_) {
      std::fill(touches_.begin(), touches_.end(), 0);
    } else {
      std::vector<uint32_t>().swap(touches_);
    }
  }
}

bool KeyIndex::tracking_changes() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return tracking_;
}

bool KeyIndex::counting_touches() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return count_touches_;
}

Status KeyIndex::ImportState(const State& state) {
  const size_t n = state.keys.size();
  const size_t p = state.pending_keys.size();
  if (state.rows.size() != n || state.last_seen.size() != n || state.pending_counts.size() != p ||
      state.pending_last_seen.size() != p || state.counters.size() != 3) {
    std::ostringstream msg;
    msg << "table '" << name_ << "': inconsistent admission state: " << n << " keys, "
        << state.rows.size() << " rows, " << state.last_seen.size() << " last-seen times, " << p
        << " pending keys, " << state.pending_counts.size() << " counts, "
        << state.pending_last_seen.size() << " pending times, " << state.counters.size()
        << " counters (3 expected)";
    return Status::InvalidArgument(msg.str());
  }
  std::vector<bool> row_used;
  std::vector<int64_t> sorted_keys;
  Status valid = ValidateImport(state.keys.data(), state.rows.data(), static_cast<int64_t>(n),
                                &row_used, &sorted_keys);
  if (!valid.ok()) return valid;
  for (size_t i = 0; i < p; ++i) {
    const int64_t key = state.pending_keys[i];
    if (state.pending_counts[i] < 0) {
      std::ostringstream msg;
      msg << "table '" << name_ << "': pending key " << key << " has a negative count "
          << state.pending_counts[i];
      return Status::InvalidArgument(msg.str());
    }
    if (std::binary_search(sorted_keys.begin(), sorted_keys.end(), key)) {
      std::ostringstream msg;
      msg << "table '" << name_ << "': key " << key << " is imported both admitted and pending";
      return Status::InvalidArgument(msg.str());
    }
  }
  // One exclusive lock over the whole replacement: no insert lands in between.
  std::unique_lock<std::shared_mutex> lock(mu_);
  Status imported = ImportLocked(state.keys.data(), state.rows.data(), static_cast<int64_t>(n),
                                 row_used);
  if (!imported.ok()) return imported;
  for (size_t i = 0; i < n; ++i) TouchLocked(state.rows[i], state.last_seen[i]);
  for (size_t i = 0; i < p; ++i) {
    pending_[state.pending_keys[i]] = Pending{state.pending_counts[i], state.pending_last_seen[i]};
  }
  admissions_ = state.counters[0];
  evictions_ = state.counters[1];
  now_ = state.counters[2];
  return Status::Ok();
}

void KeyIndex::Find(const int64_t* keys, int64_t n, int64_t* rows) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  ProbePipelined(keys, n, rows, [&](int64_t i, uint64_t s) { rows[i] = slots_[s].row; });
}

void KeyIndex::Export(std::vector<int64_t>* keys, std::vector<int64_t>* rows) const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  keys->clear();
  rows->clear();
  keys->reserve(size_);
  rows->reserve(size_);
  for (const Slot& slot : slots_) {
    if (slot.row == kMissingRow) continue;
    keys->push_back(slot.key);
    rows->push_back(slot.row);
  }
}

Status KeyIndex::Import(const int64_t* keys, const int64_t* rows, int64_t n) {
  std::vector<bool> row_used;
  std::vector<int64_t> sorted_keys;
  Status valid = ValidateImport(keys, rows, n, &row_used, &sorted_keys);
  if (!valid.ok()) return valid;
  std::unique_lock<std::shared_mutex> lock(mu_);
  return ImportLocked(keys, rows, n, row_used);
}

Status KeyIndex::ValidateImport(const int64_t* keys, const int64_t* rows, int64_t n,
                                std::vector<bool>* row_used,
                                std::vector<int64_t>* sorted_keys) const {
  const int64_t limit = growable_ ? kMaxCapacity : capacity_;
  if (n > limit) {
    std::ostringstream msg;
    msg << "table '" << name_ << "': cannot import " << n << " keys into "
        << (growable_ ? "a growable index of at most " : "device_vocabulary_size=") << limit;
    return Status::InvalidArgument(msg.str());
  }
  // Rows of a growable index are dense too: they never pass the number of keys
  // (or the initial capacity), which also bounds this bitmap by the input.
  const int64_t row_bound = growable_ ? std::max(capacity_, n) : capacity_;
  row_used->assign(static_cast<size_t>(row_bound), false);
  for (int64_t i = 0; i < n; ++i) {
    if (rows[i] < 0 || rows[i] >= row_bound) {
      std::ostringstream msg;
      msg << "table '" << name_ << "': imported row " << rows[i] << " of key " << keys[i]
          << " is outside [0, " << row_bound << ")";
      return Status::InvalidArgument(msg.str());
    }
    if ((*row_used)[rows[i]]) {
      std::ostringstream msg;
      msg << "table '" << name_ << "': row " << rows[i] << " is imported twice";
      return Status::InvalidArgument(msg.str());
    }
    (*row_used)[rows[i]] = true;
  }
  sorted_keys->assign(keys, keys + n);
  std::sort(sorted_keys->begin(), sorted_keys->end());
  auto dup = std::adjacent_find(sorted_keys->begin(), sorted_keys->end());
  if (dup != sorted_keys->end()) {
    std::ostringstream msg;
    msg << "table '" << name_ << "': key " << *dup << " is imported twice";
    return Status::InvalidArgument(msg.str());
  }
  return Status::Ok();
}

Status KeyIndex::ImportLocked(const int64_t* keys, const int64_t* rows, int64_t n,
                              const std::vector<bool>& row_used) {
  SlotArray fresh;
  const uint64_t count = SlotsFor(n);
  Status allocated = AllocateSlots(count, n, &fresh);
  if (!allocated.ok()) return allocated;
  ClearLocked();
  std::swap(slots_, fresh);
  num_slots_ = count;
  // Keys are distinct (validated): each goes to the empty slot its probe
  // reaches, pipelined as FindOrInsert, in chunks of kImportChunk keys.
  int64_t homes[kImportChunk];
  for (int64_t start = 0; start < n; start += kImportChunk) {
    const int64_t* chunk = keys + start;
    ProbePipelined(chunk, std::min(kImportChunk, n - start), homes,
                   [&](int64_t i, uint64_t s) { slots_[s] = Slot{chunk[i], rows[start + i]}; });
  }
  const int64_t max_row = n == 0 ? -1 : *std::max_element(rows, rows + n);
  size_ = n;
  next_row_ = max_row + 1;
  // Descending, so that TakeFreeRow pops the lowest hole first.
  for (int64_t row = next_row_ - 1; row >= 0; --row) {
    if (!row_used[row]) free_rows_.push_back(row);
  }
  return Status::Ok();
}

void KeyIndex::Clear() {
  std::unique_lock<std::shared_mutex> lock(mu_);
  ClearLocked();
  SlotArray(kMinSlots, Slot{0, kMissingRow}).swap(slots_);
  num_slots_ = kMinSlots;
}

void KeyIndex::ClearLocked() {
  // Leaves slots_ to the caller (Clear shrinks it, ImportLocked replaces it).
  size_ = 0;
  next_row_ = 0;
  std::vector<int64_t>().swap(free_rows_);
  std::vector<int64_t>().swap(last_seen_);
  std::unordered_map<int64_t, Pending>().swap(pending_);
  now_ = -1;
  admissions_ = 0;
  evictions_ = 0;
  // Tracking stays as it was; what changed is relative to the new content.
  std::vector<uint64_t>().swap(changed_);
  std::vector<int64_t>().swap(deleted_);
  std::fill(touches_.begin(), touches_.end(), 0);
}

int64_t KeyIndex::size() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  return size_;
}

int64_t KeyIndex::MemoryBytes() const {
  std::shared_lock<std::shared_mutex> lock(mu_);
  // A pending key's node: next pointer + (key, Pending), 32 B, which glibc
  // malloc serves from a 48-B chunk; plus one bucket pointer per bucket (an
  // empty map's single bucket is inline: nothing allocated).
  constexpr size_t kPendingNodeBytes = 48;
  return static_cast<int64_t>(slots_.size() * sizeof(Slot) +
                              (free_rows_.capacity() + last_seen_.capacity() +
                               changed_.capacity() + deleted_.capacity()) *
                                  sizeof(int64_t) +
                              touches_.capacity() * sizeof(uint32_t) +
                              pending_.size() * kPendingNodeBytes +
                              (pending_.bucket_count() > 1 ? pending_.bucket_count() : 0) *
                                  sizeof(void*));
}

}  // namespace mxrec

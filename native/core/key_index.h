// Key index of the sparse core: maps raw int64 feature ids ("keys") to rows of an
// embedding table of fixed capacity. No TensorFlow includes: the op layer in
// native/kernels wraps this class in a tensorflow::ResourceBase.
//
// Mirrors the key -> offset map of mxRec's key process (Rec SDK "HBM mode"):
// a key gets a row the first time training sees it and keeps it; rows are handed
// out lowest-free-first, so a run is reproducible batch by batch.
//
// Storage: open addressing with linear probing over an array of 16-byte slots
// (key, row) sized by use, not by capacity: its load factor stays in [2/3, 0.8]
// (once past kMinSlots slots), so the index costs 20-24 bytes per stored key at
// any fill level (for batches of distinct keys, as the insert op passes them:
// a key repeated in a batch is counted, and reserved for, once per occurrence
// when the array grows). A batch that would pass load 0.8 first rehashes the array
// into floor(1.5 * keys) slots (load 2/3; growth factor >= 1.2, amortized O(1)
// per key); a fixed-capacity index never holds more than 1.25 * capacity slots.
// Slots are addressed by Lemire's multiply-shift range reduction of a 64-bit
// mix of the key, so the slot count need not be a power of two. An array of
// 2 MB or more is mapped on 2-MB (transparent huge) pages, so that random
// probes rarely miss the TLB, and grows in place: its pages move into the
// larger block (mremap, HugePageArray in huge_page_allocator.h), only the
// increment is fresh memory, and the keys are rehashed in place. Batches are
// probed software-pipelined: every key's home slot is computed first, then each
// probe prefetches 3 cache lines from the home slot of the key 16 places ahead
// (insertion, lookup and Import alike). Evict shrinks the array back to load
// 0.75 when it falls below 2/3. Admission adds its own per-key state on top
// (see MemoryBytes).
//
// Growable mode (dynamic-expansion tables, see native/core/row_store.h): the
// capacity is only the initial size. Insertion never fails for lack of rows.
//
// Admission and eviction (mxRec's FeatureSpec access_threshold / eviction_threshold,
// see docs/admission-eviction.md): FindOrInsertAdmitting counts how often each
// absent key was seen and gives it a row only once its count reaches the
// threshold; it records each key's last-seen timestamp, and Evict removes keys
// idle longer than a threshold (backward-shift deletion, no tombstones), their
// rows going back to the free list.
//
// Thread safety: every public method is thread-safe. Readers (Find, Export,
// ExportState, size, stats) take a shared lock; writers (FindOrInsert,
// FindOrInsertAdmitting, Evict, Import, ImportState, Clear) an exclusive one.
#ifndef MXREC_PIPELINE_NATIVE_CORE_KEY_INDEX_H_
#define MXREC_PIPELINE_NATIVE_CORE_KEY_INDEX_H_

#include <cstdint>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "huge_page_allocator.h"
#include "status.h"

namespace mxrec {

// Row id given to keys that are absent (Find) : reads get the default value.
inline constexpr int64_t kMissingRow = -1;

// Deduplicates `keys` (n) in first-occurrence order.
// On return `unique` holds the distinct keys and restore[i] is the position of
// keys[i] in `unique`, so keys[i] == unique[restore[i]].
// `expected_unique`: how many distinct keys the caller expects (e.g. the
// previous batch's count; 0: no guess): the local hash set starts at that
// size, instead of doubling up to it from 16k slots (which rehashes, for 200k
// distinct keys, 250k keys on the way). Only speed depends on it.
// Stateless and thread-safe. Runs in O(n) expected time with a local hash set.
void Deduplicate(const int64_t* keys,  // (n)
                 int64_t n,
                 std::vector<int64_t>* unique,  // out: (u)
                 int32_t* restore,              // out: (n)
                 int64_t expected_unique = 0);

class KeyIndex {
 public:
  // Largest supported capacity (2^40, about 10^12 rows): the slot count, twice
  // the capacity rounded up to a power of two, must not overflow.
  static constexpr int64_t kMaxCapacity = int64_t{1} << 40;

  // `capacity`: the number of rows (mxRec's device_vocabulary_size), in
  // [1, kMaxCapacity]; callers check. `name`: the table name, used in error
  // messages. `growable`: rows are handed out past `capacity` (the index grows,
  // up to kMaxCapacity keys). Allocates only kMinSlots slots: the slot array
  // grows with the keys stored.
  // `rows_text` and `grow_text` word the "table is full" errors when the rows
  // are not just device_vocabulary_size (a tiered table's device + host + SSD
  // rows): "is full: <rows_text>, N used, ... <grow_text>". Empty: the
  // defaults "device_vocabulary_size=<capacity> rows" and "Create the table
  // with a larger device_vocabulary_size".
  KeyIndex(int64_t capacity, std::string name, bool growable = false, std::string rows_text = "",
           std::string grow_text = "");

  KeyIndex(const KeyIndex&) = delete;
  KeyIndex& operator=(const KeyIndex&) = delete;

  // Training path: writes the row of each key to rows[i], giving absent keys the
  // lowest free rows in order of appearance. All or nothing: when the absent keys
  // do not fit, nothing is inserted and ResourceExhausted names the table, its
  // capacity and the remedy. A growable index only fails past kMaxCapacity keys,
  // or with ResourceExhausted when the host cannot hold the larger slot array.
  // One probe per key while the slot array has room: an absent key goes into
  // the empty slot its probe reached; the keys past the array's room wait for
  // one rehash; a failing batch undoes what it inserted (rows and free list
  // as before).
  // `occurrences` (or nullptr: once each): how often keys[i] occurred in the
  // batch, counted for ExportChanges' min_count when it counts touches.
  Status FindOrInsert(const int64_t* keys,  // (n)
                      int64_t n,
                      int64_t* rows,  // out: (n)
                      const int64_t* occurrences = nullptr);  // (n) or nullptr

  // Training path with admission. `keys` are distinct; counts[i] (>= 0) is how
  // often keys[i] was seen in the batch (times the feature's faae_coefficient).
  // A present key keeps its row. An absent key adds counts[i] to its pending
  // count and gets a row (lowest free first, in order) once that count reaches
  // `access_threshold`, else rows[i] = kMissingRow. `timestamp` (seconds, or -1
  // when the batch has none) becomes the last-seen time of every key of the
  // batch (-1: the latest timestamp seen so far). All or nothing on a full
  // table, as FindOrInsert.
  Status FindOrInsertAdmitting(const int64_t* keys,    // (n)
                               const int64_t* counts,  // (n)
                               int64_t n, int64_t access_threshold, int64_t timestamp,
                               int64_t* rows);  // out: (n)

  // Removes every key, admitted or pending, whose last-seen time is more than
  // `idle` seconds before the latest timestamp seen. Admitted keys' rows go to
  // the free list (reused lowest first); they are appended to `freed_rows` in
  // ascending order. Does nothing before any timestamp was seen.
  void Evict(int64_t idle, std::vector<int64_t>* freed_rows);

  struct Stats {
    int64_t size = 0;        // keys with a row
    int64_t capacity = 0;    // capacity()
    int64_t admissions = 0;  // keys given a row since creation (or the restored value)
    int64_t evictions = 0;   // admitted keys removed by Evict
    int64_t pending = 0;     // keys counted but not admitted
  };
  Stats stats() const;

  // Everything admission and eviction keep, for checkpoints: (keys, rows,
  // last_seen) of the admitted keys, (pending_keys, pending_counts,
  // pending_last_seen), and counters = {admissions, evictions, latest timestamp}.
  struct State {
    std::vector<int64_t> keys, rows, last_seen;
    std::vector<int64_t> pending_keys, pending_counts, pending_last_seen;
    std::vector<int64_t> counters;  // (3)
  };
  void ExportState(State* state) const;
  // Replaces the whole content with `state`, atomically (one exclusive lock);
  // validates as Import, that the vectors of each group have one length and
  // counters three values, that pending counts are >= 0 and that no pending key
  // is also admitted (InvalidArgument naming the table, changing nothing).
  Status ImportState(const State& state);

  // Change tracking, for delta checkpoints (docs/restarts.md). Off until the
  // first ExportChanges with `clear`: from then on every row a training insert
  // gives or finds (FindOrInsert, FindOrInsertAdmitting: the rows a step
  // updates, with their last-seen times) is marked changed, and every admitted
  // key Evict removes is logged as deleted. Import, ImportState and Clear
  // drop the marks and the log (the restored content is the new base).
  // Costs 1 bit per row handed out and 8 B per key deleted since the last
  // clear.
  struct Changes {
    // The admitted keys whose rows changed (keys, rows, last_seen), the whole
    // pending state and the counters, as ExportState. Every admitted key when
    // tracking was off.
    State changed;
    std::vector<int64_t> deleted;  // Keys Evict removed, in eviction order.
  };
  // The changes since tracking began or since the last call with `clear`,
  // which then starts anew (and turns tracking on). `min_count` > 0 (mxRec's
  // recent_key_count_threshold): only the changed keys whose rows training
  // touched at least that often since the last clear (their occurrences in
  // the batches; the admission counts with admission); the others are left
  // out (their marks cleared with the rest). Touches are counted (4 B per row)
  // from a call with `clear` and `min_count` > 0 until one with `clear` and 0.
  void ExportChanges(bool clear, Changes* changes, int64_t min_count = 0);
  bool tracking_changes() const;
  bool counting_touches() const;

  // Evaluation path: rows[i] is the row of keys[i], or kMissingRow if absent.
  // Never inserts.
  void Find(const int64_t* keys,  // (n)
            int64_t n,
            int64_t* rows) const;  // out: (n)

  // Snapshot of every (key, row) pair, in slot order (unspecified).
  void Export(std::vector<int64_t>* keys, std::vector<int64_t>* rows) const;

  // Replaces the whole content with (keys[i], rows[i]). Validates first and
  // changes nothing on error: keys must be distinct, rows distinct and in
  // [0, capacity) -- for a growable index in [0, max(capacity, n)).
  Status Import(const int64_t* keys,  // (n)
                const int64_t* rows,  // (n)
                int64_t n);

  // Removes every key.
  void Clear();

  int64_t size() const;
  // The capacity given at construction (a growable index may hold more keys).
  int64_t capacity() const { return capacity_; }
  bool growable() const { return growable_; }
  const std::string& name() const { return name_; }
  // Bytes held by the index itself, not the rows: the slot array (16 B a slot,
  // 20-24 B per stored key), the free list (8 B per evicted row not reused
  // yet) and, with admission, the last-seen times (8 B per row, up to 10 B with
  // the 1.25x growth slack) and the pending keys (their hash map's nodes, 48 B
  // each as allocated by glibc malloc, and 8 B per bucket); tracking changes,
  // 1 bit per row (up to 1.25 bits with growth slack) and 8 B per deleted key.
  int64_t MemoryBytes() const;

  // Fewest slots the array holds (an empty index: 256 bytes).
  static constexpr uint64_t kMinSlots = 16;

 private:
  struct Slot {
    int64_t key;
    int64_t row;  // kMissingRow marks an empty slot.
  };
  // The slot array: 2-MB pages once it is 2 MB or more, grown in place
  // (huge_page_allocator.h).
  using SlotArray = HugePageArray<Slot>;
  // Marks, in Slot::row, a key GrowLocked has placed below its scan.
  static constexpr int64_t kMovedBit = int64_t{1} << 62;

  // Checks Import's input without the lock; fills the rows in use (bitmap over
  // the row bound) and the keys in ascending order.
  Status ValidateImport(const int64_t* keys,  // (n)
                        const int64_t* rows,  // (n)
                        int64_t n, std::vector<bool>* row_used,
                        std::vector<int64_t>* sorted_keys) const;  // out: (n)
  // Replaces the content with validated (keys, rows). Caller holds mu_
  // exclusively. Fails, changing nothing, only when a growable index cannot grow.
  Status ImportLocked(const int64_t* keys,  // (n)
                      const int64_t* rows,  // (n)
                      int64_t n, const std::vector<bool>& row_used);
  // Slot index holding `key`, or of the empty slot where it would go.
  uint64_t Probe(int64_t key) const;
  // Probe, starting at slot `s` (a slot at or after the key's home whose
  // predecessors in its probe run hold other keys).
  uint64_t ProbeFrom(uint64_t s, int64_t key) const;
  // The first slot probed for `key`.
  uint64_t Home(int64_t key) const;
  // Probes keys[0..n) in order, software-pipelined: every key's home slot
  // first (into homes[i]), then the probes, each prefetching the home slot
  // kPrefetchDistance keys ahead. visit(i, s) gets the slot of keys[i] (holding
  // it, or the empty slot where it would go); it may overwrite homes[j] for
  // j <= i, so `homes` may be the caller's output array.
  template <typename Visit>
  void ProbePipelined(const int64_t* keys,  // (n)
                      int64_t n,
                      int64_t* homes,  // scratch: (n)
                      Visit&& visit) const;
  // Slots for `keys` keys at load 2/3 (at least kMinSlots; for a fixed-capacity
  // index at most 1.25 * capacity).
  uint64_t SlotsFor(int64_t keys) const;
  // Whether `keys` keys fit in the slot array at load factor <= 0.8.
  bool FitsLocked(int64_t keys) const;
  // A fresh array of `count` empty slots in `slots`, or ResourceExhausted when
  // the host cannot allocate it (`keys`: the keys it is for, in the message).
  Status AllocateSlots(uint64_t count, int64_t keys, SlotArray* slots) const;
  // The ResourceExhausted of an array of `count` slots for `keys` keys.
  Status AllocationError(uint64_t count, int64_t keys) const;
  // Rehashes every key into `count` slots, made for `keys` keys (named in the
  // error): GrowLocked when the array grows, else into a fresh array. Caller
  // holds mu_ exclusively. Fails (changing nothing) when the host cannot
  // allocate it.
  Status RehashLocked(uint64_t count, int64_t keys);
  // Grows the array to `count` (> num_slots_) slots in place
  // (HugePageArray::Grow: no copy of the old slots) and rehashes it in place.
  Status GrowLocked(uint64_t count, int64_t keys);
  // Next row to hand out; caller holds mu_ exclusively and has checked room.
  int64_t TakeFreeRow();
  // Stores `key` with the next row in the empty `slot`; returns the row. Caller
  // holds mu_ exclusively and has checked room (slots and rows).
  int64_t InsertAtLocked(Slot& slot, int64_t key);
  // Removes the keys FindOrInsert inserted, keys[i] for i in `inserted` (in
  // insertion order, rows[i] their rows), and gives their rows back as they
  // were before it: next_row_ = next_row_before, popped free rows pushed back.
  void UndoInsertsLocked(const int64_t* keys,  // (n)
                         const int64_t* rows,  // (n)
                         const std::vector<int64_t>& inserted, int64_t next_row_before);
  void ClearLocked();
  // Makes room for `keys` keys at load factor <= 0.8, rehashing into a larger
  // slot array (load 2/3). Caller holds mu_ exclusively. Fails (changing
  // nothing) when the host cannot allocate it.
  Status ReserveLocked(int64_t keys);
  // Growable mode: room for `new_keys` more, or ResourceExhausted past
  // kMaxCapacity ("this batch <verb> N new keys"). Caller holds mu_ exclusively.
  Status GrowForLocked(int64_t new_keys, const char* verb);
  // Removes the key in slot `s` by shifting the following probe run back.
  void EraseSlotLocked(uint64_t s);
  // Writes `time` as the last-seen time of `row`, growing last_seen_.
  void TouchLocked(int64_t row, int64_t time);
  // Marks rows[0..n) changed (rows < 0 skipped) when tracking changes, and
  // adds counts[i] (nullptr: 1) to their touches when counting them.
  void MarkChangedLocked(const int64_t* rows, int64_t n, const int64_t* counts = nullptr);
  bool ChangedLocked(int64_t row) const;
  // ExportState's content (only the admitted keys of changed rows touched at
  // least `min_count` times when `changed_only`); caller holds mu_.
  void ExportStateLocked(bool changed_only, State* state, int64_t min_count = 0) const;

  struct Pending {
    int64_t count;
    int64_t last_seen;
  };

  // The "is full" error's start, with the table's rows and the remedy.
  std::string FullMessage(int64_t new_keys, const char* verb) const;

  const int64_t capacity_;
  const std::string name_;
  const bool growable_;
  const std::string rows_text_;
  const std::string grow_text_;

  mutable std::shared_mutex mu_;
  uint64_t num_slots_;             // guarded by mu_: slots_.size()
  SlotArray slots_;                // guarded by mu_
  int64_t size_ = 0;               // guarded by mu_
  int64_t next_row_ = 0;           // guarded by mu_: rows >= next_row_ are free
  std::vector<int64_t> free_rows_; // guarded by mu_: free rows < next_row_, descending
  std::vector<int64_t> last_seen_; // guarded by mu_: row -> last-seen time, grown on use
  std::unordered_map<int64_t, Pending> pending_;  // guarded by mu_: key -> count, time
  int64_t now_ = -1;               // guarded by mu_: latest timestamp seen, -1 none
  int64_t admissions_ = 0;         // guarded by mu_
  int64_t evictions_ = 0;          // guarded by mu_
  bool tracking_ = false;          // guarded by mu_: change tracking on
  std::vector<uint64_t> changed_;  // guarded by mu_: bitmap of changed rows, grown on use
  bool count_touches_ = false;     // guarded by mu_: touches_ counted (ExportChanges' min_count)
  std::vector<uint32_t> touches_;  // guarded by mu_: row -> touches since the last clear
  std::vector<int64_t> deleted_;   // guarded by mu_: keys evicted since the last clear
};

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_CORE_KEY_INDEX_H_

// Device cache of a tiered table: decides which of the table's "global rows"
// live in the `device_rows` slots of the device variable, batch by batch. No
// TensorFlow includes: the op layer in native/kernels wraps this class in a
// tensorflow::ResourceBase.
//
// Mirrors the swap planning of mxRec's DDR/SSD modes (Rec SDK HybridMgmt with
// its LRU/LFU cache managers): the key process computes, for each batch and
// ahead of training, which rows leave the device for the host store (swap out)
// and which come in (swap in); the training step of that batch performs the
// moves before its lookup.
//
// Two mappings are kept. The PLANNED one is what the key process has decided
// so far (Plan, Release); the APPLIED one is what the device variable holds once
// the step of the latest applied plan has done its moves (Apply, Locate,
// ExportState). Between them sit pending records: each plan's events (swap_out,
// swap_in, and the hits that touch a slot) and the drops of released globals.
// Apply composes every pending record up to its plan into one set of moves, so
// plans whose batches were never trained (a dropped iterator) are folded in.
//
// A slot is pinned (never a victim) while the latest plan that used it has not
// finished training: its seq >= applied_seq, or it is used by the plan being
// made. When a plan needs more victims than there are unpinned slots, it waits
// for the training steps to catch up (Apply), then fails.
//
// Victims: the occupied slots are kept in eviction order, (last_used, slot)
// ascending for LRU and (frequency, last_used, slot) for LFU, and a victim is
// the first unpinned slot in that order.
//  - LRU: an intrusive doubly linked recency list over the slots (prev/next
//    int32 arrays), least recently used at the head. A plan unlinks its hits,
//    takes its victims from the head, then appends every slot it used (all with
//    last_used = its seq, above every other) at the tail in ascending slot
//    order, so the list stays sorted by (last_used, slot): O(1) per hit and per
//    victim, plus an O(n) radix sort of the plan's slots. Pinned slots have the
//    highest last_used, so they sit at the tail: when the head is pinned,
//    nothing is evictable (the room check rules that out before).
//  - LFU: an indexed binary min-heap (O(log n) per touch); pinned slots popped
//    while looking for a victim are pushed back after the plan.
//
// Storage: two int32 slot-of-global arrays (planned and applied, 8 bytes per
// global) sized by use: they cover the largest global planned so far (grown by
// 1.25x, at most total_rows; the key index hands globals out lowest first, so
// about 8-10 bytes per stored key, not per row of the table), and per-slot arrays (globals, last use, frequency, list
// links or heap and heap position; about 72 bytes per slot), plus the LRU sort
// buffers of the largest plan so far (up to 8 bytes per slot).
//
// Concurrent steps (pin_until_finish, the parameter-server mode): several
// training steps plan, apply and finish in any order (asynchronous workers
// reaching one ps shard). Each plan stays in flight from Plan until
// Finish(its token), and every slot whose latest use is at or after the
// oldest plan in flight is pinned: a slot a step reads or updates is never a
// victim of another step's plan, whatever order the steps finish in. A plan
// still in flight 2 x wait_seconds after it was made is taken as lost (its
// worker died mid-step) and stops pinning once a plan needs its room (a
// step that was only slow then fails at its Finish, not silently); a
// plan waiting for room gives up after wait_seconds, so a step holding rows
// for less than that (e.g. an earlier lookup of the same step) makes it fail
// rather than lose its rows.
//
// Thread safety: every public method is thread-safe. Plan, Release, ImportState
// and Clear are serialized by a plan mutex held for the whole call; the state
// mutex guards everything else and is released while a plan waits, so Apply
// can run then.
#ifndef MXREC_PIPELINE_NATIVE_CORE_DEVICE_CACHE_H_
#define MXREC_PIPELINE_NATIVE_CORE_DEVICE_CACHE_H_

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "status.h"

namespace mxrec {

class DeviceCache {
 public:
  enum class Policy { kLru, kLfu };

  // Largest device_rows (slots are int32).
  static constexpr int64_t kMaxDeviceRows = (int64_t{1} << 31) - 1;
  // Bits of a token holding the plan's seq; the generation sits above them.
  static constexpr int kSeqBits = 40;

  // device_rows in [1, kMaxDeviceRows], total_rows in [device_rows,
  // KeyIndex::kMaxCapacity]; callers check. `name`: the table name, used in
  // error messages. `wait_seconds`: how long Plan waits for in-flight batches to
  // be trained when the cache has too few evictable slots. Allocates the arrays
  // (std::bad_alloc when the host cannot).
  // `pin_until_finish`: the concurrent-steps mode above (false: the key
  // process plans ahead of one training loop).
  DeviceCache(int64_t device_rows, int64_t total_rows, Policy policy, std::string name,
              double wait_seconds, bool pin_until_finish = false);

  DeviceCache(const DeviceCache&) = delete;
  DeviceCache& operator=(const DeviceCache&) = delete;

  // Key-process side. `globals` (n): a batch's distinct global rows; -1 entries
  // (ids without a row) may repeat and map to slot -1. Fills slots (n) with the
  // device slot of each global and *token with the plan's token
  // (generation << kSeqBits | seq). Cached globals are hits (touched); misses
  // take the lowest free slot, else a victim chosen by the policy among the
  // unpinned slots. Records the plan's events as a pending record.
  // Errors (nothing changes): InvalidArgument for globals outside
  // [-1, total_rows), duplicates, or more distinct globals than device_rows;
  // ResourceExhausted when, after waiting up to wait_seconds for Apply, the
  // misses still exceed the free and unpinned slots; Cancelled when
  // `cancelled` (polled every 100 ms while waiting) returns true, e.g. the
  // input pipeline was stopped. `wait` false: the caller is the thread that
  // trains (an eager or in-step lookup), so no Apply or Finish can come while
  // it waits: a plan without room fails at once, saying which batches hold the
  // device rows.
  Status Plan(const int64_t* globals,  // (n)
              int64_t n,
              int64_t* slots,  // out: (n)
              int64_t* token,
              const std::function<bool()>& cancelled = nullptr, bool wait = true);

  // The moves the step applying plan `token` makes, composed over every pending
  // record with seq <= the token's seq. The step does, in this order: read the
  // swap_out rows and the swap_in source rows from the device variable;
  // store.Erase(erase_globals); store.Take(swap_in globals with source -1);
  // store.Put(swap_out); write every swap_in row into its slot.
  struct Moves {
    std::vector<int64_t> swap_out_slots, swap_out_globals;  // device rows to put in the store
    std::vector<int64_t> swap_in_slots, swap_in_globals;    // device slots to fill
    std::vector<int64_t> swap_in_sources;  // per swap_in: applied slot to copy from, or -1 (store)
    std::vector<int64_t> erase_globals;    // released globals to erase from the store first
  };
  // A token already applied gives empty moves. FailedPrecondition for a token
  // of another generation (planned before ImportState or Clear); InvalidArgument
  // for a seq never planned.
  Status Apply(int64_t token, Moves* moves);

  // The step that applied plan `token` has finished (its optimizer update ran):
  // that batch's slots stop being pinned, so the next plan may evict them
  // without waiting for the next Apply. Without Finish, the batch of the latest
  // Apply stays pinned until the next one. Tokens of another generation are
  // ignored; seqs past the applied one count as the applied one.
  // pin_until_finish: the plan `token` leaves the plans in flight (a token
  // finished twice, or never planned, changes nothing); FailedPrecondition,
  // naming the table, when the plan had been taken as lost (unfinished for
  // 2 x wait_seconds): its slots may have gone to other keys while its step
  // read and updated them, so the step must fail rather than pass silently.
  Status Finish(int64_t token);

  // The key index freed these globals: each cached one leaves the planned
  // mapping (its slot becomes free, no swap out) and every one gets a drop event
  // (its store row is erased by the Apply that reaches the next plan). Ignores
  // -1; InvalidArgument (changing nothing) for globals outside [-1, total_rows).
  Status Release(const int64_t* globals,  // (n)
                 int64_t n);

  // Evaluation reads, on the applied mapping: the slot of each global, -1 when
  // not on the device (or -1 / out of range), -2 when a drop of it is pending.
  void Locate(const int64_t* globals,  // (n)
              int64_t n,
              int64_t* slots) const;  // out: (n)

  // The applied state, for checkpoints.
  struct State {
    std::vector<int64_t> slots, globals, last_used, frequency;  // applied pairs, no pending drops
    std::vector<int64_t> dropped;   // globals with a pending drop
    std::vector<int64_t> counters;  // {applied_seq, hits, misses, swap_outs, swap_ins}
  };
  void ExportState(State* state) const;
  // Replaces everything: planned = applied = the state's pairs; pending records
  // cleared, then a drop is queued again for each of `dropped`; both seq
  // counters = max(counters[0], max last_used); generation + 1. Validates first
  // (InvalidArgument naming the table, changing nothing): four vectors of one
  // length, slots distinct in [0, device_rows), globals distinct in
  // [0, total_rows), last_used >= 0, frequency >= 1, dropped in [0, total_rows)
  // and not among the globals, five counters.
  Status ImportState(const State& state);

  // Empties the cache, clears pending records and counters; generation + 1.
  void Clear();

  struct Stats {
    int64_t device_rows = 0;
    int64_t occupied = 0;  // slots holding a global in the planned mapping
    int64_t hits = 0;      // counted by Plan
    int64_t misses = 0;
    int64_t swap_outs = 0;  // counted by Apply
    int64_t swap_ins = 0;
    int64_t pending_plans = 0;  // planned, not applied
    int64_t in_flight = 0;      // pin_until_finish: planned, not finished
  };
  Stats stats() const;

  // Bytes of the arrays, of the LRU sort buffers and of the pending records.
  int64_t MemoryBytes() const;
  const std::string& name() const { return name_; }
  int64_t device_rows() const { return device_rows_; }
  int64_t total_rows() const { return total_rows_; }
  Policy policy() const { return policy_; }
  bool pin_until_finish() const { return pin_until_finish_; }

 private:
  enum class EventKind : int8_t { kHit, kSwapOut, kSwapIn, kDrop };
  struct Event {
    EventKind kind;
    int64_t slot;    // -1 for a drop
    int64_t global;  // -1 for a hit
  };
  struct Record {
    int64_t seq;
    std::vector<Event> events;
  };

  // LFU: indexed heap of the occupied planned slots.
  // Heap order of occupied slots: true when slot a is evicted before b.
  bool Before(int64_t a, int64_t b) const;
  void HeapSwap(int64_t i, int64_t j);
  void SiftUp(int64_t i);
  void SiftDown(int64_t i);
  void HeapPush(int64_t slot);
  void HeapRemove(int64_t slot);
  int64_t HeapPop();

  // LRU: recency list of the occupied planned slots.
  void ListAppend(int64_t slot);  // at the tail (most recently used)
  void ListUnlink(int64_t slot);
  // Sorts lru_plan_ ascending (values in [0, device_rows_)); lru_scratch_ must
  // have its size. Radix sort, O(size) for any device_rows; no allocation.
  void SortPlanSlots();

  // Plans with seq >= this one are in flight (their slots are pinned):
  // max(applied_seq_, finished_seq_ + 1); pin_until_finish: the oldest plan
  // in flight, or past every plan when none is.
  int64_t PinFloorLocked() const {
    if (pin_until_finish_) {
      return in_flight_.empty() ? planned_seq_ + 1 : in_flight_.begin()->first;
    }
    return std::max(applied_seq_, finished_seq_ + 1);
  }
  // pin_until_finish: drops the plans in flight made more than 2 x
  // wait_seconds ago (lost steps); true when any was dropped.
  bool DropLostPlansLocked();
  // Occupied planned slots whose last use is >= PinFloorLocked().
  int64_t PinnedLocked() const;
  void CountUse(int64_t seq, int64_t delta);
  // Lowest free slot, or -1.
  int64_t TakeFreeSlot();
  int64_t FreeCountLocked() const;
  // Slots holding a global in the planned mapping.
  int64_t OccupiedLocked() const { return device_rows_ - FreeCountLocked(); }
  // The pending record of `seq` (appended if the last one is older).
  Record* RecordFor(int64_t seq);
  // Empties both mappings, the free list, the heap or list and the pending
  // records.
  void ResetLocked();
  Status OutOfRange(int64_t global, int64_t position, const char* what) const;
  // Grows both slot-of-global maps to cover `max_global` (-1: nothing), by
  // 1.25x at least, at most to total_rows. Caller holds mu_. ResourceExhausted
  // (changing nothing) when the host cannot allocate them.
  Status CoverGlobalLocked(int64_t max_global);
  // planned_slot_of_[global] / applied_slot_of_[global], or -1 past the maps.
  // Caller holds mu_.
  int64_t PlannedSlotLocked(int64_t global) const;
  int64_t AppliedSlotLocked(int64_t global) const;

  const int64_t device_rows_;
  const int64_t total_rows_;
  const Policy policy_;
  const std::string name_;
  const double wait_seconds_;
  const bool pin_until_finish_;

  std::mutex plan_mu_;  // serializes Plan, Release, ImportState, Clear
  mutable std::mutex mu_;
  std::condition_variable applied_cv_;  // notified when applied_seq_ advances

  // Planned mapping (guarded by mu_, changed only under plan_mu_ too).
  std::vector<int32_t> planned_slot_of_;  // global -> slot, -1 none
  std::vector<int64_t> planned_global_;   // slot -> global, -1 free
  std::vector<int64_t> last_used_;        // slot -> seq of its latest plan
  std::vector<int64_t> frequency_;        // slot -> plans using it since it came in
  // LFU only (empty for LRU).
  std::vector<int32_t> heap_;      // occupied slots, min-heap by Before
  std::vector<int32_t> heap_pos_;  // slot -> position in heap_, -1 none
  // LRU only (empty for LFU): occupied slots by (last_used, slot); unlinked
  // slots have -1 links (so have the ends).
  std::vector<int32_t> lru_prev_, lru_next_;  // slot -> neighbour slot, -1 none
  int32_t lru_head_ = -1;                     // least recently used, -1 when empty
  int32_t lru_tail_ = -1;
  // Plan scratch (LRU): the slots used by the plan being made, and the radix
  // sort's second buffer. Kept between plans to reuse their capacity.
  std::vector<int32_t> lru_plan_, lru_scratch_;
  std::vector<int64_t> free_slots_;       // freed slots < next_free_, min-heap
  int64_t next_free_ = 0;                 // slots >= next_free_ are free
  std::map<int64_t, int64_t> uses_;       // last_used -> occupied slots with it
  int64_t planned_seq_ = 0;

  // Applied mapping (guarded by mu_).
  std::vector<int32_t> applied_slot_of_;
  std::vector<int64_t> applied_global_;
  std::vector<int64_t> applied_last_used_;
  std::vector<int64_t> applied_frequency_;
  int64_t applied_seq_ = 0;
  int64_t finished_seq_ = 0;  // latest plan whose step finished (Finish)
  // pin_until_finish: seq -> when it was planned, of the plans not finished.
  std::map<int64_t, std::chrono::steady_clock::time_point> in_flight_;
  // pin_until_finish: seqs of plans taken as lost, until their Finish comes.
  std::set<int64_t> lost_;

  std::deque<Record> pending_;                          // guarded by mu_, seq ascending
  std::unordered_map<int64_t, int64_t> pending_drops_;  // guarded by mu_: global -> count
  int64_t generation_ = 1;                              // guarded by mu_
  int64_t hits_ = 0, misses_ = 0, swap_outs_ = 0, swap_ins_ = 0;  // guarded by mu_
};

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_CORE_DEVICE_CACHE_H_

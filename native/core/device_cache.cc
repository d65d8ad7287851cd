#include "device_cache.h"

#include <algorithm>
#include <cassert>
#include <chrono>
#include <cstring>
#include <functional>
#include <new>
#include <sstream>
#include <utility>

namespace mxrec {
namespace {

// Temporary mark of a batch's misses in planned_slot_of_ / slots while Plan
// classifies them (restored before the state lock is released).
constexpr int64_t kMissMark = -2;
// Composition places of a global besides a slot.
constexpr int64_t kInStore = -1;
constexpr int64_t kDroppedPlace = -3;
// Longest wait honoured (a larger wait_seconds would overflow the clock).
constexpr double kMaxWaitSeconds = 1e7;

constexpr int64_t kSeqMask = (int64_t{1} << DeviceCache::kSeqBits) - 1;

}  // namespace

DeviceCache::DeviceCache(int64_t device_rows, int64_t total_rows, Policy policy, std::string name,
                         double wait_seconds, bool pin_until_finish)
    : device_rows_(device_rows),
      total_rows_(total_rows),
      policy_(policy),
      name_(std::move(name)),
      wait_seconds_(std::min(std::max(wait_seconds, 0.0), kMaxWaitSeconds)),
      pin_until_finish_(pin_until_finish),
      planned_global_(device_rows, -1),
      last_used_(device_rows, 0),
      frequency_(device_rows, 0),
      applied_global_(device_rows, -1),
      applied_last_used_(device_rows, 0),
      applied_frequency_(device_rows, 0) {
  if (policy_ == Policy::kLfu) {
    heap_.reserve(device_rows);
    heap_pos_.assign(device_rows, -1);
  } else {
    lru_prev_.assign(device_rows, -1);
    lru_next_.assign(device_rows, -1);
  }
}

// ---------------------------------------------------------------------------
// Indexed heap of occupied planned slots.

bool DeviceCache::Before(int64_t a, int64_t b) const {
  if (policy_ == Policy::kLfu && frequency_[a] != frequency_[b]) {
    return frequency_[a] < frequency_[b];
  }
  if (last_used_[a] != last_used_[b]) return last_used_[a] < last_used_[b];
  return a < b;
}

void DeviceCache::HeapSwap(int64_t i, int64_t j) {
  std::swap(heap_[i], heap_[j]);
  heap_pos_[heap_[i]] = static_cast<int32_t>(i);
  heap_pos_[heap_[j]] = static_cast<int32_t>(j);
}

void DeviceCache::SiftUp(int64_t i) {
  while (i > 0) {
    const int64_t parent = (i - 1) / 2;
    if (!Before(heap_[i], heap_[parent])) break;
    HeapSwap(i, parent);
    i = parent;
  }
}

void DeviceCache::SiftDown(int64_t i) {
  const int64_t size = static_cast<int64_t>(heap_.size());
  while (true) {
    int64_t least = i;
    const int64_t left = 2 * i + 1, right = left + 1;
    if (left < size && Before(heap_[left], heap_[least])) least = left;
    if (right < size && Before(heap_[right], heap_[least])) least = right;
    if (least == i) break;
    HeapSwap(i, least);
    i = least;
  }
}

void DeviceCache::HeapPush(int64_t slot) {
  heap_.push_back(static_cast<int32_t>(slot));  // capacity device_rows_: never reallocates
  heap_pos_[slot] = static_cast<int32_t>(heap_.size() - 1);
  SiftUp(heap_.size() - 1);
}

void DeviceCache::HeapRemove(int64_t slot) {
  const int64_t i = heap_pos_[slot];
  const int64_t last = static_cast<int64_t>(heap_.size()) - 1;
  if (i != last) HeapSwap(i, last);
  heap_.pop_back();
  heap_pos_[slot] = -1;
  if (i != last) {  // the former last element now sits at i
    const int32_t moved = heap_[i];
    SiftUp(i);
    SiftDown(heap_pos_[moved]);
  }
}

int64_t DeviceCache::HeapPop() {
  const int64_t slot = heap_[0];
  HeapRemove(slot);
  return slot;
}

// ---------------------------------------------------------------------------
// Recency list of occupied planned slots (LRU).

void DeviceCache::ListAppend(int64_t slot) {
  lru_prev_[slot] = lru_tail_;
  lru_next_[slot] = -1;
  if (lru_tail_ >= 0) {
    lru_next_[lru_tail_] = static_cast<int32_t>(slot);
  } else {
    lru_head_ = static_cast<int32_t>(slot);
  }
  lru_tail_ = static_cast<int32_t>(slot);
}

void DeviceCache::ListUnlink(int64_t slot) {
  const int32_t prev = lru_prev_[slot], next = lru_next_[slot];
  if (prev >= 0) {
    lru_next_[prev] = next;
  } else {
    lru_head_ = next;
  }
  if (next >= 0) {
    lru_prev_[next] = prev;
  } else {
    lru_tail_ = prev;
  }
  lru_prev_[slot] = lru_next_[slot] = -1;
}

void DeviceCache::SortPlanSlots() {
  const size_t size = lru_plan_.size();
  if (size < 64) {
    std::sort(lru_plan_.begin(), lru_plan_.end());
    return;
  }
  // LSD radix sort over the bits of device_rows_ - 1, in passes of at most 11
  // bits (two passes up to 4M slots, three beyond).
  int bits = 0;
  while (bits < 31 && (device_rows_ - 1) >> bits) ++bits;
  const int passes = (bits + 10) / 11;
  const int digit_bits = passes == 0 ? 0 : (bits + passes - 1) / passes;
  const uint32_t mask = (uint32_t{1} << digit_bits) - 1;
  uint32_t count[uint32_t{1} << 11];
  int32_t* in = lru_plan_.data();
  int32_t* out = lru_scratch_.data();
  for (int pass = 0; pass < passes; ++pass) {
    const int shift = pass * digit_bits;
    std::memset(count, 0, (mask + 1) * sizeof(uint32_t));
    for (size_t i = 0; i < size; ++i) ++count[(static_cast<uint32_t>(in[i]) >> shift) & mask];
    uint32_t offset = 0;
    for (uint32_t d = 0; d <= mask; ++d) {
      const uint32_t c = count[d];
      count[d] = offset;
      offset += c;
    }
    for (size_t i = 0; i < size; ++i) {
      out[count[(static_cast<uint32_t>(in[i]) >> shift) & mask]++] = in[i];
    }
    std::swap(in, out);
  }
  // Odd passes: the sorted slots are in the scratch buffer (of the same size).
  if (in != lru_plan_.data()) lru_plan_.swap(lru_scratch_);
}

// ---------------------------------------------------------------------------
// Pinning, free slots, records.

int64_t DeviceCache::PinnedLocked() const {
  int64_t pinned = 0;
  for (auto it = uses_.lower_bound(PinFloorLocked()); it != uses_.end(); ++it) {
    pinned += it->second;
  }
  return pinned;
}

bool DeviceCache::DropLostPlansLocked() {
  if (!pin_until_finish_) return false;
  const auto lost_before = std::chrono::steady_clock::now() -
                           std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                               std::chrono::duration<double>(2 * wait_seconds_));
  bool dropped = false;
  for (auto it = in_flight_.begin(); it != in_flight_.end();) {
    if (it->second < lost_before) {
      lost_.insert(it->first);
      it = in_flight_.erase(it);
      dropped = true;
    } else {
      ++it;
    }
  }
  return dropped;
}

void DeviceCache::CountUse(int64_t seq, int64_t delta) {
  auto it = uses_.find(seq);
  if (it == uses_.end()) {
    uses_.emplace(seq, delta);  // callers create the entry of a new seq beforehand
    return;
  }
  it->second += delta;
  if (it->second == 0) uses_.erase(it);
}

int64_t DeviceCache::FreeCountLocked() const {
  return device_rows_ - next_free_ + static_cast<int64_t>(free_slots_.size());
}

int64_t DeviceCache::TakeFreeSlot() {
  if (!free_slots_.empty()) {  // freed slots are all below next_free_
    std::pop_heap(free_slots_.begin(), free_slots_.end(), std::greater<int64_t>());
    const int64_t slot = free_slots_.back();
    free_slots_.pop_back();
    return slot;
  }
  if (next_free_ < device_rows_) return next_free_++;
  return -1;
}

DeviceCache::Record* DeviceCache::RecordFor(int64_t seq) {
  if (pending_.empty() || pending_.back().seq != seq) pending_.push_back(Record{seq, {}});
  return &pending_.back();
}

void DeviceCache::ResetLocked() {
  for (int64_t s = 0; s < device_rows_; ++s) {
    if (planned_global_[s] >= 0) planned_slot_of_[planned_global_[s]] = -1;
    if (applied_global_[s] >= 0) applied_slot_of_[applied_global_[s]] = -1;
  }
  std::fill(planned_global_.begin(), planned_global_.end(), -1);
  std::fill(applied_global_.begin(), applied_global_.end(), -1);
  std::fill(last_used_.begin(), last_used_.end(), 0);
  std::fill(frequency_.begin(), frequency_.end(), 0);
  std::fill(applied_last_used_.begin(), applied_last_used_.end(), 0);
  std::fill(applied_frequency_.begin(), applied_frequency_.end(), 0);
  std::fill(heap_pos_.begin(), heap_pos_.end(), -1);
  heap_.clear();
  std::fill(lru_prev_.begin(), lru_prev_.end(), -1);
  std::fill(lru_next_.begin(), lru_next_.end(), -1);
  lru_head_ = lru_tail_ = -1;
  free_slots_.clear();
  next_free_ = 0;
  uses_.clear();
  pending_.clear();
  pending_drops_.clear();
  in_flight_.clear();
  lost_.clear();
}

Status DeviceCache::CoverGlobalLocked(int64_t max_global) {
  const size_t need = static_cast<size_t>(max_global) + 1;
  const size_t size = planned_slot_of_.size();
  if (need <= size) return Status::Ok();
  const size_t grown =
      std::min<size_t>(static_cast<size_t>(total_rows_), std::max(need, size + size / 4));
  try {
    // Both reserved before either grows: a failure changes nothing.
    planned_slot_of_.reserve(grown);
    applied_slot_of_.reserve(grown);
  } catch (const std::bad_alloc&) {
    std::ostringstream msg;
    msg << "table '" << name_ << "': cannot grow the device cache's row maps to " << grown
        << " global rows (" << 2 * grown * sizeof(int32_t) << " bytes of host memory)";
    return Status::ResourceExhausted(msg.str());
  }
  planned_slot_of_.resize(grown, -1);
  applied_slot_of_.resize(grown, -1);
  return Status::Ok();
}

int64_t DeviceCache::PlannedSlotLocked(int64_t global) const {
  return global < static_cast<int64_t>(planned_slot_of_.size()) ? planned_slot_of_[global] : -1;
}

int64_t DeviceCache::AppliedSlotLocked(int64_t global) const {
  return global < static_cast<int64_t>(applied_slot_of_.size()) ? applied_slot_of_[global] : -1;
}

Status DeviceCache::OutOfRange(int64_t global, int64_t position, const char* what) const {
  std::ostringstream msg;
  msg << "table '" << name_ << "': global row " << global << " (position " << position
      << ") given to " << what << " is outside [-1, " << total_rows_
      << "), the rows of the table (device + host + ssd vocabulary)";
  return Status::InvalidArgument(msg.str());
}

// ---------------------------------------------------------------------------
// Plan.

Status DeviceCache::Plan(const int64_t* globals, int64_t n, int64_t* slots, int64_t* token,
                         const std::function<bool()>& cancelled, bool wait) {
  std::lock_guard<std::mutex> plan_lock(plan_mu_);
  std::unique_lock<std::mutex> lock(mu_);

  // The row maps cover the globals seen so far: grow them first (globals out
  // of range are reported below).
  int64_t max_global = -1;
  for (int64_t i = 0; i < n; ++i) {
    if (globals[i] < total_rows_) max_global = std::max(max_global, globals[i]);
  }
  Status covered = CoverGlobalLocked(max_global);
  if (!covered.ok()) return covered;

  // Classifies: slots[i] = the slot of a hit, kMissMark for a miss, -1 for -1.
  // Seen globals are marked in planned_slot_of_ to catch duplicates; `marked`
  // positions are restored on every path.
  int64_t marked = 0;
  auto restore = [&] {
    for (int64_t i = 0; i < marked; ++i) {
      if (globals[i] >= 0) {
        planned_slot_of_[globals[i]] = static_cast<int32_t>(slots[i] >= 0 ? slots[i] : -1);
      }
    }
  };
  int64_t hits = 0, misses = 0;
  for (; marked < n; ++marked) {
    const int64_t g = globals[marked];
    if (g == -1) {
      slots[marked] = -1;
      continue;
    }
    if (g < -1 || g >= total_rows_) {
      restore();
      return OutOfRange(g, marked, "the device cache plan");
    }
    const int32_t s = planned_slot_of_[g];
    if (s == kMissMark) {
      restore();
      std::ostringstream msg;
      msg << "table '" << name_ << "': global row " << g << " appears twice in one batch (again "
          << "at position " << marked << "); the device cache plans the distinct rows of a batch";
      return Status::InvalidArgument(msg.str());
    }
    slots[marked] = s >= 0 ? s : kMissMark;
    ++(s >= 0 ? hits : misses);
    planned_slot_of_[g] = static_cast<int32_t>(kMissMark);
  }
  restore();

  if (hits + misses > device_rows_) {
    std::ostringstream msg;
    msg << "table '" << name_ << "': a batch with " << hits + misses
        << " distinct ids does not fit the device cache (device_vocabulary_size=" << device_rows_
        << "); raise device_vocabulary_size or use smaller batches";
    return Status::InvalidArgument(msg.str());
  }

  // Room: free slots, else unpinned victims; wait for training to catch up.
  const int64_t free = FreeCountLocked();
  if (misses > free) {
    const auto deadline = std::chrono::steady_clock::now() +
                          std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                              std::chrono::duration<double>(wait ? wait_seconds_ : 0.0));
    while (true) {
      DropLostPlansLocked();
      const int64_t pinned = PinnedLocked();
      int64_t unpinned_hits = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (slots[i] >= 0 && last_used_[slots[i]] < PinFloorLocked()) ++unpinned_hits;
      }
      const int64_t evictable = OccupiedLocked() - pinned - unpinned_hits;
      if (misses <= free + evictable) break;
      const bool stop = cancelled && cancelled();
      if (stop || std::chrono::steady_clock::now() >= deadline) {
        for (int64_t i = 0; i < n; ++i) {
          if (slots[i] == kMissMark) slots[i] = -1;
        }
        if (stop) {
          return Status::Cancelled("table '" + name_ +
                                   "': planning the device cache was cancelled (the input "
                                   "pipeline stopped) while waiting for room");
        }
        std::ostringstream msg;
        msg << "table '" << name_ << "': the device cache (device_vocabulary_size=" << device_rows_
            << ") has no room for the " << misses << " new ids of this batch: " << pinned;
        if (pin_until_finish_) {
          msg << " rows are held by the " << in_flight_.size()
              << " training steps in flight (planned, optimizer update not finished); raise "
                 "device_vocabulary_size (of each shard) or run fewer workers";
        } else if (wait) {
          msg << " rows are held by batches in flight (planned, not trained yet); raise "
                 "device_vocabulary_size or lower the prefetch depth";
        } else {
          msg << " rows are held by earlier training lookups whose optimizer step has not run "
                 "yet. Each training lookup of a tiered table pins its rows until the optimizer "
                 "applies its gradients: run the optimizer step between training lookups, look "
                 "up with is_train=False for evaluation, or raise device_vocabulary_size";
        }
        return Status::ResourceExhausted(msg.str());
      }
      // Wake at least every 100 ms to poll `cancelled`.
      applied_cv_.wait_until(
          lock, std::min(deadline, std::chrono::steady_clock::now() + std::chrono::milliseconds(100)));
    }
  }

  // Allocations first, so that nothing throws once the state changes.
  const int64_t seq = planned_seq_ + 1;
  Record* record = RecordFor(seq);
  record->events.reserve(record->events.size() + hits + 2 * misses);
  // Every other entry counts a seq below this one, so CountUse(., -1) below
  // never erases this entry and the iterator stays valid.
  const auto seq_uses = uses_.emplace(seq, 0).first;
  const bool lru = policy_ == Policy::kLru;
  std::vector<int32_t> aside;  // LFU: pinned slots popped while looking for victims
  if (!lru && misses > free) aside.reserve(PinnedLocked() + hits + misses);
  if (lru) {
    lru_plan_.clear();
    lru_plan_.reserve(hits + misses);
    lru_scratch_.resize(hits + misses);  // the size of lru_plan_ once filled
  }

  for (int64_t i = 0; i < n; ++i) {  // hits
    const int64_t s = slots[i];
    if (s < 0) continue;
    CountUse(last_used_[s], -1);
    last_used_[s] = seq;
    ++frequency_[s];
    ++seq_uses->second;
    if (lru) {
      ListUnlink(s);  // linked again at the tail below
      lru_plan_.push_back(static_cast<int32_t>(s));
    } else {
      SiftDown(heap_pos_[s]);
    }
    record->events.push_back(Event{EventKind::kHit, s, -1});
  }
  for (int64_t i = 0; i < n; ++i) {  // misses
    if (slots[i] != kMissMark) continue;
    const int64_t g = globals[i];
    int64_t s = TakeFreeSlot();
    if (s < 0) {
      // Room was checked: an unpinned slot exists (not one of this plan's,
      // which are pinned). LRU: the list is sorted by last_used, so the head
      // is unpinned. LFU: pinned slots may come first; set them aside.
      if (lru) {
        s = lru_head_;
        assert(s >= 0 && last_used_[s] < PinFloorLocked());
        ListUnlink(s);
      } else {
        while (last_used_[heap_[0]] >= PinFloorLocked()) aside.push_back(HeapPop());
        s = HeapPop();
      }
      const int64_t victim = planned_global_[s];
      record->events.push_back(Event{EventKind::kSwapOut, s, victim});
      planned_slot_of_[victim] = -1;
      CountUse(last_used_[s], -1);
    }
    planned_global_[s] = g;
    planned_slot_of_[g] = static_cast<int32_t>(s);
    last_used_[s] = seq;
    frequency_[s] = 1;
    ++seq_uses->second;
    if (lru) {
      lru_plan_.push_back(static_cast<int32_t>(s));
    } else {
      HeapPush(s);
    }
    record->events.push_back(Event{EventKind::kSwapIn, s, g});
    slots[i] = s;
  }
  if (lru) {
    // This plan's slots share the highest last_used: they go to the tail, in
    // ascending slot order, the tie order of (last_used, slot).
    SortPlanSlots();
    for (const int32_t s : lru_plan_) ListAppend(s);
  }
  for (const int32_t s : aside) HeapPush(s);
  if (seq_uses->second == 0) uses_.erase(seq_uses);

  planned_seq_ = seq;
  if (pin_until_finish_) in_flight_.emplace(seq, std::chrono::steady_clock::now());
  hits_ += hits;
  misses_ += misses;
  *token = (generation_ << kSeqBits) | seq;
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Apply.

Status DeviceCache::Apply(int64_t token, Moves* moves) {
  *moves = Moves();
  std::unique_lock<std::mutex> lock(mu_);
  const int64_t generation = token >> kSeqBits;
  const int64_t seq = token & kSeqMask;
  if (token < 0 || generation != generation_) {
    return Status::FailedPrecondition(
        "table '" + name_ +
        "': this batch was planned before the table was restored or re-created; make a new "
        "dataset iterator after restoring");
  }
  if (seq <= applied_seq_) return Status::Ok();  // several lookups of one batch apply once
  if (seq > planned_seq_) {
    std::ostringstream msg;
    msg << "table '" << name_ << "': device cache token " << token << " names plan " << seq
        << ", but only " << planned_seq_ << " plans were made";
    return Status::InvalidArgument(msg.str());
  }

  // Composition: per touched global, its applied slot and its final place.
  struct Touch {
    int64_t global;
    int64_t applied;  // slot, or -1
    int64_t place;    // slot, kInStore or kDroppedPlace
    bool dropped;
  };
  std::vector<Touch> touched;
  std::unordered_map<int64_t, size_t> index;
  size_t records = 0;
  for (; records < pending_.size() && pending_[records].seq <= seq; ++records) {
    for (const Event& event : pending_[records].events) {
      if (event.kind == EventKind::kHit) continue;
      auto [it, inserted] = index.emplace(event.global, touched.size());
      if (inserted) {
        const int64_t a = AppliedSlotLocked(event.global);
        touched.push_back(Touch{event.global, a, a >= 0 ? a : kInStore, false});
      }
      Touch& touch = touched[it->second];
      switch (event.kind) {
        case EventKind::kSwapOut:
          touch.place = kInStore;
          break;
        case EventKind::kSwapIn:
          touch.place = event.slot;
          break;
        case EventKind::kDrop:
          touch.dropped = true;
          touch.place = kDroppedPlace;
          break;
        case EventKind::kHit:
          break;
      }
    }
  }
  for (const Touch& t : touched) {
    if (t.dropped) {
      moves->erase_globals.push_back(t.global);
      if (t.place >= 0) {
        moves->swap_in_slots.push_back(t.place);
        moves->swap_in_globals.push_back(t.global);
        moves->swap_in_sources.push_back(-1);
      }
    } else if (t.applied >= 0) {
      if (t.place == t.applied) continue;
      if (t.place >= 0) {
        moves->swap_in_slots.push_back(t.place);
        moves->swap_in_globals.push_back(t.global);
        moves->swap_in_sources.push_back(t.applied);
      } else {
        moves->swap_out_slots.push_back(t.applied);
        moves->swap_out_globals.push_back(t.global);
      }
    } else if (t.place >= 0) {
      moves->swap_in_slots.push_back(t.place);
      moves->swap_in_globals.push_back(t.global);
      moves->swap_in_sources.push_back(-1);
    }
  }

  // The applied mapping becomes the composed state (nothing allocates here).
  for (const Touch& t : touched) {
    if (t.applied >= 0 && applied_global_[t.applied] == t.global) applied_global_[t.applied] = -1;
    // A dropped global may lie past the maps (released, never planned).
    if (t.global < static_cast<int64_t>(applied_slot_of_.size())) applied_slot_of_[t.global] = -1;
  }
  for (const Touch& t : touched) {
    if (t.place < 0) continue;
    applied_slot_of_[t.global] = static_cast<int32_t>(t.place);
    applied_global_[t.place] = t.global;
  }
  for (size_t r = 0; r < records; ++r) {
    const Record& record = pending_[r];
    for (const Event& event : record.events) {
      if (event.kind == EventKind::kHit) {
        applied_last_used_[event.slot] = record.seq;
        ++applied_frequency_[event.slot];
      } else if (event.kind == EventKind::kSwapIn) {
        applied_last_used_[event.slot] = record.seq;
        applied_frequency_[event.slot] = 1;
      } else if (event.kind == EventKind::kDrop) {
        auto it = pending_drops_.find(event.global);
        if (it != pending_drops_.end() && --it->second <= 0) pending_drops_.erase(it);
      }
    }
  }
  pending_.erase(pending_.begin(), pending_.begin() + records);
  swap_outs_ += static_cast<int64_t>(moves->swap_out_slots.size());
  swap_ins_ += static_cast<int64_t>(moves->swap_in_slots.size());
  applied_seq_ = seq;
  lock.unlock();
  applied_cv_.notify_all();
  return Status::Ok();
}

Status DeviceCache::Finish(int64_t token) {
  bool was_lost = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (token < 0 || (token >> kSeqBits) != generation_) return Status::Ok();
    finished_seq_ = std::max(finished_seq_, std::min(token & kSeqMask, applied_seq_));
    in_flight_.erase(token & kSeqMask);
    was_lost = lost_.erase(token & kSeqMask) > 0;
  }
  applied_cv_.notify_all();
  if (was_lost) {
    std::ostringstream msg;
    msg << "table '" << name_ << "': this training step's device-cache plan was unfinished for more "
        << "than 2 x wait_seconds = " << 2 * wait_seconds_ << " s and was taken as lost (its "
        << "worker presumed dead), so its rows may have gone to other keys while the step read "
        << "and updated them; restart the job from its last checkpoint (and give each shard's "
        << "device cache more rows, or run fewer workers)";
    return Status::FailedPrecondition(msg.str());
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------
// Release, Locate.

Status DeviceCache::Release(const int64_t* globals, int64_t n) {
  std::lock_guard<std::mutex> plan_lock(plan_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  int64_t cached = 0, dropped = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = globals[i];
    if (g == -1) continue;
    if (g < -1 || g >= total_rows_) return OutOfRange(g, i, "the device cache release");
    ++dropped;
    if (PlannedSlotLocked(g) >= 0) ++cached;
  }
  if (dropped == 0) return Status::Ok();
  // Allocations first (a failure leaves zero-count drops, which mean nothing).
  Record* record = RecordFor(planned_seq_ + 1);
  record->events.reserve(record->events.size() + dropped);
  free_slots_.reserve(free_slots_.size() + cached);
  for (int64_t i = 0; i < n; ++i) {
    if (globals[i] >= 0) pending_drops_.emplace(globals[i], 0);
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = globals[i];
    if (g < 0) continue;
    ++pending_drops_[g];
    const int64_t s = PlannedSlotLocked(g);
    if (s >= 0) {
      if (policy_ == Policy::kLru) {
        ListUnlink(s);
      } else {
        HeapRemove(s);
      }
      CountUse(last_used_[s], -1);
      planned_global_[s] = -1;
      planned_slot_of_[g] = -1;
      free_slots_.push_back(s);
      std::push_heap(free_slots_.begin(), free_slots_.end(), std::greater<int64_t>());
    }
    record->events.push_back(Event{EventKind::kDrop, -1, g});
  }
  return Status::Ok();
}

void DeviceCache::Locate(const int64_t* globals, int64_t n, int64_t* slots) const {
  std::lock_guard<std::mutex> lock(mu_);
  const bool drops = !pending_drops_.empty();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = globals[i];
    if (g < 0 || g >= total_rows_) {
      slots[i] = -1;
      continue;
    }
    if (drops) {
      auto it = pending_drops_.find(g);
      if (it != pending_drops_.end() && it->second > 0) {
        slots[i] = -2;
        continue;
      }
    }
    slots[i] = AppliedSlotLocked(g);
  }
}

// ---------------------------------------------------------------------------
// Checkpoints.

void DeviceCache::ExportState(State* state) const {
  std::lock_guard<std::mutex> lock(mu_);
  *state = State();
  for (int64_t s = 0; s < device_rows_; ++s) {
    const int64_t g = applied_global_[s];
    if (g < 0) continue;
    auto it = pending_drops_.find(g);
    if (it != pending_drops_.end() && it->second > 0) continue;
    state->slots.push_back(s);
    state->globals.push_back(g);
    state->last_used.push_back(applied_last_used_[s]);
    state->frequency.push_back(applied_frequency_[s]);
  }
  for (const auto& [g, count] : pending_drops_) {
    if (count > 0) state->dropped.push_back(g);
  }
  std::sort(state->dropped.begin(), state->dropped.end());
  state->counters = {applied_seq_, hits_, misses_, swap_outs_, swap_ins_};
}

Status DeviceCache::ImportState(const State& state) {
  auto invalid = [&](const std::string& what) {
    return Status::InvalidArgument("table '" + name_ + "': invalid device cache state: " + what);
  };
  const size_t n = state.slots.size();
  if (state.globals.size() != n || state.last_used.size() != n || state.frequency.size() != n) {
    return invalid("slots, globals, last_used and frequency must have one length, got " +
                   std::to_string(n) + ", " + std::to_string(state.globals.size()) + ", " +
                   std::to_string(state.last_used.size()) + ", " +
                   std::to_string(state.frequency.size()));
  }
  if (state.counters.size() != 5) {
    return invalid("5 counters expected, got " + std::to_string(state.counters.size()));
  }
  for (int64_t c : state.counters) {
    if (c < 0 || c > kSeqMask) return invalid("counter " + std::to_string(c) + " out of range");
  }
  int64_t seq = state.counters[0];
  for (size_t i = 0; i < n; ++i) {
    if (state.slots[i] < 0 || state.slots[i] >= device_rows_) {
      return invalid("slot " + std::to_string(state.slots[i]) + " is outside [0, " +
                     std::to_string(device_rows_) + ")");
    }
    if (state.globals[i] < 0 || state.globals[i] >= total_rows_) {
      return invalid("global row " + std::to_string(state.globals[i]) + " is outside [0, " +
                     std::to_string(total_rows_) + ")");
    }
    if (state.frequency[i] < 1) {
      return invalid("frequency " + std::to_string(state.frequency[i]) + " is below 1");
    }
    if (state.last_used[i] < 0 || state.last_used[i] > kSeqMask) {
      return invalid("last_used " + std::to_string(state.last_used[i]) + " is out of range");
    }
    seq = std::max(seq, state.last_used[i]);
  }
  std::vector<int64_t> sorted_slots(state.slots), sorted_globals(state.globals);
  std::sort(sorted_slots.begin(), sorted_slots.end());
  std::sort(sorted_globals.begin(), sorted_globals.end());
  auto dup = std::adjacent_find(sorted_slots.begin(), sorted_slots.end());
  if (dup != sorted_slots.end()) return invalid("slot " + std::to_string(*dup) + " repeats");
  dup = std::adjacent_find(sorted_globals.begin(), sorted_globals.end());
  if (dup != sorted_globals.end()) {
    return invalid("global row " + std::to_string(*dup) + " repeats");
  }
  for (int64_t g : state.dropped) {
    if (g < 0 || g >= total_rows_) {
      return invalid("dropped global row " + std::to_string(g) + " is outside [0, " +
                     std::to_string(total_rows_) + ")");
    }
    if (std::binary_search(sorted_globals.begin(), sorted_globals.end(), g)) {
      return invalid("global row " + std::to_string(g) + " is both cached and dropped");
    }
  }

  // Everything that allocates is built before the state changes.
  std::map<int64_t, int64_t> uses;
  for (int64_t lu : state.last_used) ++uses[lu];
  const int64_t next_free = n == 0 ? 0 : sorted_slots.back() + 1;
  std::vector<int64_t> free_slots;
  for (int64_t s = 0, j = 0; s < next_free; ++s) {
    if (sorted_slots[j] == s) {
      ++j;
    } else {
      free_slots.push_back(s);
    }
  }
  std::make_heap(free_slots.begin(), free_slots.end(), std::greater<int64_t>());
  // LRU: the recency list in (last_used, slot) order.
  std::vector<int32_t> lru_order;
  if (policy_ == Policy::kLru) {
    std::vector<std::pair<int64_t, int32_t>> keyed(n);
    for (size_t i = 0; i < n; ++i) {
      keyed[i] = {state.last_used[i], static_cast<int32_t>(state.slots[i])};
    }
    std::sort(keyed.begin(), keyed.end());
    lru_order.reserve(n);
    for (const auto& key : keyed) lru_order.push_back(key.second);
  }
  std::deque<Record> pending;
  std::unordered_map<int64_t, int64_t> pending_drops;
  if (!state.dropped.empty()) {
    pending.push_back(Record{seq + 1, {}});
    for (int64_t g : state.dropped) {
      pending.back().events.push_back(Event{EventKind::kDrop, -1, g});
      ++pending_drops[g];
    }
  }

  std::lock_guard<std::mutex> plan_lock(plan_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  Status covered = CoverGlobalLocked(n == 0 ? -1 : sorted_globals.back());
  if (!covered.ok()) return covered;
  ResetLocked();
  for (size_t i = 0; i < n; ++i) {
    const int64_t s = state.slots[i], g = state.globals[i];
    planned_global_[s] = applied_global_[s] = g;
    planned_slot_of_[g] = applied_slot_of_[g] = static_cast<int32_t>(s);
    last_used_[s] = applied_last_used_[s] = state.last_used[i];
    frequency_[s] = applied_frequency_[s] = state.frequency[i];
    if (policy_ == Policy::kLfu) HeapPush(s);
  }
  for (const int32_t s : lru_order) ListAppend(s);  // empty for LFU
  uses_.swap(uses);
  free_slots_.swap(free_slots);
  next_free_ = next_free;
  pending_.swap(pending);
  pending_drops_.swap(pending_drops);
  planned_seq_ = applied_seq_ = finished_seq_ = seq;
  hits_ = state.counters[1];
  misses_ = state.counters[2];
  swap_outs_ = state.counters[3];
  swap_ins_ = state.counters[4];
  ++generation_;
  return Status::Ok();
}

void DeviceCache::Clear() {
  std::lock_guard<std::mutex> plan_lock(plan_mu_);
  std::lock_guard<std::mutex> lock(mu_);
  ResetLocked();
  std::vector<int32_t>().swap(planned_slot_of_);
  std::vector<int32_t>().swap(applied_slot_of_);
  planned_seq_ = applied_seq_ = finished_seq_ = 0;
  hits_ = misses_ = swap_outs_ = swap_ins_ = 0;
  ++generation_;
}

// ---------------------------------------------------------------------------
// Introspection.

DeviceCache::Stats DeviceCache::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats stats;
  stats.device_rows = device_rows_;
  stats.occupied = OccupiedLocked();
  stats.hits = hits_;
  stats.misses = misses_;
  stats.swap_outs = swap_outs_;
  stats.swap_ins = swap_ins_;
  stats.pending_plans = planned_seq_ - applied_seq_;
  stats.in_flight = static_cast<int64_t>(in_flight_.size());
  return stats;
}

int64_t DeviceCache::MemoryBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t bytes = static_cast<int64_t>((planned_slot_of_.capacity() + applied_slot_of_.capacity()) *
                                       sizeof(int32_t));
  // Per slot: planned/applied global, last_used, frequency (8 x int64 in all),
  // and either the LFU heap and heap position or the LRU prev and next links
  // (2 x int32).
  bytes += device_rows_ * 8 * static_cast<int64_t>(sizeof(int64_t));
  bytes += static_cast<int64_t>((heap_.capacity() + heap_pos_.capacity() + lru_prev_.capacity() +
                                 lru_next_.capacity() + lru_plan_.capacity() +
                                 lru_scratch_.capacity()) *
                                sizeof(int32_t));
  bytes += static_cast<int64_t>(free_slots_.capacity() * sizeof(int64_t));
  for (const Record& record : pending_) {
    bytes += static_cast<int64_t>(sizeof(Record) + record.events.capacity() * sizeof(Event));
  }
  return bytes;
}

}  // namespace mxrec

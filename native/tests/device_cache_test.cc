// GoogleTest unit tests of the TF-free device cache of tiered tables. Run under
// ASan/UBSan by `make native-test`. Small cases are checked by hand; a
// randomized test replays the Moves contract on a simulated device array and
// host store and checks every row is where the plans say.
#include "../core/device_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <condition_variable>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

namespace mxrec {
namespace {

using Policy = DeviceCache::Policy;
using Moves = DeviceCache::Moves;

struct Planned {
  std::vector<int64_t> slots;
  int64_t token = 0;
};

Planned PlanOk(DeviceCache& cache, const std::vector<int64_t>& globals) {
  Planned p;
  p.slots.assign(globals.size(), -9);
  const Status status = cache.Plan(globals.data(), globals.size(), p.slots.data(), &p.token);
  EXPECT_TRUE(status.ok()) << status.message();
  return p;
}

Moves ApplyOk(DeviceCache& cache, int64_t token) {
  Moves moves;
  const Status status = cache.Apply(token, &moves);
  EXPECT_TRUE(status.ok()) << status.message();
  return moves;
}

std::vector<int64_t> Locate(const DeviceCache& cache, const std::vector<int64_t>& globals) {
  std::vector<int64_t> slots(globals.size(), -9);
  cache.Locate(globals.data(), globals.size(), slots.data());
  return slots;
}

bool Empty(const Moves& m) {
  return m.swap_out_slots.empty() && m.swap_out_globals.empty() && m.swap_in_slots.empty() &&
         m.swap_in_globals.empty() && m.swap_in_sources.empty() && m.erase_globals.empty();
}

using V = std::vector<int64_t>;

TEST(DeviceCacheTest, HitsMissesAndLowestFreeSlotsFirst) {
  DeviceCache cache(4, 100, Policy::kLru, "t", 0.0);
  Planned p1 = PlanOk(cache, {40, -1, 7, -1});
  EXPECT_EQ(p1.slots, (V{0, -1, 1, -1}));
  EXPECT_EQ(p1.token, (int64_t{1} << DeviceCache::kSeqBits) | 1);
  Moves m1 = ApplyOk(cache, p1.token);
  EXPECT_EQ(m1.swap_in_slots, (V{0, 1}));
  EXPECT_EQ(m1.swap_in_globals, (V{40, 7}));
  EXPECT_EQ(m1.swap_in_sources, (V{-1, -1}));
  EXPECT_TRUE(m1.swap_out_slots.empty());
  EXPECT_TRUE(m1.erase_globals.empty());

  Planned p2 = PlanOk(cache, {7, 3, 40});
  EXPECT_EQ(p2.slots, (V{1, 2, 0}));
  Moves m2 = ApplyOk(cache, p2.token);
  EXPECT_EQ(m2.swap_in_slots, (V{2}));
  EXPECT_EQ(m2.swap_in_globals, (V{3}));
  // Applying a token twice (several lookups of one batch) moves nothing.
  EXPECT_TRUE(Empty(ApplyOk(cache, p2.token)));
  EXPECT_TRUE(Empty(ApplyOk(cache, p1.token)));

  const DeviceCache::Stats s = cache.stats();
  EXPECT_EQ(s.device_rows, 4);
  EXPECT_EQ(s.occupied, 3);
  EXPECT_EQ(s.hits, 2);
  EXPECT_EQ(s.misses, 3);
  EXPECT_EQ(s.swap_ins, 3);
  EXPECT_EQ(s.swap_outs, 0);
  EXPECT_EQ(s.pending_plans, 0);
  EXPECT_GT(cache.MemoryBytes(), 0);
  EXPECT_EQ(Locate(cache, {40, 7, 3, 5, -1}), (V{0, 1, 2, -1, -1}));
}

// The slot-of-global maps are sized by the globals used, not by total_rows
// (issue #16): 10^8 rows of a table cost nothing until planned.
TEST(DeviceCacheTest, RowMapsGrowWithTheGlobalsUsed) {
  constexpr int64_t kTotal = 100000000;
  DeviceCache cache(4, kTotal, Policy::kLru, "t", 0.0);
  const int64_t empty = cache.MemoryBytes();
  EXPECT_LT(empty, 4096);
  // Globals past the maps: not cached, releasable, nothing planned.
  EXPECT_EQ(Locate(cache, {5, kTotal - 1}), (V{-1, -1}));
  const V far = {kTotal - 2};
  ASSERT_TRUE(cache.Release(far.data(), 1).ok());
  Planned p1 = PlanOk(cache, {3, 1});
  EXPECT_EQ(p1.slots, (V{0, 1}));
  ApplyOk(cache, p1.token);
  EXPECT_LT(cache.MemoryBytes(), empty + 4096);
  EXPECT_EQ(Locate(cache, {1, 3, 1000}), (V{1, 0, -1}));
  Planned p2 = PlanOk(cache, {1000000, 3});
  EXPECT_EQ(p2.slots, (V{2, 0}));
  ApplyOk(cache, p2.token);
  // 2 maps x 4 B x (10^6 + 1) globals, and no more.
  EXPECT_GE(cache.MemoryBytes(), empty + 8 * 1000001);
  EXPECT_LT(cache.MemoryBytes(), empty + 8 * 1000001 + 4096);
  EXPECT_EQ(Locate(cache, {1000000, 3, 1}), (V{2, 0, 1}));
  DeviceCache::State state;
  cache.ExportState(&state);
  cache.Clear();
  EXPECT_LT(cache.MemoryBytes(), empty + 4096);  // The LRU sort buffers stay.
  ASSERT_TRUE(cache.ImportState(state).ok());
  EXPECT_EQ(Locate(cache, {1000000, 3, 1, 7}), (V{2, 0, 1, -1}));
}

// Plans and applies each batch in turn; returns the last batch's plan.
Planned PlanAndApplyEach(DeviceCache& cache, const std::vector<V>& batches) {
  Planned last;
  for (const V& batch : batches) {
    last = PlanOk(cache, batch);
    ApplyOk(cache, last.token);
  }
  return last;
}

TEST(DeviceCacheTest, LruEvictsLeastRecentlyUsedUnpinnedSlot) {
  DeviceCache cache(3, 10, Policy::kLru, "t", 0.0);
  // slot 0 (g0): last used 3, slot 2 (g2): 4, slot 1 (g1): 5 = applied (pinned).
  PlanAndApplyEach(cache, {{0, 1, 2}, {0}, {0}, {2}, {1}});
  Planned p = PlanOk(cache, {3});
  EXPECT_EQ(p.slots, (V{0}));
  Moves m = ApplyOk(cache, p.token);
  EXPECT_EQ(m.swap_out_slots, (V{0}));
  EXPECT_EQ(m.swap_out_globals, (V{0}));
  EXPECT_EQ(m.swap_in_slots, (V{0}));
  EXPECT_EQ(m.swap_in_globals, (V{3}));
  EXPECT_EQ(m.swap_in_sources, (V{-1}));
  EXPECT_EQ(cache.stats().swap_outs, 1);
}

TEST(DeviceCacheTest, LruTiesGoToTheLowerSlotNotTheTouchOrder) {
  DeviceCache cache(4, 100, Policy::kLru, "t", 0.0);
  Planned p1 = PlanOk(cache, {10, 11, 12, 13});  // slots 0..3, last used 1
  ApplyOk(cache, p1.token);
  Planned p2 = PlanOk(cache, {13, 11});  // slots 3 then 1 touched: last used 2
  ApplyOk(cache, p2.token);
  cache.Finish(p2.token);  // nothing pinned
  // Order (last_used, slot): slot 0 (1), slot 2 (1), slot 1 (2), slot 3 (2).
  Planned p3 = PlanOk(cache, {20, 21, 22, 23});
  EXPECT_EQ(p3.slots, (V{0, 2, 1, 3}));
  Moves m3 = ApplyOk(cache, p3.token);
  EXPECT_EQ(m3.swap_out_globals, (V{10, 12, 11, 13}));
  cache.Finish(p3.token);
  // Plan 3 filled its slots in the order 0, 2, 1, 3; all now last used 3.
  Planned p4 = PlanOk(cache, {22, 30, 31});  // hit on slot 1
  EXPECT_EQ(p4.slots, (V{1, 0, 2}));
}

TEST(DeviceCacheTest, LruImportOrdersByLastUseThenSlot) {
  DeviceCache cache(5, 100, Policy::kLru, "t", 0.0);
  DeviceCache::State state;
  state.slots = {3, 0, 1, 2};
  state.globals = {30, 0, 10, 20};
  state.last_used = {7, 5, 2, 2};
  state.frequency = {1, 1, 1, 1};
  state.counters = {7, 0, 0, 0, 0};
  ASSERT_TRUE(cache.ImportState(state).ok());
  // Free slot 4 first, then (2, 1), (2, 2), (5, 0), (7, 3); nothing is pinned.
  Planned p = PlanOk(cache, {40, 41, 42, 43});
  EXPECT_EQ(p.slots, (V{4, 1, 2, 0}));
  Moves m = ApplyOk(cache, p.token);
  EXPECT_EQ(m.swap_out_globals, (V{10, 20, 0}));
  // Releasing the head of the list (slot 3) leaves it free for the next miss.
  ASSERT_TRUE(cache.Release(V{30}.data(), 1).ok());
  cache.Finish(p.token);
  Planned q = PlanOk(cache, {50, 51});
  EXPECT_EQ(q.slots, (V{3, 0}));  // the free slot, then (8, 0)
  EXPECT_EQ(cache.stats().occupied, 5);
}

TEST(DeviceCacheTest, LfuEvictsLeastFrequentlyUsedUnpinnedSlot) {
  DeviceCache cache(3, 10, Policy::kLfu, "t", 0.0);
  // slot 0 (g0): 3 uses, slot 2 (g2): 2 uses, slot 1 (g1): 2 uses but pinned.
  PlanAndApplyEach(cache, {{0, 1, 2}, {0}, {0}, {2}, {1}});
  Planned p = PlanOk(cache, {3});
  EXPECT_EQ(p.slots, (V{2}));
  Moves m = ApplyOk(cache, p.token);
  EXPECT_EQ(m.swap_out_slots, (V{2}));
  EXPECT_EQ(m.swap_out_globals, (V{2}));
}

TEST(DeviceCacheTest, LfuTiesGoToLeastRecentlyUsedThenLowerSlot) {
  DeviceCache cache(4, 10, Policy::kLfu, "t", 0.0);
  PlanAndApplyEach(cache, {{0, 1, 2, 3}, {}});  // all used once, in plan 1
  Planned p3 = PlanOk(cache, {5});
  EXPECT_EQ(p3.slots, (V{0}));  // full tie: the lowest slot
  ApplyOk(cache, p3.token);
  Planned p4 = PlanOk(cache, {6, 7});  // slot 0 is pinned (plan 3 being trained)
  EXPECT_EQ(p4.slots, (V{1, 2}));
  ApplyOk(cache, p4.token);
  // Slot 0 (g5): 1 use, last used 3; slot 3 (g3): 1 use, last used 1.
  Planned p5 = PlanOk(cache, {8});
  EXPECT_EQ(p5.slots, (V{3}));
}

TEST(DeviceCacheTest, LfuSkipsPinnedLowFrequencySlots) {
  DeviceCache cache(3, 10, Policy::kLfu, "t", 0.0);
  PlanAndApplyEach(cache, {{0, 1}, {0, 1}, {0, 1}});  // slots 0, 1: freq 3
  Planned in_flight = PlanOk(cache, {2});             // slot 2: freq 1, not trained
  EXPECT_EQ(in_flight.slots, (V{2}));
  ApplyOk(cache, in_flight.token);  // being trained: pinned
  Planned p = PlanOk(cache, {3});
  EXPECT_EQ(p.slots, (V{0}));  // slot 2 has the lowest frequency but is pinned
}

TEST(DeviceCacheTest, PinnedSlotsOfBatchesInFlightAreNeverVictims) {
  DeviceCache cache(4, 100, Policy::kLru, "tiered_t", 0.05);
  // Three batches planned ahead, none trained: every slot is held.
  Planned p1 = PlanOk(cache, {10, 11});
  Planned p2 = PlanOk(cache, {12});
  Planned p3 = PlanOk(cache, {13});
  EXPECT_EQ(p3.slots, (V{3}));
  EXPECT_EQ(cache.stats().pending_plans, 3);
  ApplyOk(cache, p1.token);  // batch 1 being trained: its slots are still held

  V slots(1, -9);
  int64_t token = -9;
  const V batch = {14};
  const auto start = std::chrono::steady_clock::now();
  Status status = cache.Plan(batch.data(), 1, slots.data(), &token);
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  ASSERT_EQ(status.code(), Status::Code::kResourceExhausted);
  EXPECT_GE(waited, 0.04);
  EXPECT_EQ(status.message(),
            "table 'tiered_t': the device cache (device_vocabulary_size=4) has no room for the 1 "
            "new ids of this batch: 4 rows are held by batches in flight (planned, not trained "
            "yet); raise device_vocabulary_size or lower the prefetch depth");
  EXPECT_EQ(token, -9);
  EXPECT_EQ(cache.stats().misses, 4);

  // Batch 1 trained (batch 2 being trained): slots 0 and 1 become evictable.
  ApplyOk(cache, p2.token);
  Planned p4 = PlanOk(cache, {14, 13});
  EXPECT_EQ(p4.slots, (V{0, 3}));
  EXPECT_EQ(p4.token & ((int64_t{1} << DeviceCache::kSeqBits) - 1), 4);
  Moves m3 = ApplyOk(cache, p3.token);
  EXPECT_EQ(m3.swap_in_globals, (V{13}));
  EXPECT_TRUE(m3.swap_out_slots.empty());
  Moves m4 = ApplyOk(cache, p4.token);
  EXPECT_EQ(m4.swap_out_slots, (V{0}));
  EXPECT_EQ(m4.swap_out_globals, (V{10}));
  EXPECT_EQ(m4.swap_in_slots, (V{0}));
  EXPECT_EQ(m4.swap_in_globals, (V{14}));
}

TEST(DeviceCacheTest, FinishUnpinsTheTrainedBatch) {
  DeviceCache cache(2, 100, Policy::kLru, "t", 0.0);
  Planned p1 = PlanOk(cache, {10, 11});
  ApplyOk(cache, p1.token);
  // Without Finish the applied batch is still being trained: no room.
  V slots(1, -9);
  int64_t token = -9;
  const V batch = {12};
  EXPECT_EQ(cache.Plan(batch.data(), 1, slots.data(), &token).code(),
            Status::Code::kResourceExhausted);
  cache.Finish(p1.token + 5);  // seqs past the applied one count as the applied one
  Planned p2 = PlanOk(cache, {12});
  EXPECT_EQ(p2.slots, (V{0}));
  Moves m = ApplyOk(cache, p2.token);
  EXPECT_EQ(m.swap_out_globals, (V{10}));
  // Finish of another generation is ignored; the batch of p2 stays pinned.
  cache.Finish(p2.token ^ (int64_t{1} << DeviceCache::kSeqBits));
  EXPECT_EQ(cache.Plan(V{13, 14}.data(), 2, V(2).data(), &token).code(),
            Status::Code::kResourceExhausted);
}

TEST(DeviceCacheTest, CancelledWaitStopsPromptly) {
  DeviceCache cache(1, 100, Policy::kLru, "t", 30.0);
  PlanOk(cache, {10});  // planned, never trained: the only slot stays pinned
  V slots(1, -9);
  int64_t token = -9;
  const V batch = {11};
  const auto start = std::chrono::steady_clock::now();
  Status status = cache.Plan(batch.data(), 1, slots.data(), &token, [start] {
    return std::chrono::steady_clock::now() - start > std::chrono::milliseconds(50);
  });
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(status.code(), Status::Code::kCancelled);
  EXPECT_NE(status.message().find("table 't'"), std::string::npos);
  EXPECT_LT(waited, 5.0);  // not the 30 s of wait_seconds
  EXPECT_EQ(token, -9);
}

TEST(DeviceCacheTest, PlanWithoutWaitFailsAtOnceNamingUnfinishedLookups) {
  // The training thread plans itself (eager lookups): a wait of 30 s could
  // only end in failure, since no other thread applies or finishes a batch.
  DeviceCache cache(2, 10, Policy::kLru, "t", 30.0);
  Planned p1 = PlanOk(cache, {0, 1});
  ApplyOk(cache, p1.token);  // Looked up, its optimizer step not run (no Finish).
  const V batch = {2};
  V slots(1, -9);
  int64_t token = -9;
  const auto start = std::chrono::steady_clock::now();
  const Status status = cache.Plan(batch.data(), 1, slots.data(), &token, nullptr,
                                   /*wait=*/false);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
  ASSERT_EQ(status.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(status.message(),
            "table 't': the device cache (device_vocabulary_size=2) has no room for the 1 new ids "
            "of this batch: 2 rows are held by earlier training lookups whose optimizer step has "
            "not run yet. Each training lookup of a tiered table pins its rows until the "
            "optimizer applies its gradients: run the optimizer step between training lookups, "
            "look up with is_train=False for evaluation, or raise device_vocabulary_size");
  EXPECT_EQ(token, -9);
  EXPECT_EQ(slots, (V{-1}));
  // Once that step finished, the same plan proceeds without waiting.
  cache.Finish(p1.token);
  ASSERT_TRUE(cache.Plan(batch.data(), 1, slots.data(), &token, nullptr, false).ok());
  EXPECT_EQ(slots, (V{0}));
}

TEST(DeviceCacheTest, PlanSucceedsWhenAnotherThreadAppliesDuringTheWait) {
  DeviceCache cache(2, 10, Policy::kLru, "t", 30.0);
  Planned p1 = PlanOk(cache, {0, 1});
  Planned p2 = PlanOk(cache, {0});
  ApplyOk(cache, p1.token);
  // Slot 1 (g1) is held by batch 1 until batch 2 is applied.
  std::thread trainer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    Moves m;
    EXPECT_TRUE(cache.Apply(p2.token, &m).ok());
    // Locate and stats run while the plan waits.
    EXPECT_EQ(cache.stats().occupied, 2);
  });
  const auto start = std::chrono::steady_clock::now();
  Planned p3 = PlanOk(cache, {2});
  const double waited =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  trainer.join();
  EXPECT_EQ(p3.slots, (V{1}));
  EXPECT_GE(waited, 0.04);
  EXPECT_LT(waited, 20.0);
}

TEST(DeviceCacheTest, TooManyDistinctGlobalsFailsAtOnce) {
  DeviceCache cache(2, 10, Policy::kLru, "big", 10.0);
  const V batch = {1, 2, 3, -1, -1};
  V slots(batch.size());
  int64_t token;
  const auto start = std::chrono::steady_clock::now();
  const Status status = cache.Plan(batch.data(), batch.size(), slots.data(), &token);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 1.0);
  ASSERT_EQ(status.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(status.message().find("table 'big'"), std::string::npos);
  EXPECT_NE(status.message().find("3 distinct ids"), std::string::npos);
  EXPECT_NE(status.message().find("device_vocabulary_size=2"), std::string::npos);
}

TEST(DeviceCacheTest, BadInputsNameTheTableAndChangeNothing) {
  DeviceCache cache(4, 10, Policy::kLru, "bad", 0.0);
  Planned p = PlanOk(cache, {1, 2});
  V slots(3);
  int64_t token;
  for (const V& batch : {V{3, 10, 4}, V{3, -2, 4}, V{3, 4, 3}}) {
    const Status status = cache.Plan(batch.data(), batch.size(), slots.data(), &token);
    ASSERT_EQ(status.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(status.message().find("table 'bad'"), std::string::npos) << status.message();
  }
  const V out_of_range = {10};
  Status status = cache.Plan(out_of_range.data(), 1, slots.data(), &token);
  EXPECT_NE(status.message().find("global row 10"), std::string::npos);
  const V dup = {3, 4, 3};
  status = cache.Plan(dup.data(), 3, slots.data(), &token);
  EXPECT_NE(status.message().find("global row 3 appears twice"), std::string::npos);
  // Nothing was planned: 3 and 4 are still misses, the next seq is 2.
  Planned q = PlanOk(cache, {3, 4, 1});
  EXPECT_EQ(q.slots, (V{2, 3, 0}));
  EXPECT_EQ(q.token & 0xff, 2);
  EXPECT_EQ(cache.stats().misses, 4);

  status = cache.Release(V{1, 11}.data(), 2);
  ASSERT_EQ(status.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(status.message().find("table 'bad'"), std::string::npos);
  EXPECT_EQ(Locate(cache, {1}), (V{-1}));  // the valid one was not released either

  Moves m;
  status = cache.Apply(p.token + 5, &m);
  ASSERT_EQ(status.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(status.message().find("table 'bad'"), std::string::npos);
  EXPECT_TRUE(Empty(m));
}

TEST(DeviceCacheTest, CompositionOverSeveralPendingPlans) {
  DeviceCache cache(3, 20, Policy::kLru, "t", 0.0);
  PlanAndApplyEach(cache, {{0, 1, 2}, {2}});  // applied: g0@0, g1@1, g2@2 (pinned)
  // Plan 3 evicts g0 (slot 0); plan 4 evicts g1 (slot 1) and brings g0 back
  // into slot 1. Neither batch was trained when plan 4 is applied.
  Planned p3 = PlanOk(cache, {5});
  EXPECT_EQ(p3.slots, (V{0}));
  Planned p4 = PlanOk(cache, {0});
  EXPECT_EQ(p4.slots, (V{1}));
  // Applying plan 4 directly composes plan 3 in: g0 moves 0 -> 1 on the device,
  // g1 goes to the store, g5 comes from the store into slot 0.
  Moves m = ApplyOk(cache, p4.token);
  EXPECT_EQ(m.swap_out_slots, (V{1}));
  EXPECT_EQ(m.swap_out_globals, (V{1}));
  EXPECT_EQ(m.swap_in_slots, (V{1, 0}));
  EXPECT_EQ(m.swap_in_globals, (V{0, 5}));
  EXPECT_EQ(m.swap_in_sources, (V{0, -1}));
  EXPECT_TRUE(Empty(ApplyOk(cache, p3.token)));
  EXPECT_EQ(Locate(cache, {0, 1, 2, 5}), (V{1, -1, 2, 0}));
  EXPECT_EQ(cache.stats().pending_plans, 0);
}

TEST(DeviceCacheTest, CompositionEvictedAndRefilledIntoItsSlotMovesNothing) {
  DeviceCache cache(2, 20, Policy::kLru, "t", 0.0);
  PlanAndApplyEach(cache, {{0, 1}, {1}});  // g0@0 unpinned, g1@1 pinned
  Planned p3 = PlanOk(cache, {7});         // g7 evicts g0 from slot 0
  EXPECT_EQ(p3.slots, (V{0}));
  ASSERT_TRUE(cache.Release(V{7}.data(), 1).ok());  // slot 0 free again
  Planned p4 = PlanOk(cache, {0});                  // g0 back into slot 0
  EXPECT_EQ(p4.slots, (V{0}));
  Moves m = ApplyOk(cache, p4.token);
  // g0: slot 0 -> store -> slot 0: nothing. g7: filled, then dropped: erase only.
  EXPECT_TRUE(m.swap_out_slots.empty());
  EXPECT_TRUE(m.swap_in_slots.empty());
  EXPECT_EQ(m.erase_globals, (V{7}));
  EXPECT_EQ(Locate(cache, {0, 1, 7}), (V{0, 1, -1}));
}

TEST(DeviceCacheTest, CompositionFilledThenDroppedWhilePending) {
  DeviceCache cache(4, 20, Policy::kLru, "t", 0.0);
  Planned p1 = PlanOk(cache, {3});
  Planned p2 = PlanOk(cache, {4});
  ASSERT_TRUE(cache.Release(V{3, -1, 9}.data(), 3).ok());  // g9 was never cached
  Planned p3 = PlanOk(cache, {5});
  EXPECT_EQ(p3.slots, (V{0}));  // slot 0 was freed by the release
  Moves m = ApplyOk(cache, p3.token);
  EXPECT_EQ(m.erase_globals, (V{3, 9}));
  EXPECT_EQ(m.swap_in_slots, (V{1, 0}));
  EXPECT_EQ(m.swap_in_globals, (V{4, 5}));
  EXPECT_TRUE(m.swap_out_slots.empty());
  EXPECT_TRUE(Empty(ApplyOk(cache, p1.token)));
  EXPECT_TRUE(Empty(ApplyOk(cache, p2.token)));
}

TEST(DeviceCacheTest, ReleaseThenReplanErasesAndTakesAFreshRow) {
  DeviceCache cache(3, 20, Policy::kLru, "t", 0.0);
  PlanAndApplyEach(cache, {{4, 5}});
  ASSERT_TRUE(cache.Release(V{4}.data(), 1).ok());
  EXPECT_EQ(cache.stats().occupied, 1);
  EXPECT_EQ(Locate(cache, {4, 5, 6, -1}), (V{-2, 1, -1, -1}));  // the drop is pending
  Planned p = PlanOk(cache, {6, 4});  // the key index reused global 4 for a new key
  EXPECT_EQ(p.slots, (V{0, 2}));
  EXPECT_EQ(Locate(cache, {4}), (V{-2}));
  Moves m = ApplyOk(cache, p.token);
  EXPECT_EQ(m.erase_globals, (V{4}));
  EXPECT_EQ(m.swap_in_slots, (V{2, 0}));
  EXPECT_EQ(m.swap_in_globals, (V{4, 6}));
  EXPECT_EQ(m.swap_in_sources, (V{-1, -1}));
  EXPECT_EQ(Locate(cache, {4, 5, 6}), (V{2, 1, 0}));
}

TEST(DeviceCacheTest, ReleaseAfterTheLastPlanIsAppliedByTheNextOne) {
  DeviceCache cache(2, 20, Policy::kLru, "t", 0.0);
  Planned p1 = PlanAndApplyEach(cache, {{1}});
  ASSERT_TRUE(cache.Release(V{1}.data(), 1).ok());
  EXPECT_TRUE(Empty(ApplyOk(cache, p1.token)));  // already applied: drop not reached
  EXPECT_EQ(Locate(cache, {1}), (V{-2}));
  Planned p2 = PlanOk(cache, {});
  Moves m = ApplyOk(cache, p2.token);
  EXPECT_EQ(m.erase_globals, (V{1}));
  EXPECT_EQ(Locate(cache, {1}), (V{-1}));
}

TEST(DeviceCacheTest, StaleTokenAfterImportOrClearIsFailedPrecondition) {
  DeviceCache cache(2, 20, Policy::kLru, "stale", 0.0);
  Planned p1 = PlanOk(cache, {1});
  DeviceCache::State state;
  cache.ExportState(&state);
  ASSERT_TRUE(cache.ImportState(state).ok());
  Moves m;
  Status status = cache.Apply(p1.token, &m);
  ASSERT_EQ(status.code(), Status::Code::kFailedPrecondition);
  EXPECT_EQ(status.message(),
            "table 'stale': this batch was planned before the table was restored or re-created; "
            "make a new dataset iterator after restoring");
  Planned p2 = PlanOk(cache, {1});
  EXPECT_EQ(p2.token >> DeviceCache::kSeqBits, 2);
  cache.Clear();
  EXPECT_EQ(cache.Apply(p2.token, &m).code(), Status::Code::kFailedPrecondition);
  Planned p3 = PlanOk(cache, {1});
  EXPECT_EQ(p3.token, (int64_t{3} << DeviceCache::kSeqBits) | 1);
  EXPECT_EQ(cache.stats().occupied, 1);
}

TEST(DeviceCacheTest, ExportImportRoundTrip) {
  DeviceCache cache(3, 20, Policy::kLfu, "t", 0.0);
  PlanAndApplyEach(cache, {{0, 1, 2}, {0}, {0}, {2}});
  ASSERT_TRUE(cache.Release(V{1}.data(), 1).ok());  // pending drop
  Planned pending = PlanOk(cache, {7});              // planned, not applied: not exported
  DeviceCache::State state;
  cache.ExportState(&state);
  EXPECT_EQ(state.slots, (V{0, 2}));
  EXPECT_EQ(state.globals, (V{0, 2}));
  EXPECT_EQ(state.last_used, (V{3, 4}));
  EXPECT_EQ(state.frequency, (V{3, 2}));
  EXPECT_EQ(state.dropped, (V{1}));
  EXPECT_EQ(state.counters, (V{4, 3, 4, 0, 3}));

  DeviceCache restored(3, 20, Policy::kLfu, "t", 0.0);
  ASSERT_TRUE(restored.ImportState(state).ok());
  DeviceCache::State again;
  restored.ExportState(&again);
  EXPECT_EQ(again.slots, state.slots);
  EXPECT_EQ(again.globals, state.globals);
  EXPECT_EQ(again.last_used, state.last_used);
  EXPECT_EQ(again.frequency, state.frequency);
  EXPECT_EQ(again.dropped, state.dropped);
  EXPECT_EQ(again.counters, state.counters);
  EXPECT_EQ(Locate(restored, {0, 1, 2, 7}), (V{0, -2, 2, -1}));
  // g7 takes the free slot 1. A restored cache has no batch in flight (its
  // last plan counts as finished), so g8 evicts the least frequently used row:
  // slot 2 (g2, 2 uses; g0 has 3). The pending drop of g1 is applied with this plan.
  Planned p = PlanOk(restored, {7, 8});
  EXPECT_EQ(p.slots, (V{1, 2}));
  EXPECT_EQ(p.token, (int64_t{2} << DeviceCache::kSeqBits) | 5);
  Moves m = ApplyOk(restored, p.token);
  EXPECT_EQ(m.erase_globals, (V{1}));
  EXPECT_EQ(m.swap_out_globals, (V{2}));
  EXPECT_EQ(m.swap_in_globals, (V{7, 8}));
  EXPECT_EQ(Locate(restored, {1}), (V{-1}));
  (void)pending;
}

TEST(DeviceCacheTest, ImportValidatesAndChangesNothing) {
  DeviceCache cache(3, 20, Policy::kLru, "imp", 0.0);
  PlanAndApplyEach(cache, {{5}});
  DeviceCache::State good;
  good.slots = {0, 2};
  good.globals = {4, 9};
  good.last_used = {1, 2};
  good.frequency = {1, 1};
  good.counters = {2, 0, 0, 0, 0};
  std::vector<DeviceCache::State> bad(8, good);
  bad[0].globals = {4};
  bad[1].slots = {0, 0};
  bad[2].slots = {0, 3};
  bad[3].globals = {4, 4};
  bad[4].globals = {4, 20};
  bad[5].frequency = {1, 0};
  bad[6].counters = {2, 0, 0, 0};
  bad[7].dropped = {9};
  for (const auto& state : bad) {
    const Status status = cache.ImportState(state);
    ASSERT_EQ(status.code(), Status::Code::kInvalidArgument);
    EXPECT_NE(status.message().find("table 'imp'"), std::string::npos) << status.message();
  }
  EXPECT_EQ(Locate(cache, {5, 4}), (V{0, -1}));
  ASSERT_TRUE(cache.ImportState(good).ok());
  EXPECT_EQ(Locate(cache, {5, 4, 9}), (V{-1, 0, 2}));
  Planned p = PlanOk(cache, {1});
  EXPECT_EQ(p.slots, (V{1}));  // the lowest free slot
  EXPECT_EQ(p.token & 0xff, 3);
}

// Randomized check of the Moves contract: a simulated device array and host
// store follow the moves; each batch is "trained" (its rows get a new version)
// right after its Apply. Rows must always be where the plans say.
void RandomizedContract(Policy policy, uint64_t seed) {
  constexpr int64_t kDevice = 8, kTotal = 40;
  DeviceCache cache(kDevice, kTotal, policy, "rand", 0.0);
  std::mt19937_64 rng(seed);
  auto value = [](int64_t g, int64_t version) { return g * 100000 + version; };
  std::vector<int64_t> device(kDevice, -7);
  std::map<int64_t, int64_t> store;
  std::vector<int64_t> version(kTotal, 0);  // of the row the model should see
  struct InFlight {
    V globals, slots;
    int64_t token;
  };
  std::vector<InFlight> queue;
  std::vector<std::pair<int64_t, int64_t>> resets;  // (applied from seq, global)
  int64_t planned_seq = 0;
  int applies = 0, failures = 0, skipped = 0;

  auto apply = [&](size_t index) {
    const InFlight batch = queue[index];
    const int64_t seq = batch.token & ((int64_t{1} << DeviceCache::kSeqBits) - 1);
    Moves m = ApplyOk(cache, batch.token);
    ASSERT_EQ(m.swap_in_slots.size(), m.swap_in_globals.size());
    ASSERT_EQ(m.swap_in_slots.size(), m.swap_in_sources.size());
    ASSERT_EQ(m.swap_out_slots.size(), m.swap_out_globals.size());
    std::vector<int64_t> out(m.swap_out_slots.size()), in(m.swap_in_slots.size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = device[m.swap_out_slots[i]];
    for (size_t i = 0; i < in.size(); ++i) {
      if (m.swap_in_sources[i] >= 0) in[i] = device[m.swap_in_sources[i]];
    }
    for (int64_t g : m.erase_globals) store.erase(g);
    for (size_t i = 0; i < in.size(); ++i) {
      if (m.swap_in_sources[i] >= 0) continue;
      const int64_t g = m.swap_in_globals[i];
      auto it = store.find(g);
      in[i] = it == store.end() ? value(g, 0) : it->second;
      if (it != store.end()) store.erase(it);
    }
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_EQ(store.count(m.swap_out_globals[i]), 0u);
      store[m.swap_out_globals[i]] = out[i];
    }
    std::set<int64_t> written;
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_TRUE(written.insert(m.swap_in_slots[i]).second);
      device[m.swap_in_slots[i]] = in[i];
    }
    // Drops reached by this apply reset the rows to fresh ones.
    for (auto it = resets.begin(); it != resets.end();) {
      if (it->first <= seq) {
        version[it->second] = 0;
        it = resets.erase(it);
      } else {
        ++it;
      }
    }
    for (size_t i = 0; i < batch.globals.size(); ++i) {
      const int64_t g = batch.globals[i];
      if (g < 0) {
        ASSERT_EQ(batch.slots[i], -1);
        continue;
      }
      ASSERT_EQ(device[batch.slots[i]], value(g, version[g])) << "global " << g;
      ++version[g];  // the training step updates the row
      device[batch.slots[i]] = value(g, version[g]);
    }
    // Evaluation reads agree with the applied mapping.
    std::vector<int64_t> all(kTotal), located(kTotal);
    for (int64_t g = 0; g < kTotal; ++g) all[g] = g;
    cache.Locate(all.data(), kTotal, located.data());
    for (int64_t g = 0; g < kTotal; ++g) {
      if (located[g] >= 0) {
        EXPECT_EQ(device[located[g]], value(g, version[g])) << "global " << g;
        EXPECT_EQ(store.count(g), 0u);
      } else if (located[g] == -1) {
        auto it = store.find(g);
        EXPECT_EQ(it == store.end() ? value(g, 0) : it->second, value(g, version[g]))
            << "global " << g;
      }
    }
    queue.erase(queue.begin(), queue.begin() + index + 1);
    ++applies;
  };

  for (int step = 0; step < 3000; ++step) {
    if (::testing::Test::HasFatalFailure()) return;
    const size_t depth = 1 + step / 1000;  // 1 to 3 plans in flight
    const int action = static_cast<int>(rng() % 10);
    if (action == 0) {
      // The key index evicts idle keys: some globals leave.
      V released;
      for (int k = 0; k < 2; ++k) released.push_back(static_cast<int64_t>(rng() % kTotal));
      ASSERT_TRUE(cache.Release(released.data(), released.size()).ok());
      for (int64_t g : released) resets.emplace_back(planned_seq + 1, g);
    } else if (queue.size() < depth && action < 7) {
      std::set<int64_t> distinct;
      const int size = 1 + static_cast<int>(rng() % 4);
      while (static_cast<int>(distinct.size()) < size) {
        // Skewed: low globals are hot.
        const int64_t r = static_cast<int64_t>(rng() % kTotal);
        distinct.insert(rng() % 2 ? r % 10 : r);
      }
      InFlight batch;
      batch.globals.assign(distinct.begin(), distinct.end());
      std::shuffle(batch.globals.begin(), batch.globals.end(), rng);
      if (rng() % 3 == 0) batch.globals.push_back(-1);
      batch.slots.assign(batch.globals.size(), -9);
      const Status status =
          cache.Plan(batch.globals.data(), batch.globals.size(), batch.slots.data(), &batch.token);
      if (!status.ok()) {
        ASSERT_EQ(status.code(), Status::Code::kResourceExhausted) << status.message();
        ++failures;
        ASSERT_FALSE(queue.empty());
        apply(0);
        continue;
      }
      ++planned_seq;
      std::set<int64_t> slots;
      for (int64_t s : batch.slots) {
        if (s >= 0) {
          ASSERT_TRUE(slots.insert(s).second);
        }
      }
      queue.push_back(batch);
    } else if (!queue.empty()) {
      // Usually the oldest; sometimes a later one (the earlier batches were
      // planned by a dropped iterator and are never trained).
      size_t index = 0;
      if (queue.size() > 1 && rng() % 8 == 0) {
        index = 1 + rng() % (queue.size() - 1);
        skipped += static_cast<int>(index);
      }
      apply(index);
    }
  }
  EXPECT_GT(applies, 500);
  EXPECT_GT(failures, 0);
  EXPECT_GT(skipped, 0);
  const DeviceCache::Stats stats = cache.stats();
  EXPECT_GT(stats.swap_outs, 0);
  EXPECT_GT(stats.hits, 0);
}

TEST(DeviceCacheTest, RandomizedMovesKeepRowsWherePlansSayLru) {
  for (uint64_t seed = 1; seed <= 3; ++seed) RandomizedContract(Policy::kLru, seed);
}

TEST(DeviceCacheTest, RandomizedMovesKeepRowsWherePlansSayLfu) {
  for (uint64_t seed = 1; seed <= 3; ++seed) RandomizedContract(Policy::kLfu, seed);
}

// Randomized check of the victim choice against a reference model: misses
// take the lowest free slots, then the unpinned slots that are least by
// (last_used, slot) for LRU or (frequency, last_used, slot) for LFU; a plan
// fails when the misses exceed the free and unpinned slots. Mixes releases,
// applies that skip plans, finishes, and export/import round trips. The larger
// configurations make plans of 64 slots and more (LRU sorts them by radix).
struct ModelConfig {
  int64_t device, total, hot, max_batch;
  int steps;
};

void ReferenceVictims(Policy policy, uint64_t seed, const ModelConfig& config) {
  const int64_t kDevice = config.device, kTotal = config.total;
  constexpr int64_t kSeqMask = (int64_t{1} << DeviceCache::kSeqBits) - 1;
  DeviceCache cache(kDevice, kTotal, policy, "ref", 0.0);
  std::mt19937_64 rng(seed);
  V global(kDevice, -1), last_used(kDevice, 0), frequency(kDevice, 0), slot_of(kTotal, -1);
  int64_t planned = 0, applied = 0, finished = 0;
  std::vector<int64_t> tokens;  // planned, not applied
  int plans = 0, failures = 0, imports = 0;
  int64_t evictions = 0;
  auto key = [&](int64_t s) {
    return std::make_tuple(policy == Policy::kLfu ? frequency[s] : 0, last_used[s], s);
  };
  for (int step = 0; step < config.steps; ++step) {
    const int action = static_cast<int>(rng() % 12);
    if (action == 0) {
      V released;
      for (int k = 0; k < 1 + config.max_batch / 8; ++k) {
        released.push_back(static_cast<int64_t>(rng() % kTotal));
      }
      ASSERT_TRUE(cache.Release(released.data(), released.size()).ok());
      for (int64_t g : released) {
        if (slot_of[g] >= 0) global[slot_of[g]] = -1;
        slot_of[g] = -1;
      }
    } else if (action == 1 && tokens.empty()) {
      DeviceCache::State state;
      cache.ExportState(&state);
      V expected_slots;
      for (int64_t s = 0; s < kDevice; ++s) {
        if (global[s] >= 0) expected_slots.push_back(s);
      }
      ASSERT_EQ(state.slots, expected_slots);
      for (size_t i = 0; i < state.slots.size(); ++i) {
        const int64_t s = state.slots[i];
        ASSERT_EQ(state.globals[i], global[s]);
        ASSERT_EQ(state.last_used[i], last_used[s]);
        ASSERT_EQ(state.frequency[i], frequency[s]);
      }
      ASSERT_TRUE(cache.ImportState(state).ok());
      finished = applied = planned;  // a restored cache has nothing in flight
      ++imports;
    } else if (action < 8 && tokens.size() < 3) {
      std::set<int64_t> distinct;
      const int64_t size = 1 + static_cast<int64_t>(rng() % config.max_batch);
      while (static_cast<int64_t>(distinct.size()) < size) {
        const int64_t r = static_cast<int64_t>(rng() % kTotal);
        distinct.insert(rng() % 2 ? r % config.hot : r);
      }
      V batch(distinct.begin(), distinct.end());
      std::shuffle(batch.begin(), batch.end(), rng);
      // The expected slots: hits keep theirs; misses take the free slots in
      // ascending order, then the unpinned slots other than the hits by key.
      const int64_t seq = planned + 1, floor = std::max(applied, finished + 1);
      std::set<int64_t> hit_slots;
      int64_t misses = 0;
      for (int64_t g : batch) {
        if (slot_of[g] >= 0) {
          hit_slots.insert(slot_of[g]);
        } else {
          ++misses;
        }
      }
      V places, candidates;
      for (int64_t s = 0; s < kDevice; ++s) {
        if (global[s] < 0) {
          places.push_back(s);
        } else if (last_used[s] < floor && !hit_slots.count(s)) {
          candidates.push_back(s);
        }
      }
      std::sort(candidates.begin(), candidates.end(),
                [&](int64_t a, int64_t b) { return key(a) < key(b); });
      const size_t free = places.size();
      places.insert(places.end(), candidates.begin(), candidates.end());

      V slots(batch.size(), -9);
      int64_t token = -9;
      const Status status = cache.Plan(batch.data(), batch.size(), slots.data(), &token);
      if (misses > static_cast<int64_t>(places.size())) {
        ASSERT_EQ(status.code(), Status::Code::kResourceExhausted) << status.message();
        ++failures;
        continue;
      }
      ASSERT_TRUE(status.ok()) << status.message();
      V expected(batch.size(), -1);
      size_t next = 0;
      for (size_t i = 0; i < batch.size(); ++i) {
        const int64_t g = batch[i];
        int64_t s = slot_of[g];
        if (s >= 0) {
          ++frequency[s];
        } else {
          s = places[next++];
          if (global[s] >= 0) slot_of[global[s]] = -1;
          global[s] = g;
          slot_of[g] = s;
          frequency[s] = 1;
        }
        last_used[s] = seq;
        expected[i] = s;
      }
      evictions += static_cast<int64_t>(next > free ? next - free : 0);
      ASSERT_EQ(slots, expected) << "plan " << seq;
      planned = seq;
      tokens.push_back(token);
      ++plans;
    } else if (!tokens.empty()) {
      size_t index = 0;
      if (tokens.size() > 1 && rng() % 6 == 0) index = 1 + rng() % (tokens.size() - 1);
      const int64_t token = tokens[index];
      ApplyOk(cache, token);
      applied = token & kSeqMask;
      tokens.erase(tokens.begin(), tokens.begin() + index + 1);
      if (rng() % 2) {
        cache.Finish(token);
        finished = std::max(finished, applied);
      }
    }
  }
  EXPECT_GT(plans, config.steps / 4);
  EXPECT_GT(evictions, plans);
  EXPECT_GT(imports, 0);
  if (config.device == 16) {
    EXPECT_GT(failures, 0);
  }
}

// 16 slots: tight, plans often fail. 1000 slots: one radix pass; 3000: two.
const ModelConfig kModelConfigs[] = {
    {16, 64, 20, 6, 4000}, {1000, 4000, 1500, 300, 400}, {3000, 12000, 4000, 800, 250}};

TEST(DeviceCacheTest, VictimsMatchAReferenceModelLru) {
  for (const ModelConfig& config : kModelConfigs) {
    for (uint64_t seed = 1; seed <= 3; ++seed) ReferenceVictims(Policy::kLru, seed, config);
  }
}

TEST(DeviceCacheTest, VictimsMatchAReferenceModelLfu) {
  for (const ModelConfig& config : kModelConfigs) {
    for (uint64_t seed = 1; seed <= 3; ++seed) ReferenceVictims(Policy::kLfu, seed, config);
  }
}

TEST(DeviceCacheTest, ConcurrentPlanAndApplyThreads) {
  DeviceCache cache(16, 64, Policy::kLfu, "t", 5.0);
  std::vector<int64_t> tokens;
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::thread trainer([&] {
    size_t next = 0;
    while (true) {
      int64_t token;
      {
        std::unique_lock<std::mutex> lock(mu);
        cv.wait(lock, [&] { return next < tokens.size() || done; });
        if (next >= tokens.size()) return;
        token = tokens[next++];
      }
      Moves m;
      EXPECT_TRUE(cache.Apply(token, &m).ok());
    }
  });
  std::mt19937_64 rng(7);
  for (int b = 0; b < 500; ++b) {
    std::set<int64_t> distinct;
    while (distinct.size() < 6) distinct.insert(static_cast<int64_t>(rng() % 64));
    V globals(distinct.begin(), distinct.end()), slots(globals.size());
    int64_t token;
    const Status status = cache.Plan(globals.data(), globals.size(), slots.data(), &token);
    ASSERT_TRUE(status.ok()) << status.message();
    {
      std::lock_guard<std::mutex> lock(mu);
      tokens.push_back(token);
    }
    cv.notify_one();
    if (b % 50 == 0) {
      ASSERT_TRUE(cache.Release(globals.data(), 1).ok());
    }
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    done = true;
  }
  cv.notify_one();
  trainer.join();
  EXPECT_EQ(cache.stats().pending_plans, 0);
}


// pin_until_finish (parameter-server shards): steps finish out of order.
TEST(DeviceCacheTest, PinUntilFinishKeepsAnOlderStepPinnedWhenANewerOneFinishes) {
  DeviceCache cache(4, 100, Policy::kLru, "ps_t", 5.0, /*pin_until_finish=*/true);
  Planned a = PlanOk(cache, {0, 1});  // worker A's step
  ApplyOk(cache, a.token);
  Planned b = PlanOk(cache, {2, 3});  // worker B's step
  ApplyOk(cache, b.token);
  cache.Finish(b.token);  // B finishes first; A still reads and updates slots 0 and 1
  EXPECT_EQ(cache.stats().in_flight, 1);
  V slots(1, -9);
  int64_t token = -9;
  const V batch = {4};
  // Without waiting (A is not lost: it was planned less than wait_seconds ago).
  Status status = cache.Plan(batch.data(), 1, slots.data(), &token, nullptr, /*wait=*/false);
  ASSERT_EQ(status.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(status.message(),
            "table 'ps_t': the device cache (device_vocabulary_size=4) has no room for the 1 new "
            "ids of this batch: 4 rows are held by the 1 training steps in flight (planned, "
            "optimizer update not finished); raise device_vocabulary_size (of each shard) or run "
            "fewer workers");
  cache.Finish(a.token);
  cache.Finish(a.token);  // twice: changes nothing
  EXPECT_EQ(cache.stats().in_flight, 0);
  Planned c = PlanOk(cache, {4});
  EXPECT_EQ(c.slots, (V{0}));  // least recently used: A's
  Moves m = ApplyOk(cache, c.token);
  EXPECT_EQ(m.swap_out_globals, (V{0}));
}

TEST(DeviceCacheTest, PinUntilFinishDropsAPlanUnfinishedForTwiceWaitSeconds) {
  DeviceCache cache(2, 100, Policy::kLfu, "ps_t", 0.05, /*pin_until_finish=*/true);
  Planned lost = PlanOk(cache, {0, 1});  // its worker dies: never finished
  ApplyOk(cache, lost.token);
  // Younger than 2 x wait_seconds at the end of the wait: still pinned.
  V slots(1, -9);
  int64_t token = -9;
  EXPECT_EQ(cache.Plan(V{2}.data(), 1, slots.data(), &token).code(),
            Status::Code::kResourceExhausted);
  std::this_thread::sleep_for(std::chrono::milliseconds(60));
  Planned next = PlanOk(cache, {2});
  EXPECT_EQ(next.slots, (V{0}));
  EXPECT_EQ(cache.stats().in_flight, 1);
  // The lost plan's step was alive after all: its Finish fails, naming the table.
  Status late = cache.Finish(lost.token);
  EXPECT_EQ(late.code(), Status::Code::kFailedPrecondition);
  EXPECT_NE(late.message().find("table 'ps_t'"), std::string::npos) << late.message();
  EXPECT_NE(late.message().find("taken as lost"), std::string::npos) << late.message();
  EXPECT_TRUE(cache.Finish(lost.token).ok());  // reported once
  EXPECT_TRUE(cache.Finish(next.token).ok());
  EXPECT_EQ(cache.stats().in_flight, 0);
}

TEST(DeviceCacheTest, PinUntilFinishImportClearsThePlansInFlight) {
  DeviceCache cache(2, 100, Policy::kLru, "ps_t", 0.0, /*pin_until_finish=*/true);
  PlanOk(cache, {0, 1});
  DeviceCache::State state;
  cache.ExportState(&state);
  ASSERT_TRUE(cache.ImportState(state).ok());
  EXPECT_EQ(cache.stats().in_flight, 0);
  PlanOk(cache, {2, 3});
}

// Workers of a parameter server: each step plans and applies its moves in one
// exclusive section (the shard's critical section), then reads and updates its
// slots while other steps plan, and finishes. Rows live in a simulated device
// array and host store; no step ever sees a slot of its own hold another row.
void ConcurrentStepsKeepTheirRows(Policy policy) {
  constexpr int64_t kDeviceRows = 24, kTotal = 200;
  DeviceCache cache(kDeviceRows, kTotal, policy, "ps_t", 10.0, /*pin_until_finish=*/true);
  std::vector<int64_t> device(kDeviceRows, -1);  // slot -> the global whose row it holds
  std::map<int64_t, int64_t> store;                // global -> its row (the global itself)
  std::mutex section;                              // the shard's exclusive section
  std::atomic<int64_t> wrong{0}, steps{0};
  auto worker = [&](int id) {
    std::mt19937_64 rng(100 + id);
    for (int step = 0; step < 300; ++step) {
      std::set<int64_t> distinct;
      while (distinct.size() < 5) distinct.insert(static_cast<int64_t>(rng() % kTotal));
      V globals(distinct.begin(), distinct.end()), slots(globals.size());
      int64_t token = -1;
      {
        std::lock_guard<std::mutex> lock(section);
        const Status status = cache.Plan(globals.data(), globals.size(), slots.data(), &token);
        ASSERT_TRUE(status.ok()) << status.message();
        Moves m;
        ASSERT_TRUE(cache.Apply(token, &m).ok());
        std::vector<int64_t> moved;  // read every source before writing
        for (int64_t src : m.swap_in_sources) moved.push_back(src >= 0 ? device[src] : -1);
        for (size_t i = 0; i < m.swap_out_slots.size(); ++i) {
          EXPECT_EQ(device[m.swap_out_slots[i]], m.swap_out_globals[i]);
        }
        for (int64_t g : m.erase_globals) store.erase(g);
        for (size_t i = 0; i < m.swap_in_slots.size(); ++i) {
          if (m.swap_in_sources[i] < 0) {
            store.erase(m.swap_in_globals[i]);
            moved[i] = m.swap_in_globals[i];  // taken from the store or fresh
          }
        }
        for (size_t i = 0; i < m.swap_out_slots.size(); ++i) {
          store[m.swap_out_globals[i]] = device[m.swap_out_slots[i]];
        }
        for (size_t i = 0; i < m.swap_in_slots.size(); ++i) device[m.swap_in_slots[i]] = moved[i];
      }
      // The step's forward and backward passes and its update, unlocked.
      for (int check = 0; check < 3; ++check) {
        for (size_t i = 0; i < globals.size(); ++i) {
          if (device[slots[i]] != globals[i]) ++wrong;
        }
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 200));
      }
      cache.Finish(token);
      ++steps;
    }
  };
  std::vector<std::thread> workers;
  for (int id = 0; id < 4; ++id) workers.emplace_back(worker, id);
  for (std::thread& t : workers) t.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(steps.load(), 4 * 300);
  EXPECT_EQ(cache.stats().in_flight, 0);
  EXPECT_GT(cache.stats().swap_outs, 100);  // the cache was far too small for the ids
}

TEST(DeviceCacheTest, PinUntilFinishConcurrentStepsKeepTheirRowsLru) {
  ConcurrentStepsKeepTheirRows(Policy::kLru);
}

TEST(DeviceCacheTest, PinUntilFinishConcurrentStepsKeepTheirRowsLfu) {
  ConcurrentStepsKeepTheirRows(Policy::kLfu);
}


// Benchmark at production scale, not part of the default run (DISABLED_).
// Plans 100 batches of 65,536 ids drawn Zipf-like (exponent 1.02, ~28,000
// distinct) from 4M global rows into a cache of 422,000 slots, with Apply and
// Finish after each plan, after warm-up batches that fill the cache. Prints the
// mean ms per Plan and per Apply. Meaningful only in an optimized build, e.g.
//   g++ -std=c++20 -O3 -DNDEBUG native/core/device_cache.cc
//     native/tests/device_cache_test.cc -lgtest -lgtest_main -pthread -o /tmp/dc_bench
//   /tmp/dc_bench --gtest_also_run_disabled_tests --gtest_filter='DeviceCacheBench.*'
void BenchPlan(Policy policy) {
  constexpr int64_t kTotal = 4'000'000, kDevice = 422'000, kIds = 65'536;
  constexpr int kWarmup = 40, kTimed = 100;
  // Inverse CDF of Zipf(1.02) over ranks; ranks scattered over the globals by
  // a bijective multiplicative hash (the multiplier is prime to 2 and 5).
  std::vector<double> cdf(kTotal);
  double sum = 0;
  for (int64_t k = 0; k < kTotal; ++k) cdf[k] = sum += std::pow(static_cast<double>(k + 1), -1.02);
  std::mt19937_64 rng(42);
  std::uniform_real_distribution<double> uniform(0.0, sum);
  std::vector<V> batches(kWarmup + kTimed);
  std::vector<char> seen(kTotal, 0);
  int64_t distinct = 0;
  for (V& batch : batches) {
    for (int64_t i = 0; i < kIds; ++i) {
      const int64_t rank = std::lower_bound(cdf.begin(), cdf.end(), uniform(rng)) - cdf.begin();
      const int64_t g =
          static_cast<int64_t>((static_cast<uint64_t>(std::min(rank, kTotal - 1)) * 2654435761u) %
                               static_cast<uint64_t>(kTotal));
      if (!seen[g]) {
        seen[g] = 1;
        batch.push_back(g);
      }
    }
    for (int64_t g : batch) seen[g] = 0;
    distinct += static_cast<int64_t>(batch.size());
  }
  DeviceCache cache(kDevice, kTotal, policy, "bench", 0.0);
  double plan_seconds = 0, apply_seconds = 0;
  for (size_t b = 0; b < batches.size(); ++b) {
    const V& batch = batches[b];
    V slots(batch.size());
    int64_t token = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const Status status = cache.Plan(batch.data(), batch.size(), slots.data(), &token);
    const auto t1 = std::chrono::steady_clock::now();
    ASSERT_TRUE(status.ok()) << status.message();
    Moves moves;
    ASSERT_TRUE(cache.Apply(token, &moves).ok());
    const auto t2 = std::chrono::steady_clock::now();
    cache.Finish(token);
    if (b >= static_cast<size_t>(kWarmup)) {
      plan_seconds += std::chrono::duration<double>(t1 - t0).count();
      apply_seconds += std::chrono::duration<double>(t2 - t1).count();
    }
  }
  const DeviceCache::Stats stats = cache.stats();
  std::printf(
      "[bench] %s: %.0f distinct ids per batch; over %d batches after %d warm-up: "
      "%.3f ms per Plan, %.3f ms per Apply; totals: hits %lld, misses %lld, swap_outs %lld\n",
      policy == Policy::kLru ? "LRU" : "LFU",
      static_cast<double>(distinct) / static_cast<double>(batches.size()), kTimed, kWarmup,
      1e3 * plan_seconds / kTimed, 1e3 * apply_seconds / kTimed,
      static_cast<long long>(stats.hits), static_cast<long long>(stats.misses),
      static_cast<long long>(stats.swap_outs));
}

TEST(DeviceCacheBench, DISABLED_PlanLru) { BenchPlan(Policy::kLru); }

TEST(DeviceCacheBench, DISABLED_PlanLfu) { BenchPlan(Policy::kLfu); }

}  // namespace
}  // namespace mxrec

// GoogleTest unit tests of the TF-free key index. Run under ASan/UBSan by
// `make native-test`. Hashtable tests never assume slot order: they export, sort
// and compare.
#include "../core/key_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <barrier>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

namespace mxrec {
namespace {

std::vector<std::pair<int64_t, int64_t>> SortedPairs(const KeyIndex& index) {
  std::vector<int64_t> keys, rows;
  index.Export(&keys, &rows);
  std::vector<std::pair<int64_t, int64_t>> pairs;
  for (size_t i = 0; i < keys.size(); ++i) pairs.emplace_back(keys[i], rows[i]);
  std::sort(pairs.begin(), pairs.end());
  return pairs;
}

TEST(DeduplicateTest, FirstOccurrenceOrderAndRestore) {
  const std::vector<int64_t> keys = {7, -3, 7, 1LL << 62, -3, 0, 7};
  std::vector<int64_t> unique;
  std::vector<int32_t> restore(keys.size());
  Deduplicate(keys.data(), keys.size(), &unique, restore.data());
  EXPECT_EQ(unique, (std::vector<int64_t>{7, -3, 1LL << 62, 0}));
  EXPECT_EQ(restore, (std::vector<int32_t>{0, 1, 0, 2, 1, 3, 0}));
}

TEST(DeduplicateTest, EmptyInput) {
  std::vector<int64_t> unique = {42};
  Deduplicate(nullptr, 0, &unique, nullptr);
  EXPECT_TRUE(unique.empty());
}

TEST(DeduplicateTest, ManyRandomKeysRoundTrip) {
  std::mt19937_64 rng(1);
  std::vector<int64_t> keys(100000);
  for (auto& k : keys) k = static_cast<int64_t>(rng() % 5000) * 1000003LL - (1LL << 40);
  std::vector<int64_t> unique;
  std::vector<int32_t> restore(keys.size());
  Deduplicate(keys.data(), keys.size(), &unique, restore.data());
  EXPECT_EQ(std::set<int64_t>(keys.begin(), keys.end()).size(), unique.size());
  for (size_t i = 0; i < keys.size(); ++i) ASSERT_EQ(unique[restore[i]], keys[i]);
}

// Reference of Deduplicate: first-occurrence order, by a std::map.
void ReferenceDedup(const std::vector<int64_t>& keys, std::vector<int64_t>* unique,
                    std::vector<int32_t>* restore) {
  std::map<int64_t, int32_t> position;
  unique->clear();
  restore->clear();
  for (int64_t key : keys) {
    auto [it, added] = position.try_emplace(key, static_cast<int32_t>(unique->size()));
    if (added) unique->push_back(key);
    restore->push_back(it->second);
  }
}

TEST(DeduplicateTest, MatchesReferenceAroundThePrefetchDistanceAndThroughGrowth) {
  // Deduplicate hashes keys[i + 16] while probing keys[i] (a ring of 16
  // hashes): batches shorter than, equal to and just past 16, and a batch whose
  // table doubles several times, all equal the std::map reference.
  std::mt19937_64 rng(5);
  for (int64_t n : {1, 2, 15, 16, 17, 31, 32, 33, 100, 70000}) {
    SCOPED_TRACE(n);
    std::vector<int64_t> keys(n);
    const int64_t distinct = std::max<int64_t>(1, n / 3);
    for (int64_t& key : keys) key = static_cast<int64_t>(rng() % distinct) * 7919 - 100;
    std::vector<int64_t> unique, want_unique;
    std::vector<int32_t> restore(n), want_restore;
    Deduplicate(keys.data(), n, &unique, restore.data());
    ReferenceDedup(keys, &want_unique, &want_restore);
    EXPECT_EQ(unique, want_unique);
    EXPECT_EQ(restore, want_restore);
  }
}

TEST(DeduplicateTest, MatchesReferenceForStructuredKeysAndAnySizeHint) {
  // The local table is addressed by the top bits of key * 2^64/phi and starts
  // at `expected_unique`'s size: consecutive, strided (multiples of 2^32, ids
  // in the high bits) and negative keys, with hints of 0, too small, exact and
  // far too large, all equal the std::map reference.
  std::mt19937_64 rng(9);
  for (int pattern = 0; pattern < 3; ++pattern) {
    std::vector<int64_t> keys(50000);
    for (int64_t& key : keys) {
      const int64_t id = static_cast<int64_t>(rng() % 20000);
      key = pattern == 0 ? id : pattern == 1 ? id << 32 : -1 - id * 65536;
    }
    std::vector<int64_t> want_unique;
    std::vector<int32_t> want_restore;
    ReferenceDedup(keys, &want_unique, &want_restore);
    for (int64_t hint : {int64_t{0}, int64_t{100}, static_cast<int64_t>(want_unique.size()),
                         int64_t{1} << 40}) {
      SCOPED_TRACE(testing::Message() << "pattern " << pattern << ", hint " << hint);
      std::vector<int64_t> unique;
      std::vector<int32_t> restore(keys.size());
      Deduplicate(keys.data(), keys.size(), &unique, restore.data(), hint);
      EXPECT_EQ(unique, want_unique);
      EXPECT_EQ(restore, want_restore);
    }
  }
}

TEST(KeyIndexTest, PipelinedInsertMatchesModelThroughGrowthAndRepeatedDeferredKeys) {
  // FindOrInsert computes every home slot first, then probes with prefetching
  // 16 keys ahead; past the array's room (12 of 16 slots at first) the absent
  // keys are deferred and inserted after one rehash, pipelined the same way.
  // Batches mix present keys, new keys and new keys repeated within the batch
  // (before and after the deferral point); every row must equal a std::map
  // model's: absent keys take the next rows in order of first appearance.
  for (bool growable : {false, true}) {
    SCOPED_TRACE(growable);
    KeyIndex index(5000, "t", growable);
    std::map<int64_t, int64_t> model;
    std::mt19937_64 rng(11);
    std::vector<int64_t> known;
    for (int batch_number = 0; batch_number < 40; ++batch_number) {
      const int64_t size = 1 + static_cast<int64_t>(rng() % 300);
      std::vector<int64_t> keys;
      for (int64_t i = 0; i < size; ++i) {
        const uint64_t pick = rng() % 4;
        if (pick == 0 && !known.empty()) {
          keys.push_back(known[rng() % known.size()]);  // Present.
        } else if (pick == 1 && !keys.empty()) {
          keys.push_back(keys[rng() % keys.size()]);  // Repeated within the batch.
        } else {
          keys.push_back(static_cast<int64_t>(rng()));  // New.
        }
      }
      std::vector<int64_t> want(keys.size());
      int64_t next_row = static_cast<int64_t>(model.size());
      std::map<int64_t, int64_t> after = model;
      for (size_t i = 0; i < keys.size(); ++i) {
        auto [it, added] = after.try_emplace(keys[i], next_row);
        if (added) ++next_row;
        want[i] = it->second;
      }
      if (next_row > 5000) break;  // The fixed-capacity index would be full.
      std::vector<int64_t> rows(keys.size());
      ASSERT_TRUE(index.FindOrInsert(keys.data(), keys.size(), rows.data()).ok());
      ASSERT_EQ(rows, want) << "batch " << batch_number;
      model = after;
      known.clear();
      for (const auto& [key, row] : model) known.push_back(key);
    }
    EXPECT_EQ(index.size(), static_cast<int64_t>(model.size()));
    const std::vector<std::pair<int64_t, int64_t>> want(model.begin(), model.end());
    EXPECT_EQ(SortedPairs(index), want);
  }
}

TEST(KeyIndexTest, FailingBatchWithDeferredRepeatsUndoesEverything) {
  // A fixed-capacity index of 20 rows holding 10 keys; a batch of 30 new keys,
  // each twice, probes past the array's room (deferred keys, counted twice) and
  // does not fit: nothing is inserted, and the next fitting batch gets rows 10..
  KeyIndex index(20, "t");
  std::vector<int64_t> first(10);
  std::iota(first.begin(), first.end(), 500);
  std::vector<int64_t> rows(first.size());
  ASSERT_TRUE(index.FindOrInsert(first.data(), first.size(), rows.data()).ok());
  const auto before = SortedPairs(index);
  std::vector<int64_t> batch;
  for (int64_t k = 0; k < 30; ++k) {
    batch.push_back(9000 + k);
    batch.push_back(9000 + k);
  }
  std::vector<int64_t> out(batch.size());
  Status status = index.FindOrInsert(batch.data(), batch.size(), out.data());
  EXPECT_EQ(status.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(status.message().find("brings 30 new keys"), std::string::npos) << status.message();
  EXPECT_EQ(SortedPairs(index), before);
  batch.resize(20);  // Keys 9000..9009, each twice: 10 new keys fit exactly.
  out.resize(20);
  ASSERT_TRUE(index.FindOrInsert(batch.data(), batch.size(), out.data()).ok());
  for (int64_t i = 0; i < 20; ++i) EXPECT_EQ(out[i], 10 + i / 2);
}

TEST(KeyIndexMemoryTest, BatchThatCannotFailGrowsTheArrayFirstOnlyThen) {
  // n distinct keys bring at least n - size() new ones: an empty index grows
  // to 1.5 n slots before probing a batch of n (load 2/3 after it). A batch
  // that may not fit the rows does not grow the array first, so a failing
  // one leaves the memory as it was.
  KeyIndex index(2000, "t");
  std::vector<int64_t> keys(1000);
  std::iota(keys.begin(), keys.end(), 70000);
  std::vector<int64_t> rows(keys.size());
  ASSERT_TRUE(index.FindOrInsert(keys.data(), keys.size(), rows.data()).ok());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(rows[i], i);
  EXPECT_EQ(index.MemoryBytes(), 16 * 1500);
  std::vector<int64_t> more(1300);  // 1000 stored + 1300 new > 2000 rows.
  std::iota(more.begin(), more.end(), 90000);
  rows.resize(more.size());
  EXPECT_EQ(index.FindOrInsert(more.data(), more.size(), rows.data()).code(),
            Status::Code::kResourceExhausted);
  EXPECT_EQ(index.size(), 1000);
  EXPECT_EQ(index.MemoryBytes(), 16 * 1500);
}

TEST(HugePageAllocatorTest, LargeBlocksAreAlignedAndSmallOnesPlain) {
  // A block of 2 MB or more is mapped on its own, 2-MB aligned (for THP); a
  // smaller one comes from operator new. Both hold what is written; vectors
  // of either kind swap and grow across the threshold keeping their content.
  using Vector = std::vector<int64_t, HugePageAllocator<int64_t>>;
  Vector large(kHugePageBytes / sizeof(int64_t) + 1000);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % kHugePageBytes, 0u);
  std::iota(large.begin(), large.end(), int64_t{-7});
  Vector small(100, 3);
  small.swap(large);
  EXPECT_EQ(large, Vector(100, 3));
  EXPECT_EQ(small.front(), -7);
  EXPECT_EQ(small.back(), static_cast<int64_t>(small.size()) - 8);
  large.resize(kHugePageBytes / sizeof(int64_t) * 2, 9);  // Grows across the threshold.
  EXPECT_EQ(reinterpret_cast<uintptr_t>(large.data()) % kHugePageBytes, 0u);
  EXPECT_EQ(large[99], 3);
  EXPECT_EQ(large[100], 9);
  EXPECT_EQ(large.back(), 9);
  EXPECT_THROW((void)HugePageAllocator<int64_t>().allocate(SIZE_MAX / 4), std::bad_alloc);
}

TEST(HugePageArrayTest, GrowKeepsContentInPlaceAcrossTheThreshold) {
  // Grow keeps the first size() elements and sets the new ones; past 2 MB the
  // block is 2-MB aligned, and a 2-MB block grows by moving its pages (mremap)
  // with its last part (< 2 MB) copied: every old value must survive each step.
  constexpr size_t kPerHugePage = kHugePageBytes / sizeof(int64_t);
  HugePageArray<int64_t> array(100, 3);
  array.Grow(50, 0);  // Not larger: nothing changes.
  ASSERT_EQ(array.size(), 100u);
  std::iota(array.begin(), array.end(), int64_t{0});
  int64_t expected_size = 100;
  for (size_t size : {size_t{1000}, kPerHugePage + 777, 2 * kPerHugePage + 5, 5 * kPerHugePage}) {
    SCOPED_TRACE(size);
    array.Grow(size, -4);
    ASSERT_EQ(array.size(), size);
    if (size * sizeof(int64_t) >= kHugePageBytes) {
      EXPECT_EQ(reinterpret_cast<uintptr_t>(array.data()) % kHugePageBytes, 0u);
    }
    for (int64_t i = 0; i < expected_size; ++i) ASSERT_EQ(array[i], i) << i;
    for (size_t i = expected_size; i < size; ++i) ASSERT_EQ(array[i], -4) << i;
    std::iota(array.begin() + expected_size, array.end(), expected_size);
    expected_size = static_cast<int64_t>(size);
  }
  HugePageArray<int64_t> moved(std::move(array));
  EXPECT_EQ(array.size(), 0u);
  EXPECT_EQ(moved[expected_size - 1], expected_size - 1);
  // A size the host cannot map (or that overflows) throws; the array is as it was.
  EXPECT_THROW(moved.Grow(size_t{1} << 44, 0), std::bad_alloc);
  EXPECT_THROW(moved.Grow(SIZE_MAX / 4, 0), std::bad_alloc);
  ASSERT_EQ(moved.size(), static_cast<size_t>(expected_size));
  for (int64_t i = 0; i < expected_size; ++i) ASSERT_EQ(moved[i], i) << i;
}

// The index's hash of a key: splitmix64's finalizer (Mix in key_index.cc). Only
// used to pick keys whose home slots lie at the end of any array.
uint64_t IndexHash(int64_t key) {
  uint64_t z = static_cast<uint64_t>(key) + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// `count` random keys whose hash is in the top 1/1024 of its range: their home
// slots are the array's last 0.1%, so their probe runs wrap around to slot 0.
std::vector<int64_t> KeysHomedAtTheEnd(std::mt19937_64& rng, int64_t count) {
  std::vector<int64_t> keys;
  while (static_cast<int64_t>(keys.size()) < count) {
    const int64_t key = static_cast<int64_t>(rng());
    if (IndexHash(key) >> 54 == 1023) keys.push_back(key);
  }
  return keys;
}

TEST(KeyIndexTest, InPlaceGrowthMatchesModelWithWrappedAndDisplacedKeys) {
  // The array grows in place (2-MB blocks by mremap) and is rehashed in place
  // from its last slot down; keys whose runs wrap around to slot 0 are placed
  // last and displace old keys below the scan. Batches of new, present,
  // repeated and end-homed keys take the array from 16 slots past 2 MB (150k
  // keys): every row must equal a std::unordered_map model's, every key stay
  // findable, and a batch that does not fit changes nothing.
  for (bool growable : {false, true}) {
    SCOPED_TRACE(growable);
    constexpr int64_t kCapacity = 150000;
    KeyIndex index(kCapacity, "t", growable);
    std::unordered_map<int64_t, int64_t> model;
    std::vector<int64_t> known;
    std::mt19937_64 rng(23);
    std::vector<int64_t> wrapped = KeysHomedAtTheEnd(rng, 1500);
    size_t next_wrapped = 0;
    int64_t batches = 0;
    while (static_cast<int64_t>(model.size()) < kCapacity - 10000) {
      const int64_t size = 1 + static_cast<int64_t>(rng() % 12000);
      std::vector<int64_t> keys;
      for (int64_t i = 0; i < size; ++i) {
        const uint64_t pick = rng() % 8;
        if (pick == 0 && !known.empty()) {
          keys.push_back(known[rng() % known.size()]);
        } else if (pick == 1 && !keys.empty()) {
          keys.push_back(keys[rng() % keys.size()]);
        } else if (pick == 2 && next_wrapped < wrapped.size()) {
          keys.push_back(wrapped[next_wrapped++]);
        } else {
          keys.push_back(static_cast<int64_t>(rng()));
        }
      }
      std::vector<int64_t> want(keys.size());
      int64_t next_row = static_cast<int64_t>(model.size());
      for (size_t i = 0; i < keys.size(); ++i) {
        auto [it, added] = model.try_emplace(keys[i], next_row);
        if (added) {
          ++next_row;
          known.push_back(keys[i]);
        }
        want[i] = it->second;
      }
      std::vector<int64_t> rows(keys.size());
      ASSERT_TRUE(index.FindOrInsert(keys.data(), keys.size(), rows.data()).ok());
      ASSERT_EQ(rows, want) << "batch " << batches;
      ++batches;
    }
    EXPECT_EQ(next_wrapped, wrapped.size());
    EXPECT_LE(index.MemoryBytes(), 24 * static_cast<int64_t>(model.size()));
    std::vector<int64_t> rows(known.size());
    index.Find(known.data(), known.size(), rows.data());
    for (size_t i = 0; i < known.size(); ++i) ASSERT_EQ(rows[i], model[known[i]]) << i;
    const auto before = SortedPairs(index);
    std::vector<std::pair<int64_t, int64_t>> want(model.begin(), model.end());
    std::sort(want.begin(), want.end());
    ASSERT_EQ(before, want);
    if (!growable) {
      // 20,000 new keys do not fit the 10,000 rows left: nothing changes.
      std::vector<int64_t> keys(20000), out(20000);
      for (int64_t& key : keys) key = static_cast<int64_t>(rng());
      const int64_t memory = index.MemoryBytes();
      EXPECT_EQ(index.FindOrInsert(keys.data(), keys.size(), out.data()).code(),
                Status::Code::kResourceExhausted);
      EXPECT_EQ(SortedPairs(index), before);
      EXPECT_EQ(index.MemoryBytes(), memory);
    }
  }
}

TEST(KeyIndexTest, ImportOfManyKeysMatchesModelAndReusesHolesLowestFirst) {
  // Import probes in pipelined chunks of 1,024 keys. 200,000 keys (end-homed
  // ones among them) with rows drawn from [0, 250,000): every key must be
  // found with its row, absent keys missed, and new keys take the holes
  // lowest first, then the rows past the highest.
  constexpr int64_t kCapacity = 250000;
  constexpr int64_t kKeys = 200000;
  std::mt19937_64 rng(31);
  std::vector<int64_t> keys = KeysHomedAtTheEnd(rng, 3000);
  std::unordered_map<int64_t, int64_t> model;
  for (int64_t key : keys) model[key] = 0;
  while (static_cast<int64_t>(keys.size()) < kKeys) {
    const int64_t key = static_cast<int64_t>(rng());
    if (model.try_emplace(key, 0).second) keys.push_back(key);
  }
  std::shuffle(keys.begin(), keys.end(), rng);
  std::vector<int64_t> all_rows(kCapacity);
  std::iota(all_rows.begin(), all_rows.end(), 0);
  std::shuffle(all_rows.begin(), all_rows.end(), rng);
  std::vector<int64_t> rows(all_rows.begin(), all_rows.begin() + kKeys);
  for (int64_t i = 0; i < kKeys; ++i) model[keys[i]] = rows[i];
  KeyIndex index(kCapacity, "t");
  ASSERT_TRUE(index.Import(keys.data(), rows.data(), kKeys).ok());
  EXPECT_EQ(index.size(), kKeys);
  // Slots at load 2/3, plus the free list of the 50,000 holes (8 B each, as
  // std::vector grows it).
  EXPECT_GE(index.MemoryBytes(), 16 * (kKeys + kKeys / 2) + 8 * (kCapacity - kKeys));
  EXPECT_LE(index.MemoryBytes(), 16 * (kKeys + kKeys / 2) + 16 * (kCapacity - kKeys));
  std::vector<int64_t> found(kKeys);
  index.Find(keys.data(), kKeys, found.data());
  EXPECT_EQ(found, rows);
  std::vector<int64_t> fresh(kCapacity - kKeys);
  for (int64_t& key : fresh) {
    do {
      key = static_cast<int64_t>(rng());
    } while (model.count(key));
    model[key] = -1;
  }
  std::vector<int64_t> got(fresh.size());
  index.Find(fresh.data(), fresh.size(), got.data());
  EXPECT_EQ(got, std::vector<int64_t>(fresh.size(), kMissingRow));
  // The rows not imported, ascending: the new keys' rows, in order.
  std::vector<int64_t> unused(all_rows.begin() + kKeys, all_rows.end());
  std::sort(unused.begin(), unused.end());
  ASSERT_TRUE(index.FindOrInsert(fresh.data(), fresh.size(), got.data()).ok());
  EXPECT_EQ(got, unused);
}

TEST(KeyIndexTest, InsertKeepsRowsAndHandsOutLowestFirst) {
  KeyIndex index(4, "t");
  const std::vector<int64_t> keys = {10, 20, 10, 30};
  std::vector<int64_t> rows(keys.size());
  ASSERT_TRUE(index.FindOrInsert(keys.data(), keys.size(), rows.data()).ok());
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 1, 0, 2}));
  EXPECT_EQ(index.size(), 3);

  const std::vector<int64_t> again = {30, 40, 20};
  std::vector<int64_t> rows2(again.size());
  ASSERT_TRUE(index.FindOrInsert(again.data(), again.size(), rows2.data()).ok());
  EXPECT_EQ(rows2, (std::vector<int64_t>{2, 3, 1}));
  EXPECT_EQ(index.size(), 4);
  EXPECT_EQ(SortedPairs(index),
            (std::vector<std::pair<int64_t, int64_t>>{{10, 0}, {20, 1}, {30, 2}, {40, 3}}));
}

TEST(KeyIndexTest, FindNeverInserts) {
  KeyIndex index(8, "t");
  const std::vector<int64_t> seen = {5};
  std::vector<int64_t> row(1);
  ASSERT_TRUE(index.FindOrInsert(seen.data(), 1, row.data()).ok());
  const std::vector<int64_t> keys = {5, 6, 5};
  std::vector<int64_t> rows(3);
  index.Find(keys.data(), keys.size(), rows.data());
  EXPECT_EQ(rows, (std::vector<int64_t>{0, kMissingRow, 0}));
  EXPECT_EQ(index.size(), 1);
}

TEST(KeyIndexTest, FullTableFailsWholeBatchNamingTable) {
  KeyIndex index(3, "user_table");
  const std::vector<int64_t> first = {1, 2};
  std::vector<int64_t> rows(2);
  ASSERT_TRUE(index.FindOrInsert(first.data(), 2, rows.data()).ok());
  // Two new keys (3 repeated) but room for one: nothing may be inserted.
  const std::vector<int64_t> batch = {3, 1, 3, 4};
  std::vector<int64_t> rows2(batch.size());
  Status status = index.FindOrInsert(batch.data(), batch.size(), rows2.data());
  EXPECT_EQ(status.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(status.message().find("user_table"), std::string::npos);
  EXPECT_NE(status.message().find("device_vocabulary_size=3"), std::string::npos);
  EXPECT_EQ(index.size(), 2);
  // A repeated new key counts once: exactly one new key fits.
  const std::vector<int64_t> fits = {3, 3, 2};
  ASSERT_TRUE(index.FindOrInsert(fits.data(), fits.size(), rows2.data()).ok());
  EXPECT_EQ(index.size(), 3);
}

TEST(KeyIndexTest, BatchFailingPastTheFirstInsertsUndoesThemAndKeepsHoles) {
  // 40 rows; rows 1 and 3 are holes (free list). The array of 16 slots takes 12
  // keys before growing, so a batch of 60 new keys is first inserted in part,
  // then fails: the inserted keys go, the holes and the next row come back.
  KeyIndex index(40, "t");
  const std::vector<int64_t> keys = {100, 102, 104};
  const std::vector<int64_t> rows = {0, 2, 4};
  ASSERT_TRUE(index.Import(keys.data(), rows.data(), 3).ok());
  std::vector<int64_t> batch;
  for (int64_t k = 0; k < 60; ++k) batch.push_back(1000 + k);
  std::vector<int64_t> out(batch.size());
  Status status = index.FindOrInsert(batch.data(), batch.size(), out.data());
  EXPECT_EQ(status.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(status.message().find("3 used, and this batch brings 60 new keys"), std::string::npos)
      << status.message();
  EXPECT_EQ(index.size(), 3);
  std::vector<int64_t> found(batch.size());
  index.Find(batch.data(), batch.size(), found.data());
  EXPECT_EQ(found, std::vector<int64_t>(batch.size(), kMissingRow));
  // 37 new keys fit exactly: holes first (1, 3), then rows 5..39, in order.
  batch.resize(37);
  out.resize(37);
  ASSERT_TRUE(index.FindOrInsert(batch.data(), batch.size(), out.data()).ok());
  EXPECT_EQ(out[0], 1);
  EXPECT_EQ(out[1], 3);
  for (int64_t i = 2; i < 37; ++i) EXPECT_EQ(out[i], i + 3);
  index.Find(keys.data(), 3, found.data());
  EXPECT_EQ(std::vector<int64_t>(found.begin(), found.begin() + 3), rows);
}

TEST(KeyIndexTest, FullMessageUsesTheGivenRowsAndRemedy) {
  // A tiered table: its rows are device + host + SSD, the remedy is a tier.
  KeyIndex index(2, "item", false, "2 rows in all (device 1 + host 1)", "Raise host rows");
  const std::vector<int64_t> keys = {1, 2, 3};
  std::vector<int64_t> rows(3);
  Status status = index.FindOrInsert(keys.data(), 3, rows.data());
  EXPECT_EQ(status.message(),
            "table 'item' is full: 2 rows in all (device 1 + host 1), 0 used, and this batch "
            "brings 3 new keys. Nothing was inserted. Raise host rows (or drop rare keys before "
            "the lookup).");
  const std::vector<int64_t> counts = {1, 1, 1};
  status = index.FindOrInsertAdmitting(keys.data(), counts.data(), 3, 1, 5, rows.data());
  EXPECT_EQ(status.message(),
            "table 'item' is full: 2 rows in all (device 1 + host 1), 0 used, and this batch "
            "admits 3 new keys. Nothing was inserted. Raise host rows, raise access_threshold, "
            "or evict idle keys more often.");
  KeyIndex flat(2, "flat");
  status = flat.FindOrInsert(keys.data(), 3, rows.data());
  EXPECT_EQ(status.message(),
            "table 'flat' is full: device_vocabulary_size=2 rows, 0 used, and this batch brings "
            "3 new keys. Nothing was inserted. Create the table with a larger "
            "device_vocabulary_size (or drop rare keys before the lookup).");
}

TEST(KeyIndexTest, ExportImportRoundTripAndHolesReused) {
  KeyIndex index(6, "t");
  const std::vector<int64_t> keys = {100, 200, 300};
  const std::vector<int64_t> rows = {4, 0, 2};
  ASSERT_TRUE(index.Import(keys.data(), rows.data(), keys.size()).ok());
  EXPECT_EQ(SortedPairs(index),
            (std::vector<std::pair<int64_t, int64_t>>{{100, 4}, {200, 0}, {300, 2}}));
  // Holes below the highest row come first, lowest first, then fresh rows.
  const std::vector<int64_t> fresh = {7, 8, 9};
  std::vector<int64_t> got(3);
  ASSERT_TRUE(index.FindOrInsert(fresh.data(), 3, got.data()).ok());
  EXPECT_EQ(got, (std::vector<int64_t>{1, 3, 5}));
}

TEST(KeyIndexTest, ImportRejectsBadInputAndKeepsContent) {
  KeyIndex index(4, "t");
  const std::vector<int64_t> seen = {1};
  std::vector<int64_t> row(1);
  ASSERT_TRUE(index.FindOrInsert(seen.data(), 1, row.data()).ok());
  const std::vector<int64_t> keys = {1, 2};
  const std::vector<int64_t> out_of_range = {0, 4};
  EXPECT_EQ(index.Import(keys.data(), out_of_range.data(), 2).code(),
            Status::Code::kInvalidArgument);
  const std::vector<int64_t> same_row = {1, 1};
  EXPECT_EQ(index.Import(keys.data(), same_row.data(), 2).code(),
            Status::Code::kInvalidArgument);
  const std::vector<int64_t> dup_keys = {5, 5};
  const std::vector<int64_t> rows = {0, 1};
  EXPECT_EQ(index.Import(dup_keys.data(), rows.data(), 2).code(),
            Status::Code::kInvalidArgument);
  EXPECT_EQ(SortedPairs(index), (std::vector<std::pair<int64_t, int64_t>>{{1, 0}}));
}

TEST(KeyIndexTest, ClearEmptiesAndRestartsRows) {
  KeyIndex index(2, "t");
  const std::vector<int64_t> keys = {9, 8};
  std::vector<int64_t> rows(2);
  ASSERT_TRUE(index.FindOrInsert(keys.data(), 2, rows.data()).ok());
  index.Clear();
  EXPECT_EQ(index.size(), 0);
  ASSERT_TRUE(index.FindOrInsert(keys.data() + 1, 1, rows.data()).ok());
  EXPECT_EQ(rows[0], 0);
}

// Memory sized by use (issue #16): the slot array costs at most 24 B per
// stored key at every fill level of a large table, whatever the capacity.
TEST(KeyIndexMemoryTest, AtMost24BytesPerKeyAtAnyFillAndEveryKeyFindable) {
  for (bool growable : {false, true}) {
    SCOPED_TRACE(growable);
    constexpr int64_t kCapacity = 200000;
    KeyIndex index(kCapacity, "t", growable);
    EXPECT_EQ(index.MemoryBytes(), 16 * static_cast<int64_t>(KeyIndex::kMinSlots));
    std::mt19937_64 rng(7);
    std::vector<int64_t> inserted;
    int64_t next_row = 0;
    while (next_row < kCapacity) {
      // Batches of distinct keys (as the insert op passes them) of varied
      // size, so growth happens mid-run; every other batch also repeats one
      // known key.
      const int64_t batch = std::min<int64_t>(1 + rng() % 5000, kCapacity - next_row);
      std::vector<int64_t> keys(batch);
      for (int64_t& key : keys) key = static_cast<int64_t>(rng());
      const bool known = next_row > 0 && batch % 2 == 0;
      if (known) keys.push_back(inserted.front());
      std::vector<int64_t> rows(keys.size());
      ASSERT_TRUE(index.FindOrInsert(keys.data(), keys.size(), rows.data()).ok());
      for (int64_t i = 0; i < batch; ++i) EXPECT_EQ(rows[i], next_row + i);
      if (known) {
        EXPECT_EQ(rows.back(), 0);
      }
      next_row += batch;
      inserted.insert(inserted.end(), keys.begin(), keys.begin() + batch);
      ASSERT_EQ(index.size(), next_row);
      if (next_row >= 1000) {
        const double per_key = static_cast<double>(index.MemoryBytes()) / next_row;
        EXPECT_LE(per_key, 24.0) << next_row << " keys";
        EXPECT_GE(per_key, 20.0) << next_row << " keys";  // Load factor <= 0.8.
      }
    }
    std::vector<int64_t> rows(inserted.size());
    index.Find(inserted.data(), inserted.size(), rows.data());
    for (size_t i = 0; i < rows.size(); ++i) ASSERT_EQ(rows[i], static_cast<int64_t>(i));
    if (!growable) {
      // Full: 1.25 slots per row of capacity, and the table still says full.
      EXPECT_EQ(index.MemoryBytes(), 16 * (kCapacity + kCapacity / 4));
      const int64_t extra = -1;
      int64_t row;
      EXPECT_FALSE(index.FindOrInsert(&extra, 1, &row).ok());
    }
  }
}

TEST(KeyIndexMemoryTest, ImportClearAndEvictionShrinkTheSlotArray) {
  KeyIndex index(1000000, "t");
  std::vector<int64_t> keys(30000), rows(30000);
  std::iota(keys.begin(), keys.end(), 100);
  ASSERT_TRUE(index.FindOrInsert(keys.data(), keys.size(), rows.data()).ok());
  const int64_t full = index.MemoryBytes();
  // Import sizes the array for what it imports (load 2/3: 24 B per key).
  ASSERT_TRUE(index.Import(keys.data(), rows.data(), 3000).ok());
  EXPECT_EQ(index.MemoryBytes(), 16 * 4500);
  index.Find(keys.data(), keys.size(), rows.data());
  for (int64_t i = 0; i < 30000; ++i) ASSERT_EQ(rows[i], i < 3000 ? i : kMissingRow);
  index.Clear();
  EXPECT_EQ(index.MemoryBytes(), 16 * static_cast<int64_t>(KeyIndex::kMinSlots));
  // Eviction: 10% of the keys stay, the array shrinks to load 0.75.
  std::vector<int64_t> counts(keys.size(), 1);
  ASSERT_TRUE(
      index.FindOrInsertAdmitting(keys.data(), counts.data(), keys.size(), 1, 10, rows.data())
          .ok());
  EXPECT_GT(index.MemoryBytes(), full);  // Plus 8 B per row of last-seen times.
  ASSERT_TRUE(
      index.FindOrInsertAdmitting(keys.data(), counts.data(), 3000, 1, 100, rows.data()).ok());
  const int64_t before = index.MemoryBytes();
  std::vector<int64_t> freed;
  index.Evict(50, &freed);
  EXPECT_EQ(freed.size(), 27000u);
  EXPECT_EQ(index.size(), 3000);
  const std::vector<int64_t> stale = {keys[3000], keys[29999]};
  std::vector<int64_t> found(2);
  index.Find(stale.data(), 2, found.data());
  EXPECT_EQ(found, std::vector<int64_t>(2, kMissingRow));
  index.Find(keys.data(), 3000, rows.data());
  for (int64_t i = 0; i < 3000; ++i) ASSERT_EQ(rows[i], i);
  // Slots: 45,000 (720,000 B) -> 4,000 (load 0.75, 64,000 B); the free list
  // (27,000 rows, at most 32,768 allocated) comes on top.
  EXPECT_GE(before - index.MemoryBytes(), 720000 - 64000 - 8 * 32768);
}

TEST(KeyIndexTest, ConcurrentOverlappingInsertsGiveEachKeyOneRow) {
  constexpr int kThreads = 8;
  constexpr int64_t kKeys = 20000;
  KeyIndex index(kKeys, "t");
  std::barrier start(kThreads);
  std::vector<std::map<int64_t, int64_t>> seen(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937_64 rng(t);
      std::vector<int64_t> keys(kKeys);
      std::iota(keys.begin(), keys.end(), -kKeys / 2);
      std::shuffle(keys.begin(), keys.end(), rng);
      start.arrive_and_wait();
      for (int64_t begin = 0; begin < kKeys; begin += 500) {
        std::vector<int64_t> rows(500);
        ASSERT_TRUE(index.FindOrInsert(keys.data() + begin, 500, rows.data()).ok());
        for (int i = 0; i < 500; ++i) seen[t][keys[begin + i]] = rows[i];
      }
    });
  }
  for (auto& thread : threads) thread.join();
  ASSERT_EQ(index.size(), kKeys);
  // Every thread saw the same row for every key, and rows are a permutation.
  for (int t = 1; t < kThreads; ++t) ASSERT_EQ(seen[t], seen[0]);
  std::set<int64_t> rows;
  for (const auto& [key, row] : seen[0]) rows.insert(row);
  EXPECT_EQ(rows.size(), static_cast<size_t>(kKeys));
  EXPECT_EQ(*rows.begin(), 0);
  EXPECT_EQ(*rows.rbegin(), kKeys - 1);
}

TEST(KeyIndexTest, ConcurrentReadersDuringWrites) {
  KeyIndex index(10000, "t");
  std::vector<int64_t> keys(10000);
  std::iota(keys.begin(), keys.end(), 0);
  std::barrier start(3);
  std::thread writer([&] {
    start.arrive_and_wait();
    std::vector<int64_t> rows(100);
    for (int64_t begin = 0; begin < 10000; begin += 100) {
      ASSERT_TRUE(index.FindOrInsert(keys.data() + begin, 100, rows.data()).ok());
    }
  });
  auto reader = [&] {
    start.arrive_and_wait();
    std::vector<int64_t> rows(keys.size());
    for (int round = 0; round < 20; ++round) {
      index.Find(keys.data(), keys.size(), rows.data());
      // Keys are inserted in order with rows 0.., so a found key has row == key.
      for (size_t i = 0; i < rows.size(); ++i) {
        ASSERT_TRUE(rows[i] == kMissingRow || rows[i] == keys[i]);
      }
    }
  };
  std::thread r1(reader), r2(reader);
  writer.join();
  r1.join();
  r2.join();
  EXPECT_EQ(index.size(), 10000);
}

// Admission and eviction ------------------------------------------------------

std::vector<int64_t> Ones(size_t n) { return std::vector<int64_t>(n, 1); }

TEST(AdmissionTest, KeyGetsRowOnceCountReachesThreshold) {
  KeyIndex index(4, "t");
  std::vector<int64_t> keys = {7, 8};
  std::vector<int64_t> counts = {2, 1};
  std::vector<int64_t> rows(2);
  // Threshold 3: key 7 has 2, key 8 has 1.
  ASSERT_TRUE(index.FindOrInsertAdmitting(keys.data(), counts.data(), 2, 3, 10, rows.data()).ok());
  EXPECT_EQ(rows, (std::vector<int64_t>{kMissingRow, kMissingRow}));
  EXPECT_EQ(index.stats().pending, 2);
  // One more sighting each: 7 reaches 3, 8 has 2.
  ASSERT_TRUE(index.FindOrInsertAdmitting(keys.data(), Ones(2).data(), 2, 3, 11, rows.data()).ok());
  EXPECT_EQ(rows, (std::vector<int64_t>{0, kMissingRow}));
  ASSERT_TRUE(index.FindOrInsertAdmitting(keys.data(), Ones(2).data(), 2, 3, 12, rows.data()).ok());
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 1}));
  const KeyIndex::Stats stats = index.stats();
  EXPECT_EQ(stats.size, 2);
  EXPECT_EQ(stats.capacity, 4);
  EXPECT_EQ(stats.admissions, 2);
  EXPECT_EQ(stats.pending, 0);
  EXPECT_EQ(stats.evictions, 0);
}

TEST(AdmissionTest, FullTableAdmitsNothing) {
  KeyIndex index(1, "tiny");
  std::vector<int64_t> keys = {1, 2};
  std::vector<int64_t> rows(2);
  Status status = index.FindOrInsertAdmitting(keys.data(), Ones(2).data(), 2, 1, 0, rows.data());
  EXPECT_EQ(status.code(), Status::Code::kResourceExhausted);
  EXPECT_NE(status.message().find("'tiny'"), std::string::npos);
  EXPECT_EQ(index.stats().size, 0);
  EXPECT_EQ(index.stats().pending, 0);
}

TEST(EvictionTest, IdleKeysAreRemovedAndRowsReusedLowestFirst) {
  KeyIndex index(8, "t");
  std::vector<int64_t> keys = {10, 11, 12, 13};
  std::vector<int64_t> rows(4);
  ASSERT_TRUE(index.FindOrInsertAdmitting(keys.data(), Ones(4).data(), 4,
                                          1, 100, rows.data()).ok());
  // Keys 11 and 13 are seen again at t=150; now = 150.
  std::vector<int64_t> again = {11, 13};
  ASSERT_TRUE(index.FindOrInsertAdmitting(again.data(), Ones(2).data(), 2,
                                          1, 150, rows.data()).ok());
  std::vector<int64_t> freed;
  index.Evict(50, &freed);  // idle 50 is not more than 50: nothing goes.
  EXPECT_TRUE(freed.empty());
  index.Evict(49, &freed);
  EXPECT_EQ(freed, (std::vector<int64_t>{0, 2}));
  EXPECT_EQ(SortedPairs(index), (std::vector<std::pair<int64_t, int64_t>>{{11, 1}, {13, 3}}));
  EXPECT_EQ(index.stats().evictions, 2);
  std::vector<int64_t> fresh = {20, 21, 22};
  ASSERT_TRUE(index.FindOrInsertAdmitting(fresh.data(), Ones(3).data(), 3,
                                          1, 151, rows.data()).ok());
  EXPECT_EQ(std::vector<int64_t>(rows.begin(), rows.begin() + 3), (std::vector<int64_t>{0, 2, 4}));
}

// Rows Find gives each of `queries` (hits, misses, repeats) in batches of
// every length around the prefetch distance (16), against `model`.
void ExpectFindMatches(const KeyIndex& index, const std::unordered_map<int64_t, int64_t>& model,
                       const std::vector<int64_t>& queries) {
  for (size_t length : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{17}, size_t{31},
                        size_t{32}, size_t{33}, queries.size()}) {
    SCOPED_TRACE(length);
    ASSERT_LE(length, queries.size());
    std::vector<int64_t> rows(length, -7);
    index.Find(queries.data(), static_cast<int64_t>(length), rows.data());
    for (size_t i = 0; i < length; ++i) {
      auto it = model.find(queries[i]);
      ASSERT_EQ(rows[i], it == model.end() ? kMissingRow : it->second)
          << "key " << queries[i] << " at " << i;
    }
  }
}

TEST(EvictionTest, PipelinedFindMatchesModelThroughGrowthAndErasures) {
  // Find computes every home slot first, then probes prefetching 16 keys ahead.
  // Its rows must equal a std::unordered_map's for present keys, absent keys
  // (never seen, and evicted) and repeats, as the array grows from 16 slots
  // and after backward-shift erasures (and the shrinking rehash after them).
  KeyIndex index(64, "t", /*growable=*/true);
  std::unordered_map<int64_t, int64_t> model;
  std::mt19937_64 rng(5);
  std::vector<int64_t> stored;
  auto queries = [&]() {
    std::vector<int64_t> q;
    for (int i = 0; i < 2000; ++i) {
      const uint64_t pick = rng() % 3;
      if (pick == 0 && !stored.empty()) {
        q.push_back(stored[rng() % stored.size()]);  // Present, or evicted.
      } else if (pick == 1 && !q.empty()) {
        q.push_back(q[rng() % q.size()]);  // Repeated.
      } else {
        q.push_back(static_cast<int64_t>(rng()));  // Never inserted.
      }
    }
    return q;
  };
  int64_t time = 0;
  for (int64_t count : {10, 90, 2900, 17000}) {
    std::vector<int64_t> keys(count), rows(count);
    for (int64_t& key : keys) key = static_cast<int64_t>(rng());
    ++time;
    ASSERT_TRUE(index.FindOrInsertAdmitting(keys.data(), Ones(count).data(), count, 1, time,
                                            rows.data()).ok());
    for (int64_t i = 0; i < count; ++i) {
      ASSERT_GE(rows[i], 0);
      model[keys[i]] = rows[i];
      stored.push_back(keys[i]);
    }
    ExpectFindMatches(index, model, queries());
  }
  // Keys seen last at time 4 (the 17000) stay; the first 3000 are evicted.
  std::vector<int64_t> freed;
  index.Evict(0, &freed);
  ASSERT_EQ(freed.size(), 3000u);
  for (size_t i = 0; i < 3000; ++i) model.erase(stored[i]);
  ASSERT_EQ(index.size(), 17000);
  ExpectFindMatches(index, model, queries());
  // Half the rest evicted in turn: erasures in a fuller array.
  std::vector<int64_t> again(stored.begin() + 3000, stored.begin() + 11500), rows(8500);
  ASSERT_TRUE(index.FindOrInsertAdmitting(again.data(), Ones(8500).data(), 8500, 1, time + 1,
                                          rows.data()).ok());
  index.Evict(0, &freed);
  for (size_t i = 11500; i < stored.size(); ++i) model.erase(stored[i]);
  ASSERT_EQ(index.size(), 8500);
  ExpectFindMatches(index, model, queries());
}

TEST(AdmissionTest, PipelinedFirstPassMatchesModelAcrossManyKeys) {
  // FindOrInsertAdmitting's first pass is pipelined like Find: over batches of
  // 100 distinct keys (counts 0-2, threshold 3), rows and pending counts must
  // equal a model's: a key is admitted once its summed count reaches 3, taking
  // the next row in order of appearance.
  KeyIndex index(10000, "t");
  std::unordered_map<int64_t, int64_t> rows_of, pending;
  std::mt19937_64 rng(9);
  int64_t next_row = 0;
  for (int batch_number = 0; batch_number < 6; ++batch_number) {
    std::vector<int64_t> keys(100), counts(100), rows(100);
    for (int64_t i = 0; i < 100; ++i) {
      keys[i] = static_cast<int64_t>(rng() % 300);
      counts[i] = static_cast<int64_t>(rng() % 3);
    }
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::shuffle(keys.begin(), keys.end(), rng);
    const int64_t n = static_cast<int64_t>(keys.size());
    std::vector<int64_t> want(n);
    for (int64_t i = 0; i < n; ++i) {
      auto it = rows_of.find(keys[i]);
      if (it != rows_of.end()) {
        want[i] = it->second;
      } else if ((pending[keys[i]] += counts[i]) >= 3) {
        pending.erase(keys[i]);
        want[i] = rows_of[keys[i]] = next_row++;
      } else {
        want[i] = kMissingRow;
      }
    }
    ASSERT_TRUE(
        index.FindOrInsertAdmitting(keys.data(), counts.data(), n, 3, batch_number, rows.data())
            .ok());
    rows.resize(n);
    ASSERT_EQ(rows, want) << "batch " << batch_number;
    EXPECT_EQ(index.stats().pending, static_cast<int64_t>(pending.size()));
  }
  EXPECT_GT(next_row, 16);
}

TEST(EvictionTest, PendingKeysExpireToo) {
  KeyIndex index(8, "t");
  std::vector<int64_t> key = {5}, other = {6};
  std::vector<int64_t> row(1);
  ASSERT_TRUE(index.FindOrInsertAdmitting(key.data(), Ones(1).data(), 1, 2, 0, row.data()).ok());
  ASSERT_TRUE(index.FindOrInsertAdmitting(other.data(), Ones(1).data(), 1,
                                          2, 100, row.data()).ok());
  std::vector<int64_t> freed;
  index.Evict(10, &freed);
  EXPECT_TRUE(freed.empty());
  EXPECT_EQ(index.stats().pending, 1);  // 5 expired, 6 stays
  // Key 5 starts counting again.
  ASSERT_TRUE(index.FindOrInsertAdmitting(key.data(), Ones(1).data(), 1, 2, 101, row.data()).ok());
  EXPECT_EQ(row[0], kMissingRow);
}

TEST(EvictionTest, DeletionKeepsEveryRemainingKeyFindable) {
  // A small table at load factor 0.5 has long probe runs: random deletions
  // exercise the backward shift, including runs that wrap around.
  std::mt19937_64 rng(7);
  for (int round = 0; round < 20; ++round) {
    KeyIndex index(64, "t");
    std::vector<int64_t> keys(64);
    for (auto& k : keys) k = static_cast<int64_t>(rng());
    std::sort(keys.begin(), keys.end());
    keys.erase(std::unique(keys.begin(), keys.end()), keys.end());
    std::vector<int64_t> rows(keys.size());
    std::vector<int64_t> counts = Ones(keys.size());
    ASSERT_TRUE(index.FindOrInsertAdmitting(keys.data(), counts.data(), keys.size(), 1, 0,
                                            rows.data()).ok());
    std::map<int64_t, int64_t> expected;
    for (size_t i = 0; i < keys.size(); ++i) expected[keys[i]] = rows[i];
    // Refresh a random half at t=10; evicting with idle 5 removes the rest.
    std::vector<int64_t> kept;
    for (int64_t k : keys) {
      if (rng() % 2) kept.push_back(k);
    }
    std::vector<int64_t> kept_rows(kept.size());
    ASSERT_TRUE(index.FindOrInsertAdmitting(kept.data(), Ones(kept.size()).data(), kept.size(), 1,
                                            10, kept_rows.data()).ok());
    std::vector<int64_t> freed;
    index.Evict(5, &freed);
    ASSERT_EQ(freed.size(), keys.size() - kept.size());
    ASSERT_EQ(index.size(), static_cast<int64_t>(kept.size()));
    std::vector<int64_t> found(keys.size());
    index.Find(keys.data(), keys.size(), found.data());
    std::set<int64_t> kept_set(kept.begin(), kept.end());
    for (size_t i = 0; i < keys.size(); ++i) {
      ASSERT_EQ(found[i], kept_set.count(keys[i]) ? expected[keys[i]] : kMissingRow) << keys[i];
    }
  }
}

TEST(EvictionTest, ConcurrentFindDuringEvictions) {
  // Keys 0..999 stay (refreshed every round); keys 1000.. are inserted and evicted
  // over and over while readers look the stable keys up.
  KeyIndex index(4096, "t");
  std::vector<int64_t> stable(1000);
  std::iota(stable.begin(), stable.end(), 0);
  std::vector<int64_t> stable_rows(stable.size());
  ASSERT_TRUE(index.FindOrInsertAdmitting(stable.data(), Ones(1000).data(), 1000, 1, 0,
                                          stable_rows.data()).ok());
  std::barrier start(3);
  std::atomic<bool> done{false};
  std::thread writer([&] {
    start.arrive_and_wait();
    std::vector<int64_t> churn(1000), rows(1000), freed;
    for (int round = 1; round <= 50; ++round) {
      std::iota(churn.begin(), churn.end(), 1000 * round);
      ASSERT_TRUE(index.FindOrInsertAdmitting(churn.data(), Ones(1000).data(), 1000, 1, 2 * round,
                                              rows.data()).ok());
      ASSERT_TRUE(index.FindOrInsertAdmitting(stable.data(), Ones(1000).data(), 1000, 1,
                                              2 * round + 1, rows.data()).ok());
      index.Evict(0, &freed);  // Only the churn keys (seen one tick ago) go.
    }
    done = true;
  });
  auto reader = [&] {
    start.arrive_and_wait();
    std::vector<int64_t> rows(stable.size());
    while (!done) {
      index.Find(stable.data(), stable.size(), rows.data());
      ASSERT_EQ(rows, stable_rows);
    }
  };
  std::thread r1(reader), r2(reader);
  writer.join();
  r1.join();
  r2.join();
  EXPECT_EQ(index.size(), 1000);
  EXPECT_EQ(index.stats().evictions, 50 * 1000);
}

TEST(AdmissionTest, StateRoundTrip) {
  KeyIndex index(8, "t");
  std::vector<int64_t> keys = {1, 2, 3};
  std::vector<int64_t> counts = {3, 1, 2};
  std::vector<int64_t> rows(3);
  ASSERT_TRUE(index.FindOrInsertAdmitting(keys.data(), counts.data(), 3, 2, 42, rows.data()).ok());
  KeyIndex::State state;
  index.ExportState(&state);
  KeyIndex copy(8, "t");
  ASSERT_TRUE(copy.ImportState(state).ok());
  EXPECT_EQ(SortedPairs(copy), SortedPairs(index));
  EXPECT_EQ(copy.stats().pending, 1);
  EXPECT_EQ(copy.stats().admissions, 2);
  // Key 2 needs one more sighting in the copy too.
  std::vector<int64_t> two = {2};
  ASSERT_TRUE(copy.FindOrInsertAdmitting(two.data(), Ones(1).data(), 1, 2, 43, rows.data()).ok());
  EXPECT_EQ(rows[0], 2);
  state.counters.pop_back();
  EXPECT_EQ(copy.ImportState(state).code(), Status::Code::kInvalidArgument);
}

TEST(AdmissionTest, RepeatedKeyReachingThresholdGetsOneRow) {
  KeyIndex index(1, "t");
  std::vector<int64_t> keys = {5, 5};
  std::vector<int64_t> rows(2);
  ASSERT_TRUE(index.FindOrInsertAdmitting(keys.data(), Ones(2).data(), 2, 1, 0, rows.data()).ok());
  EXPECT_EQ(rows, (std::vector<int64_t>{0, 0}));
  const KeyIndex::Stats stats = index.stats();
  EXPECT_EQ(stats.size, 1);
  EXPECT_EQ(stats.admissions, 1);
  EXPECT_EQ(stats.pending, 0);
  EXPECT_EQ(SortedPairs(index), (std::vector<std::pair<int64_t, int64_t>>{{5, 0}}));
  // The next new key takes row 1: row 1 was not leaked to the repeat.
  KeyIndex wide(4, "t");
  ASSERT_TRUE(wide.FindOrInsertAdmitting(keys.data(), Ones(2).data(), 2, 1, 0, rows.data()).ok());
  std::vector<int64_t> six = {6};
  ASSERT_TRUE(wide.FindOrInsertAdmitting(six.data(), Ones(1).data(), 1, 1, 0, rows.data()).ok());
  EXPECT_EQ(rows[0], 1);
}

TEST(AdmissionTest, ImportStateRejectsBadPendingKeysAndKeepsContent) {
  KeyIndex index(8, "admit_t");
  std::vector<int64_t> keys = {1, 2};
  std::vector<int64_t> counts = {2, 1};
  std::vector<int64_t> rows(2);
  ASSERT_TRUE(index.FindOrInsertAdmitting(keys.data(), counts.data(), 2, 2, 7, rows.data()).ok());
  KeyIndex::State state;
  index.ExportState(&state);
  ASSERT_EQ(state.pending_keys, (std::vector<int64_t>{2}));

  KeyIndex::State negative = state;
  negative.pending_counts[0] = -1;
  Status status = index.ImportState(negative);
  EXPECT_EQ(status.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(status.message().find("'admit_t'"), std::string::npos);

  KeyIndex::State both = state;
  both.pending_keys[0] = 1;  // admitted too
  status = index.ImportState(both);
  EXPECT_EQ(status.code(), Status::Code::kInvalidArgument);
  EXPECT_NE(status.message().find("'admit_t'"), std::string::npos);

  EXPECT_EQ(SortedPairs(index), (std::vector<std::pair<int64_t, int64_t>>{{1, 0}}));
  EXPECT_EQ(index.stats().pending, 1);
}

// -- change tracking (delta checkpoints) -------------------------------------

std::vector<std::pair<int64_t, int64_t>> ChangedPairs(const KeyIndex::Changes& changes) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (size_t i = 0; i < changes.changed.keys.size(); ++i) {
    out.emplace_back(changes.changed.keys[i], changes.changed.rows[i]);
  }
  std::sort(out.begin(), out.end());
  return out;
}

TEST(ChangeTrackingTest, OffUntilTheFirstClearThenOnlyTrainedRowsAndEvictedKeys) {
  KeyIndex index(8, "delta_t");
  std::vector<int64_t> keys = {10, 11, 12};
  std::vector<int64_t> rows(3);
  ASSERT_TRUE(index.FindOrInsert(keys.data(), 3, rows.data()).ok());
  EXPECT_FALSE(index.tracking_changes());
  KeyIndex::Changes changes;
  index.ExportChanges(/*clear=*/true, &changes);  // Before tracking: everything.
  EXPECT_EQ(ChangedPairs(changes), (std::vector<std::pair<int64_t, int64_t>>{
                                       {10, 0}, {11, 1}, {12, 2}}));
  EXPECT_TRUE(index.tracking_changes());
  index.ExportChanges(false, &changes);
  EXPECT_TRUE(changes.changed.keys.empty() && changes.deleted.empty());

  std::vector<int64_t> batch = {12, 13};  // One present, one new key.
  ASSERT_TRUE(index.FindOrInsert(batch.data(), 2, rows.data()).ok());
  std::vector<int64_t> found(1);
  index.Find(keys.data(), 1, found.data());  // Evaluation: no change.
  index.ExportChanges(false, &changes);      // A peek: marks kept.
  EXPECT_EQ(ChangedPairs(changes), (std::vector<std::pair<int64_t, int64_t>>{{12, 2}, {13, 3}}));
  index.ExportChanges(true, &changes);
  EXPECT_EQ(ChangedPairs(changes).size(), 2u);
  index.ExportChanges(true, &changes);
  EXPECT_TRUE(changes.changed.keys.empty());
  EXPECT_EQ(changes.changed.counters.size(), 3u);
}

TEST(ChangeTrackingTest, EvictionLogsDeletedKeysAndAReusedRowIsChanged) {
  KeyIndex index(4, "delta_t");
  std::vector<int64_t> keys = {1, 2, 3};
  std::vector<int64_t> counts = {1, 1, 1};
  std::vector<int64_t> rows(3);
  ASSERT_TRUE(index.FindOrInsertAdmitting(keys.data(), counts.data(), 3, 1, 100, rows.data()).ok());
  KeyIndex::Changes changes;
  index.ExportChanges(true, &changes);
  std::vector<int64_t> later = {3, 4};  // 1 and 2 idle; 4 pending (threshold 2 below).
  ASSERT_TRUE(
      index.FindOrInsertAdmitting(later.data(), counts.data(), 2, 2, 200, rows.data()).ok());
  std::vector<int64_t> freed;
  index.Evict(50, &freed);
  EXPECT_EQ(freed, (std::vector<int64_t>{0, 1}));
  index.ExportChanges(true, &changes);
  EXPECT_EQ(ChangedPairs(changes), (std::vector<std::pair<int64_t, int64_t>>{{3, 2}}));
  EXPECT_EQ(changes.changed.last_seen, (std::vector<int64_t>{200}));
  std::vector<int64_t> deleted = changes.deleted;
  std::sort(deleted.begin(), deleted.end());
  EXPECT_EQ(deleted, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(changes.changed.pending_keys, (std::vector<int64_t>{4}));  // Pending: whole.
  EXPECT_EQ(changes.changed.counters, (std::vector<int64_t>{3, 2, 200}));

  std::vector<int64_t> again = {5};  // Takes the freed row 0.
  ASSERT_TRUE(index.FindOrInsertAdmitting(again.data(), counts.data(), 1, 1, 210, rows.data()).ok());
  index.ExportChanges(true, &changes);
  EXPECT_EQ(ChangedPairs(changes), (std::vector<std::pair<int64_t, int64_t>>{{5, 0}}));
  EXPECT_TRUE(changes.deleted.empty());
}

TEST(ChangeTrackingTest, ImportStartsANewBaseAndMemoryCountsTheBitmap) {
  KeyIndex index(1 << 16, "delta_t");
  std::vector<int64_t> keys(1000);
  std::iota(keys.begin(), keys.end(), 0);
  std::vector<int64_t> rows(keys.size());
  KeyIndex::Changes changes;
  index.ExportChanges(true, &changes);
  const int64_t before = index.MemoryBytes();
  ASSERT_TRUE(index.FindOrInsert(keys.data(), 1000, rows.data()).ok());
  KeyIndex untracked(1 << 16, "delta_t");
  ASSERT_TRUE(untracked.FindOrInsert(keys.data(), 1000, rows.data()).ok());
  const int64_t bitmap = index.MemoryBytes() - untracked.MemoryBytes();
  EXPECT_GT(bitmap, 0);
  EXPECT_LE(bitmap, 1000 / 8 * 5 / 4 + 8);  // 1 bit per row, growth slack included.
  EXPECT_GE(index.MemoryBytes(), before);
  ASSERT_TRUE(index.Import(keys.data(), rows.data(), 1000).ok());
  EXPECT_TRUE(index.tracking_changes());
  index.ExportChanges(false, &changes);
  EXPECT_TRUE(changes.changed.keys.empty() && changes.deleted.empty());
}

TEST(ChangeTrackingTest, MinCountLeavesOutRareKeysAndCountsOccurrencesAndAdmissionCounts) {
  // mxRec's recent_key_count_threshold: a delta keeps the keys touched at least
  // min_count times since the last clear.
  KeyIndex index(16, "delta_t");
  KeyIndex::Changes changes;
  index.ExportChanges(/*clear=*/true, &changes, /*min_count=*/3);
  EXPECT_TRUE(index.counting_touches());
  std::vector<int64_t> keys = {1, 2, 3};
  std::vector<int64_t> rows(3);
  std::vector<int64_t> occurrences = {3, 1, 2};  // 3 occurred 2 times in the first batch.
  ASSERT_TRUE(index.FindOrInsert(keys.data(), 3, rows.data(), occurrences.data()).ok());
  std::vector<int64_t> again = {3};  // Once more (no occurrences: once each).
  ASSERT_TRUE(index.FindOrInsert(again.data(), 1, rows.data()).ok());
  index.ExportChanges(false, &changes, 3);  // A peek: 1 (3 times) and 3 (3 times); 2 is rare.
  EXPECT_EQ(ChangedPairs(changes), (std::vector<std::pair<int64_t, int64_t>>{{1, 0}, {3, 2}}));
  index.ExportChanges(false, &changes, 4);
  EXPECT_TRUE(changes.changed.keys.empty());
  index.ExportChanges(true, &changes, 3);  // Counts start anew: 2's single touch is forgotten.
  ASSERT_TRUE(index.FindOrInsert(keys.data() + 1, 1, rows.data()).ok());
  index.ExportChanges(false, &changes, 1);
  EXPECT_EQ(ChangedPairs(changes), (std::vector<std::pair<int64_t, int64_t>>{{2, 1}}));
  index.ExportChanges(false, &changes, 2);
  EXPECT_TRUE(changes.changed.keys.empty());

  // With admission, the sightings' counts add up.
  std::vector<int64_t> counts = {2, 5};
  std::vector<int64_t> admitted = {7, 8};
  ASSERT_TRUE(
      index.FindOrInsertAdmitting(admitted.data(), counts.data(), 2, 1, 100, rows.data()).ok());
  index.ExportChanges(false, &changes, 5);
  EXPECT_EQ(changes.changed.keys, (std::vector<int64_t>{8}));

  // A clear with min_count 0 stops counting; every changed key is exported again.
  index.ExportChanges(true, &changes, 0);
  EXPECT_FALSE(index.counting_touches());
  ASSERT_TRUE(index.FindOrInsert(keys.data(), 1, rows.data()).ok());
  index.ExportChanges(false, &changes, 0);
  EXPECT_EQ(ChangedPairs(changes), (std::vector<std::pair<int64_t, int64_t>>{{1, 0}}));
}

TEST(ChangeTrackingTest, AnEvictedRowsCountDoesNotPassToItsNextKey) {
  KeyIndex index(2, "delta_t");
  KeyIndex::Changes changes;
  index.ExportChanges(true, &changes, 2);
  std::vector<int64_t> keys = {1};
  std::vector<int64_t> counts = {5};
  std::vector<int64_t> rows(1);
  ASSERT_TRUE(index.FindOrInsertAdmitting(keys.data(), counts.data(), 1, 1, 100, rows.data()).ok());
  std::vector<int64_t> freed;
  std::vector<int64_t> other = {2};
  std::vector<int64_t> once = {1};
  ASSERT_TRUE(index.FindOrInsertAdmitting(other.data(), once.data(), 1, 1, 200, rows.data()).ok());
  index.Evict(50, &freed);  // Key 1 (row 0) idle.
  EXPECT_EQ(freed, (std::vector<int64_t>{0}));
  std::vector<int64_t> next = {3};  // Takes row 0, seen once.
  ASSERT_TRUE(index.FindOrInsertAdmitting(next.data(), once.data(), 1, 1, 210, rows.data()).ok());
  EXPECT_EQ(rows[0], 0);
  index.ExportChanges(false, &changes, 2);
  EXPECT_TRUE(changes.changed.keys.empty());
  EXPECT_EQ(changes.deleted, (std::vector<int64_t>{1}));
}

}  // namespace
}  // namespace mxrec

// Randomized property test of the key index against a plain std::map model. Run
// under ASan/UBSan by `make native-test` (target native/build/key_index_property_test).
//
// Each trial (seeded, so a failure names the seed that reproduces it) creates a
// KeyIndex of a random capacity and applies a random interleaving of operations,
// checking every result against the model:
//   plain trials:     FindOrInsert (random keys with duplicates, batch sizes
//                     0..capacity+1), Find, Export, Import (valid and invalid), Clear;
//   admission trials: FindOrInsertAdmitting (thresholds, timestamps), Find,
//                     Evict, ExportState, ImportState (round trip and invalid).
// Model rules (native/core/key_index.h): absent keys take the lowest unused rows
// in order of first appearance; a batch that does not fit changes nothing.
#include "../core/key_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace mxrec {
namespace {

constexpr int kTrials = 1000;
constexpr int kOpsPerTrial = 120;

struct Entry {
  int64_t row;
  int64_t last_seen = -1;
};

struct Pending {
  int64_t count;
  int64_t last_seen;
};

// The reference: key -> row (and last-seen time), pending keys, the latest time.
struct Model {
  int64_t capacity;
  std::map<int64_t, Entry> keys;
  std::map<int64_t, Pending> pending;
  int64_t now = -1;

  int64_t LowestUnusedRow() const {
    std::set<int64_t> used;
    for (const auto& [key, entry] : keys) used.insert(entry.row);
    int64_t row = 0;
    while (used.count(row)) ++row;
    return row;
  }
};

class Trial {
 public:
  explicit Trial(uint64_t seed)
      : rng_(seed), model_{static_cast<int64_t>(1 + rng_() % 24), {}, {}, -1},
        index_(model_.capacity, "prop") {
    // A small universe gives duplicates and re-insertions; extremes test hashing.
    const int64_t extremes[] = {0, -1, std::numeric_limits<int64_t>::min(),
                                std::numeric_limits<int64_t>::max(), int64_t{1} << 40};
    for (int64_t k : extremes) universe_.push_back(k);
    const int extra = 2 * static_cast<int>(model_.capacity) + 4;
    for (int i = 0; i < extra; ++i) universe_.push_back(static_cast<int64_t>(rng_()));
  }

  int64_t Uniform(int64_t n) { return static_cast<int64_t>(rng_() % static_cast<uint64_t>(n)); }

  std::vector<int64_t> Keys(bool distinct) {
    const int64_t n = Uniform(model_.capacity + 2);  // 0..capacity+1
    std::vector<int64_t> keys;
    std::set<int64_t> seen;
    while (static_cast<int64_t>(keys.size()) < n) {
      const int64_t key = universe_[Uniform(static_cast<int64_t>(universe_.size()))];
      if (distinct && !seen.insert(key).second) {
        if (seen.size() == universe_.size()) break;
        continue;
      }
      keys.push_back(key);
    }
    return keys;
  }

  void CheckExport() {
    std::vector<int64_t> keys, rows;
    index_.Export(&keys, &rows);
    ASSERT_EQ(keys.size(), rows.size());
    std::map<int64_t, int64_t> got;
    for (size_t i = 0; i < keys.size(); ++i) ASSERT_TRUE(got.emplace(keys[i], rows[i]).second);
    std::map<int64_t, int64_t> want;
    for (const auto& [key, entry] : model_.keys) want[key] = entry.row;
    ASSERT_EQ(got, want);
    ASSERT_EQ(index_.size(), static_cast<int64_t>(want.size()));
  }

  void Find() {
    const std::vector<int64_t> keys = Keys(false);
    std::vector<int64_t> rows(keys.size(), -7);
    index_.Find(keys.data(), static_cast<int64_t>(keys.size()), rows.data());
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = model_.keys.find(keys[i]);
      ASSERT_EQ(rows[i], it == model_.keys.end() ? kMissingRow : it->second.row) << keys[i];
    }
  }

  void FindOrInsert() {
    const std::vector<int64_t> keys = Keys(false);
    std::vector<int64_t> rows(keys.size(), -7);
    const Status status =
        index_.FindOrInsert(keys.data(), static_cast<int64_t>(keys.size()), rows.data());
    std::set<int64_t> absent;
    for (int64_t key : keys) {
      if (!model_.keys.count(key)) absent.insert(key);
    }
    if (static_cast<int64_t>(model_.keys.size() + absent.size()) > model_.capacity) {
      ASSERT_FALSE(status.ok());
      ASSERT_NE(status.message().find("table 'prop' is full"), std::string::npos);
      return;  // Nothing inserted: CheckExport after each op verifies it.
    }
    ASSERT_TRUE(status.ok()) << status.message();
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = model_.keys.find(keys[i]);
      if (it == model_.keys.end()) {
        const int64_t row = model_.LowestUnusedRow();
        it = model_.keys.emplace(keys[i], Entry{row, model_.now}).first;
      }
      ASSERT_EQ(rows[i], it->second.row) << "key " << keys[i] << " at " << i;
    }
  }

  void Import() {
    // Distinct keys with distinct rows in [0, capacity); sometimes made invalid.
    std::vector<int64_t> keys = Keys(true);
    if (static_cast<int64_t>(keys.size()) > model_.capacity) keys.resize(model_.capacity);
    std::vector<int64_t> rows(model_.capacity);
    for (int64_t r = 0; r < model_.capacity; ++r) rows[r] = r;
    std::shuffle(rows.begin(), rows.end(), rng_);
    rows.resize(keys.size());
    const int64_t flaw = keys.empty() ? 0 : Uniform(4);
    if (flaw == 1) rows[0] = model_.capacity + Uniform(3);  // Row out of range.
    if (flaw == 2 && keys.size() > 1) keys[1] = keys[0];    // Repeated key.
    if (flaw == 3 && keys.size() > 1) rows[1] = rows[0];    // Repeated row.
    const bool valid = flaw == 0 || (flaw > 1 && keys.size() < 2);
    const Status status = index_.Import(keys.data(), rows.data(), static_cast<int64_t>(keys.size()));
    ASSERT_EQ(status.ok(), valid) << status.message();
    if (!valid) return;
    model_.keys.clear();
    model_.pending.clear();
    model_.now = -1;
    for (size_t i = 0; i < keys.size(); ++i) model_.keys[keys[i]] = Entry{rows[i]};
  }

  void Admit() {
    const std::vector<int64_t> keys = Keys(true);
    std::vector<int64_t> counts(keys.size());
    for (auto& c : counts) c = Uniform(3);
    const int64_t threshold = 1 + Uniform(3);
    const int64_t timestamp = Uniform(5) == 0 ? -1 : model_.now + Uniform(4);
    std::vector<int64_t> rows(keys.size(), -7);
    const Status status = index_.FindOrInsertAdmitting(
        keys.data(), counts.data(), static_cast<int64_t>(keys.size()), threshold, timestamp,
        rows.data());
    const int64_t time = std::max(timestamp, model_.now);
    int64_t admit = 0;
    for (size_t i = 0; i < keys.size(); ++i) {
      if (model_.keys.count(keys[i])) continue;
      auto it = model_.pending.find(keys[i]);
      if ((it == model_.pending.end() ? 0 : it->second.count) + counts[i] >= threshold) ++admit;
    }
    if (static_cast<int64_t>(model_.keys.size()) + admit > model_.capacity) {
      ASSERT_FALSE(status.ok());
      return;
    }
    ASSERT_TRUE(status.ok()) << status.message();
    model_.now = std::max(model_.now, timestamp);
    for (size_t i = 0; i < keys.size(); ++i) {
      auto it = model_.keys.find(keys[i]);
      if (it == model_.keys.end()) {
        Pending& p = model_.pending.try_emplace(keys[i], Pending{0, time}).first->second;
        if (p.count + counts[i] < threshold) {
          p.count += counts[i];
          p.last_seen = time;
          ASSERT_EQ(rows[i], kMissingRow) << keys[i];
          continue;
        }
        model_.pending.erase(keys[i]);
        it = model_.keys.emplace(keys[i], Entry{model_.LowestUnusedRow()}).first;
      }
      it->second.last_seen = time;
      ASSERT_EQ(rows[i], it->second.row) << keys[i];
    }
  }

  void Evict() {
    const int64_t idle = Uniform(4);
    std::vector<int64_t> freed = {-5};  // Evict appends.
    index_.Evict(idle, &freed);
    std::vector<int64_t> want = {-5};
    if (model_.now >= 0) {
      for (auto it = model_.keys.begin(); it != model_.keys.end();) {
        if (model_.now - it->second.last_seen > idle) {
          want.push_back(it->second.row);
          it = model_.keys.erase(it);
        } else {
          ++it;
        }
      }
      std::erase_if(model_.pending,
                    [&](const auto& kv) { return model_.now - kv.second.last_seen > idle; });
    }
    std::sort(want.begin() + 1, want.end());
    ASSERT_EQ(freed, want);
  }

  void CheckState() {
    KeyIndex::State state;
    index_.ExportState(&state);
    std::map<int64_t, std::pair<int64_t, int64_t>> got, want;
    for (size_t i = 0; i < state.keys.size(); ++i) {
      got[state.keys[i]] = {state.rows[i], state.last_seen[i]};
    }
    for (const auto& [key, entry] : model_.keys) want[key] = {entry.row, entry.last_seen};
    ASSERT_EQ(got, want);
    std::map<int64_t, std::pair<int64_t, int64_t>> got_pending, want_pending;
    for (size_t i = 0; i < state.pending_keys.size(); ++i) {
      got_pending[state.pending_keys[i]] = {state.pending_counts[i], state.pending_last_seen[i]};
    }
    for (const auto& [key, p] : model_.pending) want_pending[key] = {p.count, p.last_seen};
    ASSERT_EQ(got_pending, want_pending);
    ASSERT_EQ(state.counters.at(2), model_.now);
    // Round trip into a fresh index, and an invalid state (a key both admitted and
    // pending) that must change nothing.
    KeyIndex copy(model_.capacity, "copy");
    ASSERT_TRUE(copy.ImportState(state).ok());
    KeyIndex::State again;
    copy.ExportState(&again);
    ASSERT_EQ(std::set<int64_t>(again.keys.begin(), again.keys.end()),
              std::set<int64_t>(state.keys.begin(), state.keys.end()));
    if (!state.keys.empty()) {
      KeyIndex::State bad = state;
      bad.pending_keys.push_back(state.keys[0]);
      bad.pending_counts.push_back(1);
      bad.pending_last_seen.push_back(0);
      ASSERT_FALSE(index_.ImportState(bad).ok());
    }
  }

  void Run(bool admission) {
    for (int op = 0; op < kOpsPerTrial; ++op) {
      const int64_t what = Uniform(10);
      if (admission) {
        if (what < 5) Admit();
        else if (what < 7) Find();
        else if (what < 9) Evict();
        else CheckState();
      } else {
        if (what < 5) FindOrInsert();
        else if (what < 7) Find();
        else if (what < 9) Import();
        else {
          index_.Clear();
          model_.keys.clear();
          model_.now = -1;
        }
      }
      if (testing::Test::HasFatalFailure()) return;
      CheckExport();
      if (testing::Test::HasFatalFailure()) return;
    }
  }

 private:
  std::mt19937_64 rng_;
  Model model_;
  KeyIndex index_;
  std::vector<int64_t> universe_;
};

TEST(KeyIndexPropertyTest, PlainOpsMatchTheModel) {
  for (uint64_t seed = 1; seed <= kTrials; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Trial(seed).Run(/*admission=*/false);
    if (HasFatalFailure()) return;
  }
}

TEST(KeyIndexPropertyTest, AdmissionAndEvictionMatchTheModel) {
  for (uint64_t seed = 1; seed <= kTrials; ++seed) {
    SCOPED_TRACE("seed " + std::to_string(seed));
    Trial(seed).Run(/*admission=*/true);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace mxrec

// GoogleTest unit tests of the TF-free tier store (host memory + SSD). Run under
// ASan/UBSan by `make native-test`. SSD directories are fresh temporary
// directories; a full disk is simulated with RLIMIT_FSIZE (writes past the limit
// fail with EFBIG once SIGXFSZ is ignored), set and restored around the writes.
#include "../core/tier_store.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace mxrec {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the temporary directory, removed with its content.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "tier_store_test.XXXXXX").string();
    path_ = mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    fs::permissions(path_, fs::perms::owner_all, fs::perm_options::add, ignored);
    fs::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  size_t Entries() const {
    return std::distance(fs::directory_iterator(path_), fs::directory_iterator());
  }

 private:
  std::string path_;
};

// Row of global g: g * 100 + j (+ `salt`).
std::vector<float> Rows(const std::vector<int64_t>& globals, int64_t width, float salt = 0) {
  std::vector<float> values;
  for (int64_t g : globals) {
    for (int64_t j = 0; j < width; ++j) values.push_back(g * 100.0f + j + salt);
  }
  return values;
}

struct Got {
  std::vector<float> values;
  std::vector<bool> found;
};

Got ReadRows(const TierStore& store, const std::vector<int64_t>& globals) {
  std::vector<float> out(globals.size() * store.width(), -1.0f);
  std::unique_ptr<bool[]> found(new bool[globals.size() + 1]);
  Status status = store.Read(globals.data(), globals.size(), out.data(), found.get());
  EXPECT_TRUE(status.ok()) << status.message();
  return Got{out, std::vector<bool>(found.get(), found.get() + globals.size())};
}

Got TakeRows(TierStore& store, const std::vector<int64_t>& globals) {
  std::vector<float> out(globals.size() * store.width(), -1.0f);
  std::unique_ptr<bool[]> found(new bool[globals.size() + 1]);
  Status status = store.Take(globals.data(), globals.size(), out.data(), found.get());
  EXPECT_TRUE(status.ok()) << status.message();
  return Got{out, std::vector<bool>(found.get(), found.get() + globals.size())};
}

Status Put(TierStore& store, const std::vector<int64_t>& globals, float salt = 0) {
  const std::vector<float> values = Rows(globals, store.width(), salt);
  return store.Put(globals.data(), globals.size(), values.data());
}

bool Contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// Bytes of this process's (unlinked) data file in `dir`, found through
// /proc/self/fd; -1 when there is none.
int64_t DataFileBytes(const std::string& dir) {
  for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
    std::error_code error;
    const std::string target = fs::read_symlink(entry.path(), error).string();
    if (error || target.rfind(dir + "/mxrec-", 0) != 0) continue;
    struct stat info;
    if (stat(entry.path().c_str(), &info) == 0) return info.st_size;
  }
  return -1;
}

TEST(TierStoreTest, PutReadTakeRoundTrip) {
  TierStore store("t", 3, 8, 0, {}, 100);
  ASSERT_TRUE(store.Open().ok());
  ASSERT_TRUE(Put(store, {5, 42, 0}).ok());
  Got read = ReadRows(store, {42, 7, 42});
  EXPECT_EQ(read.found, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(read.values, (std::vector<float>{4200, 4201, 4202, 0, 0, 0, 4200, 4201, 4202}));

  Got taken = TakeRows(store, {0, 9, 42});
  EXPECT_EQ(taken.found, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(taken.values, (std::vector<float>{0, 1, 2, 0, 0, 0, 4200, 4201, 4202}));
  EXPECT_EQ(TakeRows(store, {0, 42}).found, (std::vector<bool>{false, false}));
  EXPECT_EQ(ReadRows(store, {5}).values, (std::vector<float>{500, 501, 502}));

  const TierStore::Stats stats = store.stats();
  EXPECT_EQ(stats.host_rows_used, 1);
  EXPECT_EQ(stats.ssd_rows_used, 0);
  EXPECT_EQ(stats.ssd_bytes, 0);
  EXPECT_EQ(stats.takes, 2);
  EXPECT_EQ(stats.puts, 3);
  EXPECT_EQ(stats.spills, 0);
  EXPECT_EQ(stats.host_bytes, store.MemoryBytes());
  // One chunk of 8 rows and one location per global, at least.
  EXPECT_GE(stats.host_bytes, 8 * 3 * 4 + 100 * 8);
}

TEST(TierStoreTest, EraseIgnoresAbsentAndOutOfRange) {
  TierStore store("t", 1, 4, 0, {}, 10);
  ASSERT_TRUE(Put(store, {1, 2, 3}).ok());
  const std::vector<int64_t> erase = {2, 7, -1, 99, 2};
  store.Erase(erase.data(), erase.size());
  EXPECT_EQ(ReadRows(store, {1, 2, 3}).found, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(store.stats().host_rows_used, 2);
  // The freed slot is reused.
  ASSERT_TRUE(Put(store, {4, 5}).ok());
  EXPECT_EQ(ReadRows(store, {1, 3, 4, 5}).values, (std::vector<float>{100, 300, 400, 500}));
}

TEST(TierStoreTest, InvalidGlobalsChangeNothing) {
  TierStore store("tbl", 2, 4, 0, {}, 10);
  ASSERT_TRUE(Put(store, {1, 2}).ok());
  std::vector<float> out(4);
  bool found[2];
  const std::vector<int64_t> repeated = {1, 1};
  Status status = store.Take(repeated.data(), 2, out.data(), found);
  EXPECT_EQ(status.code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(Contains(status.message(), "table 'tbl'")) << status.message();
  EXPECT_TRUE(Contains(status.message(), "1")) << status.message();
  const std::vector<int64_t> outside = {2, 10};
  status = store.Take(outside.data(), 2, out.data(), found);
  EXPECT_EQ(status.code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(Contains(status.message(), "10")) << status.message();
  EXPECT_EQ(Put(store, {3, -1}).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(Put(store, {3, 3}).code(), Status::Code::kInvalidArgument);
  EXPECT_EQ(ReadRows(store, {1, 2, 3}).found, (std::vector<bool>{true, true, false}));
  EXPECT_EQ(store.stats().host_rows_used, 2);
}

TEST(TierStoreTest, OverwriteOnHostAndOnSsd) {
  TempDir dir;
  TierStore store("t", 2, 2, 4, {dir.path()}, 10);
  ASSERT_TRUE(store.Open().ok());
  ASSERT_TRUE(Put(store, {1, 2, 3}).ok());  // 1 goes to SSD
  EXPECT_EQ(store.stats().ssd_rows_used, 1);
  ASSERT_TRUE(Put(store, {1, 3}, 0.5f).ok());  // in place, nothing new
  const TierStore::Stats stats = store.stats();
  EXPECT_EQ(stats.host_rows_used, 2);
  EXPECT_EQ(stats.ssd_rows_used, 1);
  EXPECT_EQ(stats.spills, 1);
  EXPECT_EQ(ReadRows(store, {1, 2, 3}).values,
            (std::vector<float>{100.5, 101.5, 200, 201, 300.5, 301.5}));
}

TEST(TierStoreTest, HostFullSpillsOldestWrittenToSsdAndBack) {
  TempDir dir;
  TierStore store("t", 2, 2, 4, {dir.path()}, 10);
  ASSERT_TRUE(store.Open().ok());
  ASSERT_TRUE(Put(store, {0, 1}).ok());
  ASSERT_TRUE(Put(store, {2}).ok());  // spills 0
  ASSERT_TRUE(Put(store, {3}).ok());  // spills 1
  TierStore::Stats stats = store.stats();
  EXPECT_EQ(stats.host_rows_used, 2);
  EXPECT_EQ(stats.ssd_rows_used, 2);
  EXPECT_EQ(stats.ssd_bytes, 2 * 2 * 4);
  EXPECT_EQ(stats.spills, 2);
  EXPECT_EQ(DataFileBytes(dir.path()), 2 * 2 * 4);

  // Rows come back from SSD.
  Got taken = TakeRows(store, {0, 3});
  EXPECT_EQ(taken.found, (std::vector<bool>{true, true}));
  EXPECT_EQ(taken.values, (std::vector<float>{0, 1, 300, 301}));
  stats = store.stats();
  EXPECT_EQ(stats.host_rows_used, 1);  // 2 is left on the host
  EXPECT_EQ(stats.ssd_rows_used, 1);   // and 1 on SSD

  // Rewriting 2 makes it the newest: putting 5 and 6 spills 2 only after 5.
  ASSERT_TRUE(Put(store, {2}, 0.25f).ok());
  ASSERT_TRUE(Put(store, {5}).ok());  // host: 2, 5
  ASSERT_TRUE(Put(store, {6}).ok());  // spills 2 -> host: 5, 6
  const std::vector<int64_t> two = {2};
  store.Erase(two.data(), 1);
  stats = store.stats();
  EXPECT_EQ(stats.host_rows_used, 2);
  EXPECT_EQ(stats.ssd_rows_used, 1);  // 1 only: 2 was on SSD
  // The freed record is reused: the file did not grow past two records.
  ASSERT_TRUE(Put(store, {7}).ok());  // spills 5
  EXPECT_EQ(DataFileBytes(dir.path()), 2 * 2 * 4);
  EXPECT_EQ(ReadRows(store, {1, 5, 6, 7}).values,
            (std::vector<float>{100, 101, 500, 501, 600, 601, 700, 701}));
}

TEST(TierStoreTest, CapacityExceededStoresNothing) {
  TempDir dir;
  TierStore store("big/table", 1, 2, 1, {dir.path()}, 10);
  ASSERT_TRUE(store.Open().ok());
  ASSERT_TRUE(Put(store, {1}).ok());
  Status status = Put(store, {2, 3, 4});
  EXPECT_EQ(status.code(), Status::Code::kResourceExhausted);
  EXPECT_TRUE(Contains(status.message(), "table 'big/table'")) << status.message();
  EXPECT_TRUE(Contains(status.message(), "host_vocabulary_size=2, ssd_vocabulary_size=1"))
      << status.message();
  EXPECT_EQ(ReadRows(store, {1, 2, 3, 4}).found, (std::vector<bool>{true, false, false, false}));
  EXPECT_EQ(store.stats().puts, 1);
  // Overwrites take no room: three present rows and one new fit exactly.
  ASSERT_TRUE(Put(store, {2, 3}).ok());
  ASSERT_TRUE(Put(store, {1, 2, 3}, 1).ok());
  EXPECT_EQ(Put(store, {4}).code(), Status::Code::kResourceExhausted);
}

TEST(TierStoreTest, HostOnlyStoreNeedsNoDirectory) {
  TierStore store("t", 1, 1, 0, {"/does/not/exist"}, 4);
  ASSERT_TRUE(store.Open().ok());
  ASSERT_TRUE(Put(store, {3}).ok());
  EXPECT_EQ(Put(store, {2}).code(), Status::Code::kResourceExhausted);
}

TEST(TierStoreTest, OpenErrorsNameTheTableAndPath) {
  {
    TierStore store("t", 1, 1, 4, {}, 4);
    Status status = store.Open();
    EXPECT_EQ(status.code(), Status::Code::kInvalidArgument);
    EXPECT_TRUE(Contains(status.message(), "table 't'")) << status.message();
  }
  TempDir dir;
  const std::string missing = dir.path() + "/missing";
  {
    TierStore store("t", 1, 1, 4, {dir.path(), missing}, 4);
    Status status = store.Open();
    EXPECT_EQ(status.code(), Status::Code::kFailedPrecondition);
    EXPECT_EQ(status.message(), "table 't': SSD directory '" + missing + "' does not exist");
  }
  const std::string file = dir.path() + "/file";
  std::ofstream(file) << "x";
  {
    TierStore store("t", 1, 1, 4, {file}, 4);
    Status status = store.Open();
    EXPECT_EQ(status.code(), Status::Code::kFailedPrecondition);
    EXPECT_TRUE(Contains(status.message(), "'" + file + "' is not a directory"))
        << status.message();
  }
  EXPECT_EQ(dir.Entries(), 1u);  // the failed opens left no data file
}

TEST(TierStoreTest, OpenFailsOnUnwritableDirectory) {
  if (geteuid() == 0) GTEST_SKIP() << "root ignores directory modes";
  TempDir dir;
  const std::string locked = dir.path() + "/locked";
  ASSERT_EQ(mkdir(locked.c_str(), 0500), 0);
  TierStore store("t", 1, 1, 4, {locked}, 4);
  Status status = store.Open();
  EXPECT_EQ(status.code(), Status::Code::kFailedPrecondition);
  EXPECT_TRUE(Contains(status.message(), "'" + locked + "' is not writable")) << status.message();
  chmod(locked.c_str(), 0700);
}

TEST(TierStoreTest, DataFileIsUnlinkedAndNamedAfterTheTable) {
  TempDir a, b;
  {
    TierStore store("deep/table", 2, 1, 8, {a.path(), b.path() + "/"}, 10);
    ASSERT_TRUE(store.Open().ok());
    ASSERT_TRUE(store.Open().ok());  // a second Open does nothing
    ASSERT_TRUE(Put(store, {1, 2, 3, 4}).ok());
    EXPECT_EQ(store.stats().ssd_rows_used, 3);
    EXPECT_EQ(a.Entries(), 0u);
    EXPECT_EQ(b.Entries(), 0u);
    EXPECT_EQ(DataFileBytes(a.path()), 3 * 2 * 4);
    EXPECT_EQ(DataFileBytes(b.path()), 0);
    // The descriptor's name tells the path it had.
    bool named = false;
    const std::string want = a.path() + "/mxrec-deep_table-" + std::to_string(getpid()) + "-";
    for (const auto& entry : fs::directory_iterator("/proc/self/fd")) {
      std::error_code error;
      named |= fs::read_symlink(entry.path(), error).string().rfind(want, 0) == 0;
    }
    EXPECT_TRUE(named);
  }
  EXPECT_EQ(DataFileBytes(a.path()), -1);  // closed with the store
}

TEST(TierStoreTest, SsdDirectoriesUsedInOrderUntilFull) {
  TempDir a, b;
  constexpr int64_t kWidth = 4;  // 16-byte records
  constexpr rlim_t kLimit = 3 * 16 + 8;  // three whole records and half of one
  TierStore store("t", kWidth, 1, 100, {a.path(), b.path()}, 100);
  ASSERT_TRUE(store.Open().ok());

  struct rlimit saved;
  ASSERT_EQ(getrlimit(RLIMIT_FSIZE, &saved), 0);
  ASSERT_TRUE(saved.rlim_max == RLIM_INFINITY || saved.rlim_max > 4096);
  auto old_handler = signal(SIGXFSZ, SIG_IGN);
  struct rlimit limited = saved;
  limited.rlim_cur = kLimit;
  ASSERT_EQ(setrlimit(RLIMIT_FSIZE, &limited), 0);
  // Nothing is printed while the limit holds: results are checked afterwards.
  std::vector<Status> puts;
  puts.push_back(Put(store, {0, 1, 2, 3}));  // 0, 1, 2 to a
  const int64_t a_after_three = DataFileBytes(a.path());
  puts.push_back(Put(store, {4, 5, 6}));     // 3 fails on a (EFBIG), to b; 4, 5 to b
  const int64_t a_after_full = DataFileBytes(a.path());
  const TierStore::Stats before_full = store.stats();
  Status all_full = Put(store, {7, 8});  // 6 fails on both
  const TierStore::Stats after_full = store.stats();
  // A taken row frees a record of a, which is reused although a is full.
  Got taken = TakeRows(store, {1});
  Status reused = Put(store, {9});
  const int64_t a_after_reuse = DataFileBytes(a.path());
  setrlimit(RLIMIT_FSIZE, &saved);
  signal(SIGXFSZ, old_handler);

  for (const Status& status : puts) EXPECT_TRUE(status.ok()) << status.message();
  EXPECT_EQ(a_after_three, 3 * 16);
  EXPECT_EQ(a_after_full, 3 * 16);  // the partial record was truncated away
  EXPECT_EQ(before_full.ssd_rows_used, 6);
  EXPECT_EQ(all_full.code(), Status::Code::kResourceExhausted);
  EXPECT_EQ(all_full.message(), "table 't': every SSD directory is full: ['" + a.path() +
                                    "', '" + b.path() + "']");
  // 6 could not move to SSD, so 7 was not stored and nothing changed.
  EXPECT_EQ(after_full.ssd_rows_used, 6);
  EXPECT_EQ(after_full.host_rows_used, 1);
  EXPECT_EQ(taken.values, (std::vector<float>{100, 101, 102, 103}));
  EXPECT_TRUE(reused.ok()) << reused.message();
  EXPECT_EQ(a_after_reuse, 3 * 16);
  EXPECT_EQ(DataFileBytes(b.path()), 3 * 16);
  const Got all = ReadRows(store, {0, 2, 3, 4, 5, 6, 9, 7, 8, 1});
  EXPECT_EQ(all.found, (std::vector<bool>{true, true, true, true, true, true, true, false, false,
                                          false}));
  std::vector<float> want = Rows({0, 2, 3, 4, 5, 6, 9}, kWidth);
  want.resize(want.size() + 3 * kWidth, 0.0f);
  EXPECT_EQ(all.values, want);
}

TEST(TierStoreTest, ExportImportRoundTripWithExclude) {
  TempDir dir;
  TierStore store("t", 2, 3, 10, {dir.path()}, 50);
  ASSERT_TRUE(store.Open().ok());
  ASSERT_TRUE(Put(store, {40, 3, 17, 8, 25, 1}).ok());  // 40, 3, 17 on SSD
  std::vector<int64_t> globals;
  std::vector<float> values;
  const std::vector<int64_t> exclude = {25, 3, 49};
  ASSERT_TRUE(store.Export(exclude.data(), exclude.size(), &globals, &values).ok());
  EXPECT_EQ(globals, (std::vector<int64_t>{1, 8, 17, 40}));
  EXPECT_EQ(values, Rows({1, 8, 17, 40}, 2));

  // Into a store with a smaller host tier: rows spill on import.
  TempDir other;
  TierStore restored("t", 2, 1, 5, {other.path()}, 50);
  ASSERT_TRUE(restored.Open().ok());
  ASSERT_TRUE(Put(restored, {30, 31}).ok());  // replaced by the import
  ASSERT_TRUE(restored.Import(globals.data(), globals.size(), values.data()).ok());
  EXPECT_EQ(restored.stats().host_rows_used, 1);
  EXPECT_EQ(restored.stats().ssd_rows_used, 3);
  std::vector<int64_t> globals2;
  std::vector<float> values2;
  ASSERT_TRUE(restored.Export(nullptr, 0, &globals2, &values2).ok());
  EXPECT_EQ(globals2, globals);
  EXPECT_EQ(values2, values);

  // Invalid imports change nothing.
  const std::vector<int64_t> repeated = {1, 1};
  EXPECT_EQ(restored.Import(repeated.data(), 2, Rows(repeated, 2).data()).code(),
            Status::Code::kInvalidArgument);
  const std::vector<int64_t> outside = {50};
  EXPECT_EQ(restored.Import(outside.data(), 1, Rows(outside, 2).data()).code(),
            Status::Code::kInvalidArgument);
  const std::vector<int64_t> many = {1, 2, 3, 4, 5, 6, 7};
  Status too_many = restored.Import(many.data(), many.size(), Rows(many, 2).data());
  EXPECT_EQ(too_many.code(), Status::Code::kInvalidArgument);
  EXPECT_TRUE(Contains(too_many.message(), "host_vocabulary_size=1, ssd_vocabulary_size=5"))
      << too_many.message();
  ASSERT_TRUE(restored.Export(nullptr, 0, &globals2, &values2).ok());
  EXPECT_EQ(globals2, globals);
}

TEST(TierStoreTest, ClearReleasesEverything) {
  TempDir dir;
  TierStore store("t", 2, 2, 4, {dir.path()}, 10);
  ASSERT_TRUE(store.Open().ok());
  const int64_t empty_bytes = store.MemoryBytes();
  ASSERT_TRUE(Put(store, {1, 2, 3, 4}).ok());
  EXPECT_GT(store.MemoryBytes(), empty_bytes);
  store.Clear();
  const TierStore::Stats stats = store.stats();
  EXPECT_EQ(stats.host_rows_used + stats.ssd_rows_used + stats.puts + stats.spills, 0);
  EXPECT_EQ(store.MemoryBytes(), empty_bytes);
  EXPECT_EQ(DataFileBytes(dir.path()), 0);
  EXPECT_EQ(ReadRows(store, {1, 2, 3, 4}).found, std::vector<bool>(4, false));
  ASSERT_TRUE(Put(store, {5, 6, 7}).ok());
  EXPECT_EQ(ReadRows(store, {5, 6, 7}).values, Rows({5, 6, 7}, 2));
}

TEST(TierStoreTest, HostRowsGrowInChunks) {
  const int64_t host_rows = 3 * TierStore::kChunkRows;
  TierStore store("t", 1, host_rows, 0, {}, host_rows);
  const int64_t empty_bytes = store.MemoryBytes();
  EXPECT_LT(empty_bytes, host_rows * 8 + 4096);  // no row storage yet
  std::vector<int64_t> globals(TierStore::kChunkRows + 1);
  for (size_t i = 0; i < globals.size(); ++i) globals[i] = host_rows - 1 - i;
  ASSERT_TRUE(Put(store, globals).ok());
  // Two chunks: rows plus owner and list links (8 bytes each, 3 per slot).
  EXPECT_EQ(store.MemoryBytes() - empty_bytes, 2 * TierStore::kChunkRows * (4 + 3 * 8));
  EXPECT_EQ(ReadRows(store, {host_rows - 1, globals.back()}).values,
            (std::vector<float>{(host_rows - 1) * 100.0f, globals.back() * 100.0f}));
}

TEST(TierStoreTest, RandomizedAgainstMap) {
  TempDir a, b;
  constexpr int64_t kWidth = 3, kHost = 8, kSsd = 24, kTotal = 64;
  TierStore store("t", kWidth, kHost, kSsd, {a.path(), b.path()}, kTotal);
  ASSERT_TRUE(store.Open().ok());
  std::map<int64_t, std::vector<float>> reference;
  std::mt19937_64 rng(7);
  auto random_globals = [&](int64_t count) {
    std::set<int64_t> picked;
    while (static_cast<int64_t>(picked.size()) < count) picked.insert(rng() % kTotal);
    std::vector<int64_t> globals(picked.begin(), picked.end());
    std::shuffle(globals.begin(), globals.end(), rng);
    return globals;
  };
  for (int step = 0; step < 3000; ++step) {
    const int op = rng() % 4;
    const std::vector<int64_t> globals = random_globals(1 + rng() % 12);
    if (op == 0 || op == 1) {  // Put
      std::vector<float> values;
      int64_t new_rows = 0;
      for (int64_t g : globals) {
        new_rows += reference.count(g) == 0;
        for (int64_t j = 0; j < kWidth; ++j) values.push_back(static_cast<float>(rng() % 1000));
      }
      Status status = store.Put(globals.data(), globals.size(), values.data());
      const bool fits = static_cast<int64_t>(reference.size()) + new_rows <= kHost + kSsd;
      ASSERT_EQ(status.ok(), fits) << status.message();
      if (fits) {
        for (size_t i = 0; i < globals.size(); ++i) {
          reference[globals[i]].assign(values.begin() + i * kWidth,
                                       values.begin() + (i + 1) * kWidth);
        }
      }
    } else if (op == 2) {  // Take
      Got taken = TakeRows(store, globals);
      for (size_t i = 0; i < globals.size(); ++i) {
        auto it = reference.find(globals[i]);
        ASSERT_EQ(taken.found[i], it != reference.end());
        const std::vector<float> want =
            it != reference.end() ? it->second : std::vector<float>(kWidth, 0.0f);
        ASSERT_EQ(std::vector<float>(taken.values.begin() + i * kWidth,
                                     taken.values.begin() + (i + 1) * kWidth),
                  want);
        if (it != reference.end()) reference.erase(it);
      }
    } else if (rng() % 2) {  // Erase
      store.Erase(globals.data(), globals.size());
      for (int64_t g : globals) reference.erase(g);
    } else {  // Read
      Got read = ReadRows(store, globals);
      for (size_t i = 0; i < globals.size(); ++i) {
        ASSERT_EQ(read.found[i], reference.count(globals[i]) == 1);
      }
    }
    const TierStore::Stats stats = store.stats();
    ASSERT_EQ(stats.host_rows_used + stats.ssd_rows_used, static_cast<int64_t>(reference.size()));
    ASSERT_LE(stats.host_rows_used, kHost);
    ASSERT_LE(stats.ssd_rows_used, kSsd);
    if (step % 100 == 0) {
      std::vector<int64_t> globals_out;
      std::vector<float> values_out;
      ASSERT_TRUE(store.Export(nullptr, 0, &globals_out, &values_out).ok());
      std::vector<int64_t> want_globals;
      std::vector<float> want_values;
      for (const auto& [g, row] : reference) {
        want_globals.push_back(g);
        want_values.insert(want_values.end(), row.begin(), row.end());
      }
      ASSERT_EQ(globals_out, want_globals);
      ASSERT_EQ(values_out, want_values);
    }
  }
  EXPECT_GT(store.stats().spills, 0);
}

TEST(TierStoreTest, ConcurrentPutsAndTakesOfDisjointRows) {
  TempDir dir;
  constexpr int kThreads = 4, kRowsPerThread = 50;
  TierStore store("t", 2, 16, kThreads * kRowsPerThread, {dir.path()}, 1000);
  ASSERT_TRUE(store.Open().ok());
  std::vector<std::thread> threads;
  std::vector<int> errors(kThreads, 0);
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 20; ++round) {
        std::vector<int64_t> globals;
        for (int i = 0; i < kRowsPerThread; ++i) globals.push_back(t * kRowsPerThread + i);
        const std::vector<float> values = Rows(globals, 2, round);
        errors[t] += !store.Put(globals.data(), globals.size(), values.data()).ok();
        std::vector<float> out(values.size());
        std::unique_ptr<bool[]> found(new bool[globals.size()]);
        errors[t] += !store.Take(globals.data(), globals.size(), out.data(), found.get()).ok();
        errors[t] += out != values;
      }
    });
  }
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(errors, std::vector<int>(kThreads, 0));
  EXPECT_EQ(store.stats().host_rows_used + store.stats().ssd_rows_used, 0);
}

}  // namespace
}  // namespace mxrec

// Host-memory and SSD tiers of a tiered table (mxRec's host_vocabulary_size and
// ssd_vocabulary_size): the rows that are not in the device cache. No TensorFlow
// includes: the op layer in native/kernels wraps this class in a
// tensorflow::ResourceBase.
//
// A row is `width` float32 values ([embedding | optimizer slots]) addressed by its
// "global row" g in [0, total_rows), which the table's key index gives each key.
// Rows live in host memory first (at most host_rows of them); when the host is
// full, Put moves the oldest-written host rows (FIFO by write) to SSD (at most
// ssd_rows of them). Take copies rows out and removes them (they go back to the
// device cache).
//
// SSD: one data file per directory of ssd_dirs, created by Open and unlinked right
// away, so its space is freed when the store goes (checkpoints hold the rows). A
// file holds fixed-size records (one row each) written and read whole with
// pwrite/pread. Freed records are reused first; new records are appended to the
// first directory that has not run out of space (ENOSPC, EDQUOT or EFBIG); the
// next directory is used after that.
//
// Storage: host rows live in chunks of up to kChunkRows rows allocated as used
// (never host_rows * width up front), and a doubly linked list over host slots
// keeps the write order. The location of every global is one int64 over
// total_rows: -1 absent, >= 0 a host slot, <= -2 an SSD (directory, record).
//
// Thread safety: every public method is thread-safe (one mutex).
#ifndef MXREC_PIPELINE_NATIVE_CORE_TIER_STORE_H_
#define MXREC_PIPELINE_NATIVE_CORE_TIER_STORE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "status.h"

namespace mxrec {

class TierStore {
 public:
  // Host rows per allocation chunk (fewer for a smaller host tier).
  static constexpr int64_t kChunkRows = int64_t{1} << 16;

  // `name`: the table name, used in error messages and data file names.
  // `width` >= 1, `host_rows` >= 1, `ssd_rows` >= 0, `total_rows` >= 1: callers
  // check. Allocates 8 bytes per global (std::bad_alloc when the host cannot).
  TierStore(std::string name, int64_t width, int64_t host_rows, int64_t ssd_rows,
            std::vector<std::string> ssd_dirs, int64_t total_rows);
  ~TierStore();

  TierStore(const TierStore&) = delete;
  TierStore& operator=(const TierStore&) = delete;

  // Checks and opens the SSD directories when ssd_rows > 0 (none needed
  // otherwise): each must exist, be a directory and be writable. Creates one data
  // file per directory, `<dir>/mxrec-<table, '/' -> '_'>-<pid>-<n>.rows`, and
  // unlinks it at once. Errors name the table and the path: InvalidArgument when
  // ssd_rows > 0 and there is no directory, FailedPrecondition otherwise. A
  // second call does nothing.
  Status Open();

  // Removes the rows of `globals`; absent or out-of-range ones are ignored.
  void Erase(const int64_t* globals, int64_t n);

  // Copies the rows of `globals` into `out` and removes them; found[i] is false
  // for an absent global (its out row is zeros). InvalidArgument, changing
  // nothing, for out-of-range or repeated globals; an SSD read error changes
  // nothing either.
  Status Take(const int64_t* globals,  // (n)
              int64_t n,
              float* out,    // out: (n, width)
              bool* found);  // out: (n)

  // Stores the rows of `globals` (distinct, in range), overwriting present ones
  // in place. New rows go to host memory; when the host is full its
  // oldest-written rows move to SSD. More new rows than free host + SSD rows:
  // ResourceExhausted, storing nothing. Every SSD directory full:
  // ResourceExhausted naming them; other I/O errors: Internal naming the file.
  // Rows stored before a failure stay valid (an SSD row whose in-place overwrite
  // fails is removed).
  Status Put(const int64_t* globals,  // (n)
             int64_t n,
             const float* values);  // (n, width)

  // Non-destructive Take (evaluation, tests); globals may repeat.
  Status Read(const int64_t* globals,  // (n)
              int64_t n,
              float* out,          // out: (n, width)
              bool* found) const;  // out: (n)

  // Every stored row in ascending global order, skipping the globals in `exclude`.
  Status Export(const int64_t* exclude,  // (m)
                int64_t m,
                std::vector<int64_t>* globals,       // out: (k)
                std::vector<float>* values) const;   // out: (k, width)

  // Replaces the content with (globals, values). Validates first (distinct, in
  // range, at most host_rows + ssd_rows) and changes nothing on InvalidArgument.
  Status Import(const int64_t* globals,  // (n)
                int64_t n,
                const float* values);  // (n, width)

  // Removes every row, releases host chunks and SSD space, resets the counters.
  void Clear();

  struct Stats {
    int64_t host_rows_used = 0;
    int64_t ssd_rows_used = 0;
    int64_t host_bytes = 0;  // host memory allocated for rows and the index
    int64_t ssd_bytes = 0;   // SSD rows in use x record bytes
    int64_t takes = 0;       // rows taken
    int64_t puts = 0;        // rows put
    int64_t spills = 0;      // host rows moved to SSD
  };
  Stats stats() const;
  // Host bytes held (Stats::host_bytes).
  int64_t MemoryBytes() const;

  const std::string& name() const { return name_; }
  int64_t width() const { return width_; }
  int64_t host_rows() const { return host_rows_; }
  int64_t ssd_rows() const { return ssd_rows_; }
  int64_t total_rows() const { return total_rows_; }
  const std::vector<std::string>& ssd_dirs() const { return ssd_dirs_; }

 private:
  // One SSD directory and its data file.
  struct SsdFile {
    std::string dir;
    std::string path;                 // of the (unlinked) data file
    int fd = -1;
    bool full = false;                // a write failed for lack of space: no appends
    int64_t next_record = 0;          // records >= next_record are past the file's end
    std::vector<int64_t> free_records;  // freed records < next_record
  };

  static constexpr int64_t kAbsent = -1;

  // InvalidArgument naming `what` when a global is out of range or (with
  // `distinct`) repeated.
  Status CheckGlobals(const int64_t* globals, int64_t n, bool distinct, const char* what) const;
  // Copies the row at `loc` (present) to `out`. Caller holds mu_.
  // Reads the rows of globals (checked) into out (n x width); absent ones read
  // zeros with found[i] = false. Caller holds mu_.
  Status ReadAllLocked(const int64_t* globals, int64_t n, float* out, bool* found) const;
  Status ReadLocked(int64_t loc, float* out) const;
  // Removes the row at `loc` (present) of global g. Caller holds mu_.
  void RemoveLocked(int64_t g);
  // Writes `row` to a new SSD record; *loc gets its encoded location.
  Status SpillWriteLocked(const float* row, int64_t* loc);
  // pwrite/pread of one whole record; *no_space tells a space error (ENOSPC,
  // EDQUOT, EFBIG) from others.
  Status WriteRecord(SsdFile& file, int64_t record, const float* row, bool* no_space);
  Status ReadRecord(const SsdFile& file, int64_t record, float* out) const;
  // A host slot for a new row, spilling the oldest host row when full.
  Status AcquireHostSlotLocked(int64_t* slot);
  float* HostRow(int64_t slot) const;
  void LinkTail(int64_t slot);
  void Unlink(int64_t slot);
  void ClearContentLocked();
  int64_t HostBytesLocked() const;
  std::string DirList() const;

  int64_t EncodeSsd(int64_t dir, int64_t record) const {
    return -2 - (record * static_cast<int64_t>(files_.size()) + dir);
  }
  void DecodeSsd(int64_t loc, int64_t* dir, int64_t* record) const {
    const int64_t v = -2 - loc;
    *dir = v % static_cast<int64_t>(files_.size());
    *record = v / static_cast<int64_t>(files_.size());
  }

  const std::string name_;
  const int64_t width_;
  const int64_t host_rows_;
  const int64_t ssd_rows_;
  const std::vector<std::string> ssd_dirs_;
  const int64_t total_rows_;
  const int64_t chunk_rows_;
  const int64_t record_bytes_;

  mutable std::mutex mu_;
  bool opened_ = false;                         // guarded by mu_
  std::vector<int64_t> loc_;                    // guarded by mu_: global -> location
  std::vector<std::unique_ptr<float[]>> chunks_;  // guarded by mu_: host rows
  std::vector<int64_t> owner_;                  // guarded by mu_: host slot -> global
  std::vector<int64_t> prev_, next_;            // guarded by mu_: write-order list
  int64_t head_ = -1, tail_ = -1;               // guarded by mu_: oldest, newest slot
  int64_t next_slot_ = 0;                       // guarded by mu_: slots >= are unused
  std::vector<int64_t> free_slots_;             // guarded by mu_: freed slots < next_slot_
  int64_t host_used_ = 0;                       // guarded by mu_
  int64_t ssd_used_ = 0;                        // guarded by mu_
  std::vector<SsdFile> files_;                  // guarded by mu_
  int64_t takes_ = 0, puts_ = 0, spills_ = 0;   // guarded by mu_
};

}  // namespace mxrec

#endif  // MXREC_PIPELINE_NATIVE_CORE_TIER_STORE_H_

#include "tier_store.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <sstream>
#include <utility>

namespace mxrec {
namespace {

// Numbers the data files of this process (the `<n>` of their names).
std::atomic<int64_t> next_file_number{0};

bool IsNoSpace(int error) { return error == ENOSPC || error == EDQUOT || error == EFBIG; }

std::string ErrnoText(int error) { return std::strerror(error); }

// Truncates a data file to `size` bytes. Best effort: the records past `size`
// are unused either way, the call only gives their space back.
void DropTail(int fd, int64_t size) {
  if (ftruncate(fd, size) != 0) return;
}

// Sorted copy of globals[0, n).
std::vector<int64_t> Sorted(const int64_t* globals, int64_t n) {
  std::vector<int64_t> sorted(globals, globals + n);
  std::sort(sorted.begin(), sorted.end());
  return sorted;
}

}  // namespace

TierStore::TierStore(std::string name, int64_t width, int64_t host_rows, int64_t ssd_rows,
                     std::vector<std::string> ssd_dirs, int64_t total_rows)
    : name_(std::move(name)),
      width_(width),
      host_rows_(host_rows),
      ssd_rows_(ssd_rows),
      ssd_dirs_(std::move(ssd_dirs)),
      total_rows_(total_rows),
      chunk_rows_(std::min(host_rows, kChunkRows)),
      record_bytes_(width * static_cast<int64_t>(sizeof(float))),
      loc_(total_rows, kAbsent) {}

TierStore::~TierStore() {
  for (SsdFile& file : files_) {
    if (file.fd >= 0) close(file.fd);
  }
}

Status TierStore::Open() {
  std::lock_guard<std::mutex> lock(mu_);
  if (opened_) return Status::Ok();
  if (ssd_rows_ == 0) {
    opened_ = true;
    return Status::Ok();
  }
  if (ssd_dirs_.empty()) {
    std::ostringstream msg;
    msg << "table '" << name_ << "': ssd_vocabulary_size=" << ssd_rows_
        << " needs at least one SSD directory (ssd_data_path), got none";
    return Status::InvalidArgument(msg.str());
  }
  std::string table = name_;
  std::replace(table.begin(), table.end(), '/', '_');
  std::vector<SsdFile> files;
  // Closes the files opened so far when a later directory fails.
  auto fail = [&files](std::string message) {
    for (SsdFile& file : files) close(file.fd);
    return Status::FailedPrecondition(std::move(message));
  };
  for (const std::string& dir : ssd_dirs_) {
    std::ostringstream prefix;
    prefix << "table '" << name_ << "': SSD directory '" << dir << "'";
    struct stat info;
    if (stat(dir.c_str(), &info) != 0) {
      const int error = errno;
      if (error == ENOENT) return fail(prefix.str() + " does not exist");
      return fail(prefix.str() + " cannot be accessed: " + ErrnoText(error));
    }
    if (!S_ISDIR(info.st_mode)) return fail(prefix.str() + " is not a directory");
    if (access(dir.c_str(), W_OK | X_OK) != 0) {
      return fail(prefix.str() + " is not writable: " + ErrnoText(errno));
    }
    SsdFile file;
    file.dir = dir;
    std::ostringstream path;
    path << dir << (dir.back() == '/' ? "" : "/") << "mxrec-" << table << "-" << getpid() << "-"
         << next_file_number.fetch_add(1) << ".rows";
    file.path = path.str();
    file.fd = open(file.path.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (file.fd < 0) {
      return fail(prefix.str() + ": cannot create the data file '" + file.path +
                  "': " + ErrnoText(errno));
    }
    if (unlink(file.path.c_str()) != 0) {
      const int error = errno;
      close(file.fd);
      return fail(prefix.str() + ": cannot unlink the data file '" + file.path +
                  "': " + ErrnoText(error));
    }
    files.push_back(std::move(file));
  }
  files_ = std::move(files);
  opened_ = true;
  return Status::Ok();
}

std::string TierStore::DirList() const {
  std::string list = "[";
  for (size_t d = 0; d < ssd_dirs_.size(); ++d) {
    list += (d ? ", '" : "'") + ssd_dirs_[d] + "'";
  }
  return list + "]";
}

Status TierStore::CheckGlobals(const int64_t* globals, int64_t n, bool distinct,
                               const char* what) const {
  for (int64_t i = 0; i < n; ++i) {
    if (globals[i] < 0 || globals[i] >= total_rows_) {
      std::ostringstream msg;
      msg << "table '" << name_ << "': cannot " << what << " global row " << globals[i]
          << ": outside [0, " << total_rows_ << ")";
      return Status::InvalidArgument(msg.str());
    }
  }
  if (distinct && n > 1) {
    const std::vector<int64_t> sorted = Sorted(globals, n);
    auto repeated = std::adjacent_find(sorted.begin(), sorted.end());
    if (repeated != sorted.end()) {
      std::ostringstream msg;
      msg << "table '" << name_ << "': cannot " << what << " global row " << *repeated
          << " twice in one call";
      return Status::InvalidArgument(msg.str());
    }
  }
  return Status::Ok();
}

float* TierStore::HostRow(int64_t slot) const {
  return chunks_[slot / chunk_rows_].get() + (slot % chunk_rows_) * width_;
}

void TierStore::LinkTail(int64_t slot) {
  prev_[slot] = tail_;
  next_[slot] = -1;
  if (tail_ >= 0) {
    next_[tail_] = slot;
  } else {
    head_ = slot;
  }
  tail_ = slot;
}

void TierStore::Unlink(int64_t slot) {
  if (prev_[slot] >= 0) {
    next_[prev_[slot]] = next_[slot];
  } else {
    head_ = next_[slot];
  }
  if (next_[slot] >= 0) {
    prev_[next_[slot]] = prev_[slot];
  } else {
    tail_ = prev_[slot];
  }
}

Status TierStore::WriteRecord(SsdFile& file, int64_t record, const float* row, bool* no_space) {
  *no_space = false;
  const char* bytes = reinterpret_cast<const char*>(row);
  int64_t done = 0;
  while (done < record_bytes_) {
    const ssize_t wrote =
        pwrite(file.fd, bytes + done, record_bytes_ - done, record * record_bytes_ + done);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) {
      // A zero-byte write makes no progress: treat it as running out of space.
      const int error = wrote < 0 ? errno : ENOSPC;
      *no_space = IsNoSpace(error);
      std::ostringstream msg;
      msg << "table '" << name_ << "': cannot write a row to the SSD data file '" << file.path
          << "': " << ErrnoText(error);
      return Status::Internal(msg.str());
    }
    done += wrote;
  }
  return Status::Ok();
}

Status TierStore::ReadRecord(const SsdFile& file, int64_t record, float* out) const {
  char* bytes = reinterpret_cast<char*>(out);
  int64_t done = 0;
  while (done < record_bytes_) {
    const ssize_t got =
        pread(file.fd, bytes + done, record_bytes_ - done, record * record_bytes_ + done);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      std::ostringstream msg;
      msg << "table '" << name_ << "': cannot read a row from the SSD data file '" << file.path
          << "': " << (got < 0 ? ErrnoText(errno) : "unexpected end of file");
      return Status::Internal(msg.str());
    }
    done += got;
  }
  return Status::Ok();
}

Status TierStore::SpillWriteLocked(const float* row, int64_t* loc) {
  if (!opened_) {
    return Status::FailedPrecondition("table '" + name_ +
                                      "': the SSD tier is used before TierStore::Open");
  }
  const int64_t dirs = static_cast<int64_t>(files_.size());
  bool no_space;
  // Freed records first, in directory order: their space is already allocated.
  for (int64_t d = 0; d < dirs; ++d) {
    SsdFile& file = files_[d];
    if (file.free_records.empty()) continue;
    const int64_t record = file.free_records.back();
    Status wrote = WriteRecord(file, record, row, &no_space);
    if (wrote.ok()) {
      file.free_records.pop_back();
      *loc = EncodeSsd(d, record);
      return wrote;
    }
    if (!no_space) return wrote;
    file.full = true;  // e.g. a copy-on-write file system; the record stays free.
  }
  // Then a new record at the end of the first directory with space left.
  for (int64_t d = 0; d < dirs; ++d) {
    SsdFile& file = files_[d];
    if (file.full) continue;
    const int64_t record = file.next_record;
    Status wrote = WriteRecord(file, record, row, &no_space);
    if (wrote.ok()) {
      ++file.next_record;
      *loc = EncodeSsd(d, record);
      return wrote;
    }
    DropTail(file.fd, record * record_bytes_);  // a partly written record
    if (!no_space) return wrote;
    file.full = true;
  }
  return Status::ResourceExhausted("table '" + name_ + "': every SSD directory is full: " +
                                   DirList());
}

Status TierStore::AcquireHostSlotLocked(int64_t* slot) {
  if (host_used_ < host_rows_) {
    if (!free_slots_.empty()) {
      *slot = free_slots_.back();
      free_slots_.pop_back();
    } else {
      if (next_slot_ == static_cast<int64_t>(chunks_.size()) * chunk_rows_) {
        // Grows every per-slot array before anything is registered: a
        // std::bad_alloc leaves the store as it was.
        const size_t slots = (chunks_.size() + 1) * chunk_rows_;
        owner_.resize(slots, kAbsent);
        prev_.resize(slots, -1);
        next_.resize(slots, -1);
        // Uninitialized: pages are touched only as rows are written.
        chunks_.push_back(std::unique_ptr<float[]>(new float[chunk_rows_ * width_]));
      }
      *slot = next_slot_++;
    }
    ++host_used_;
    return Status::Ok();
  }
  // Full: the oldest-written host row moves to SSD and its slot is reused.
  const int64_t oldest = head_;
  int64_t loc;
  Status spilled = SpillWriteLocked(HostRow(oldest), &loc);
  if (!spilled.ok()) return spilled;
  Unlink(oldest);
  loc_[owner_[oldest]] = loc;
  owner_[oldest] = kAbsent;
  ++ssd_used_;
  ++spills_;
  *slot = oldest;
  return Status::Ok();
}

void TierStore::RemoveLocked(int64_t g) {
  const int64_t loc = loc_[g];
  if (loc >= 0) {
    Unlink(loc);
    owner_[loc] = kAbsent;
    free_slots_.push_back(loc);
    --host_used_;
  } else {
    int64_t dir, record;
    DecodeSsd(loc, &dir, &record);
    files_[dir].free_records.push_back(record);
    --ssd_used_;
  }
  loc_[g] = kAbsent;
}

Status TierStore::ReadLocked(int64_t loc, float* out) const {
  if (loc >= 0) {
    std::copy_n(HostRow(loc), width_, out);
    return Status::Ok();
  }
  int64_t dir, record;
  DecodeSsd(loc, &dir, &record);
  return ReadRecord(files_[dir], record, out);
}

void TierStore::Erase(const int64_t* globals, int64_t n) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = globals[i];
    if (g >= 0 && g < total_rows_ && loc_[g] != kAbsent) RemoveLocked(g);
  }
}

Status TierStore::Take(const int64_t* globals, int64_t n, float* out, bool* found) {
  Status valid = CheckGlobals(globals, n, /*distinct=*/true, "take");
  if (!valid.ok()) return valid;
  std::lock_guard<std::mutex> lock(mu_);
  // Reads everything first, so that a read error removes nothing.
  Status read = ReadAllLocked(globals, n, out, found);
  if (!read.ok()) return read;
  for (int64_t i = 0; i < n; ++i) {
    if (!found[i]) continue;
    RemoveLocked(globals[i]);
    ++takes_;
  }
  return Status::Ok();
}

Status TierStore::Put(const int64_t* globals, int64_t n, const float* values) {
  Status valid = CheckGlobals(globals, n, /*distinct=*/true, "put");
  if (!valid.ok()) return valid;
  std::lock_guard<std::mutex> lock(mu_);
  int64_t new_rows = 0;
  for (int64_t i = 0; i < n; ++i) new_rows += loc_[globals[i]] == kAbsent;
  const int64_t free_rows = host_rows_ + ssd_rows_ - host_used_ - ssd_used_;
  if (new_rows > free_rows) {
    std::ostringstream msg;
    msg << "table '" << name_ << "': the host and SSD tiers are full: host_vocabulary_size="
        << host_rows_ << ", ssd_vocabulary_size=" << ssd_rows_ << ", " << host_used_ + ssd_used_
        << " rows stored, and " << new_rows
        << " more rows leave the device cache. Nothing was stored. Create the table with a "
           "larger host_vocabulary_size or ssd_vocabulary_size (host + SSD + device must hold "
           "every key).";
    return Status::ResourceExhausted(msg.str());
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t g = globals[i];
    const float* row = values + i * width_;
    const int64_t loc = loc_[g];
    if (loc >= 0) {  // Host: overwrite; it becomes the newest-written row.
      std::copy_n(row, width_, HostRow(loc));
      Unlink(loc);
      LinkTail(loc);
    } else if (loc != kAbsent) {  // SSD: overwrite in place.
      int64_t dir, record;
      DecodeSsd(loc, &dir, &record);
      bool no_space;
      Status wrote = WriteRecord(files_[dir], record, row, &no_space);
      if (!wrote.ok()) {
        RemoveLocked(g);  // Its record may hold half of each value.
        return wrote;
      }
    } else {
      int64_t slot;
      Status acquired = AcquireHostSlotLocked(&slot);
      if (!acquired.ok()) return acquired;
      std::copy_n(row, width_, HostRow(slot));
      owner_[slot] = g;
      loc_[g] = slot;
      LinkTail(slot);
    }
    ++puts_;
  }
  return Status::Ok();
}

Status TierStore::Read(const int64_t* globals, int64_t n, float* out, bool* found) const {
  Status valid = CheckGlobals(globals, n, /*distinct=*/false, "read");
  if (!valid.ok()) return valid;
  std::lock_guard<std::mutex> lock(mu_);
  return ReadAllLocked(globals, n, out, found);
}

Status TierStore::ReadAllLocked(const int64_t* globals, int64_t n, float* out,
                                bool* found) const {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t loc = loc_[globals[i]];
    found[i] = loc != kAbsent;
    if (!found[i]) {
      std::fill_n(out + i * width_, width_, 0.0f);
      continue;
    }
    Status read = ReadLocked(loc, out + i * width_);
    if (!read.ok()) return read;
  }
  return Status::Ok();
}

Status TierStore::Export(const int64_t* exclude, int64_t m, std::vector<int64_t>* globals,
                         std::vector<float>* values) const {
  const std::vector<int64_t> excluded = Sorted(exclude, m);
  std::lock_guard<std::mutex> lock(mu_);
  globals->clear();
  values->clear();
  globals->reserve(host_used_ + ssd_used_);
  values->reserve((host_used_ + ssd_used_) * width_);
  auto skip = excluded.begin();
  for (int64_t g = 0; g < total_rows_; ++g) {
    if (loc_[g] == kAbsent) continue;
    while (skip != excluded.end() && *skip < g) ++skip;
    if (skip != excluded.end() && *skip == g) continue;
    globals->push_back(g);
    values->resize(values->size() + width_);
    Status read = ReadLocked(loc_[g], values->data() + values->size() - width_);
    if (!read.ok()) return read;
  }
  return Status::Ok();
}

Status TierStore::Import(const int64_t* globals, int64_t n, const float* values) {
  if (n > host_rows_ + ssd_rows_) {
    std::ostringstream msg;
    msg << "table '" << name_ << "': cannot import " << n << " rows into host_vocabulary_size="
        << host_rows_ << ", ssd_vocabulary_size=" << ssd_rows_;
    return Status::InvalidArgument(msg.str());
  }
  Status valid = CheckGlobals(globals, n, /*distinct=*/true, "import");
  if (!valid.ok()) return valid;
  {
    std::lock_guard<std::mutex> lock(mu_);
    ClearContentLocked();
  }
  // Another caller may put rows in between: Put still checks the capacity.
  return Put(globals, n, values);
}

void TierStore::ClearContentLocked() {
  std::fill(loc_.begin(), loc_.end(), kAbsent);
  chunks_.clear();
  chunks_.shrink_to_fit();
  for (std::vector<int64_t>* v : {&owner_, &prev_, &next_, &free_slots_}) {
    v->clear();
    v->shrink_to_fit();
  }
  head_ = tail_ = -1;
  next_slot_ = 0;
  host_used_ = 0;
  ssd_used_ = 0;
  for (SsdFile& file : files_) {
    DropTail(file.fd, 0);  // gives the space back
    file.full = false;
    file.next_record = 0;
    file.free_records.clear();
    file.free_records.shrink_to_fit();
  }
}

void TierStore::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  ClearContentLocked();
  takes_ = puts_ = spills_ = 0;
}

int64_t TierStore::HostBytesLocked() const {
  int64_t bytes = static_cast<int64_t>(chunks_.size()) * chunk_rows_ * record_bytes_;
  int64_t index = loc_.capacity() + owner_.capacity() + prev_.capacity() + next_.capacity() +
                  free_slots_.capacity();
  for (const SsdFile& file : files_) index += file.free_records.capacity();
  return bytes + index * static_cast<int64_t>(sizeof(int64_t));
}

TierStore::Stats TierStore::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  Stats stats;
  stats.host_rows_used = host_used_;
  stats.ssd_rows_used = ssd_used_;
  stats.host_bytes = HostBytesLocked();
  stats.ssd_bytes = ssd_used_ * record_bytes_;
  stats.takes = takes_;
  stats.puts = puts_;
  stats.spills = spills_;
  return stats;
}

int64_t TierStore::MemoryBytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return HostBytesLocked();
}

}  // namespace mxrec

#include "threewalls/backend/copies.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

#include "threewalls/backend/error.hpp"

namespace threewalls::backend {

void copy_h2d(void* device_dst, const void* host_src, std::size_t bytes, cudaStream_t stream) {
  TW_CUDA_CHECK(cudaMemcpyAsync(device_dst, host_src, bytes, cudaMemcpyHostToDevice, stream));
}
void copy_d2h(void* host_dst, const void* device_src, std::size_t bytes, cudaStream_t stream) {
  TW_CUDA_CHECK(cudaMemcpyAsync(host_dst, device_src, bytes, cudaMemcpyDeviceToHost, stream));
}
void copy_d2d(void* device_dst, const void* device_src, std::size_t bytes, cudaStream_t stream) {
  TW_CUDA_CHECK(cudaMemcpyAsync(device_dst, device_src, bytes, cudaMemcpyDeviceToDevice, stream));
}

namespace {

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  [[nodiscard]] int get() const { return fd_; }

 private:
  int fd_;
};

std::string errno_text(int err) { return std::string(std::strerror(err)) + " (errno " + std::to_string(err) + ")"; }

// Reads exactly `want` bytes at `offset` (fewer only at end of file); returns bytes read.
std::size_t pread_all(int fd, char* dst, std::size_t want, std::uint64_t offset, const std::string& path) {
  std::size_t got = 0;
  while (got < want) {
    const ssize_t r = ::pread(fd, dst + got, want - got, static_cast<off_t>(offset + got));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw SystemError(rank_prefix() + path + ": read of " + std::to_string(want) + " bytes at offset " +
                        std::to_string(offset) + " failed: " + errno_text(errno));
    }
    if (r == 0) break;
    got += static_cast<std::size_t>(r);
  }
  return got;
}

}  // namespace

FileReadResult read_file_into(const std::string& path, std::uint64_t offset, std::size_t bytes, PinnedBuffer& dst,
                              bool try_direct) {
  if (bytes > dst.size()) {
    throw InputError(rank_prefix() + path + ": read of " + std::to_string(bytes) + " bytes into a pinned buffer of " +
                     std::to_string(dst.size()));
  }
  FileReadResult res;
  const std::size_t padded = round_up_direct(bytes);
  const bool aligned = offset % kDirectIoAlign == 0 && padded <= dst.size() &&
                       reinterpret_cast<std::uintptr_t>(dst.data()) % kDirectIoAlign == 0;
  if (try_direct && aligned) {
    const int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
    if (fd >= 0) {
      Fd guard(fd);
      // A direct read of the padded size; at end of file it returns what exists.
      const ssize_t r = ::pread(fd, dst.data(), padded, static_cast<off_t>(offset));
      if (r >= 0 && static_cast<std::size_t>(r) >= bytes) {
        res.bytes = bytes;
        res.direct = true;
        return res;
      }
      if (r >= 0) {
        throw SystemError(rank_prefix() + path + ": file too short: wanted " + std::to_string(bytes) +
                          " bytes at offset " + std::to_string(offset) + ", got " + std::to_string(r));
      }
      if (errno != EINVAL) {
        throw SystemError(rank_prefix() + path + ": O_DIRECT read failed: " + errno_text(errno));
      }
      // EINVAL: the file system refuses this direct read; fall back to buffered below.
    } else if (errno != EINVAL) {
      throw SystemError(rank_prefix() + path + ": cannot open: " + errno_text(errno));
    }
  }
  const int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw SystemError(rank_prefix() + path + ": cannot open: " + errno_text(errno));
  Fd guard(fd);
  const std::size_t got = pread_all(fd, static_cast<char*>(dst.data()), bytes, offset, path);
  if (got < bytes) {
    throw SystemError(rank_prefix() + path + ": file too short: wanted " + std::to_string(bytes) + " bytes at offset " +
                      std::to_string(offset) + ", got " + std::to_string(got));
  }
  res.bytes = bytes;
  res.direct = false;
  return res;
}

void write_random_file(const std::string& path, std::size_t bytes, std::uint64_t seed) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) throw SystemError(rank_prefix() + path + ": cannot create: " + errno_text(errno));
  Fd guard(fd);
  std::vector<std::uint64_t> block(1 << 17);  // 1 MiB
  std::uint64_t x = seed * 0x9E3779B97F4A7C15ULL + 1;
  std::size_t written = 0;
  while (written < bytes) {
    for (auto& w : block) {  // xorshift64*
      x ^= x >> 12;
      x ^= x << 25;
      x ^= x >> 27;
      w = x * 0x2545F4914F6CDD1DULL;
    }
    const std::size_t chunk = std::min(bytes - written, block.size() * sizeof(std::uint64_t));
    const char* p = reinterpret_cast<const char*>(block.data());
    std::size_t done = 0;
    while (done < chunk) {
      const ssize_t w = ::write(fd, p + done, chunk - done);
      if (w < 0) {
        if (errno == EINTR) continue;
        throw SystemError(rank_prefix() + path + ": write failed: " + errno_text(errno));
      }
      done += static_cast<std::size_t>(w);
    }
    written += chunk;
  }
  if (::fsync(fd) != 0) throw SystemError(rank_prefix() + path + ": fsync failed: " + errno_text(errno));
}

std::size_t disk_slots(std::size_t slot_bytes) {
  const std::size_t slot = round_up_direct(std::max<std::size_t>(slot_bytes, 1));
  return std::clamp<std::size_t>(kDiskFileCap / slot, 1, kDiskSlots);
}

std::uint64_t disk_slot_offset(std::size_t slot_bytes, std::uint64_t key) {
  return static_cast<std::uint64_t>(round_up_direct(slot_bytes)) * (key % disk_slots(slot_bytes));
}

}  // namespace threewalls::backend

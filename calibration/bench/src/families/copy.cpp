// Calibrate group "copy" (families copy.*): backend::copy_h2d / copy_d2h from pinned and pageable
// memory, copy_d2d, and read_file_into from a scratch file (OpRunner's disk tier), each checked
// byte for byte at its start, middle and end.
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "bench.hpp"
#include "threewalls/backend/copies.hpp"
#include "threewalls/backend/error.hpp"

namespace threewalls::calibration::bench::detail {

namespace {

namespace be = threewalls::backend;

class CopyBench final : public GroupBench {
 public:
  using GroupBench::GroupBench;
  ~CopyBench() override {
    if (!disk_path_.empty()) std::filesystem::remove(disk_path_);
  }

  void begin(const std::vector<PointSpec>& points) override {
    double dev = 0, pinned = 0, pageable = 0, disk = 0;
    for (const auto& p : points) {
      if (p.op == "copy_d2d" || p.op.find("pinned") != std::string::npos ||
          p.op.find("pageable") != std::string::npos) {
        dev = std::max(dev, p.bytes);
      }
      if (p.op.find("pinned") != std::string::npos) pinned = std::max(pinned, p.bytes);
      if (p.op.find("pageable") != std::string::npos) pageable = std::max(pageable, p.bytes);
      if (p.op == "copy_disk_read") disk = std::max(disk, p.bytes);
    }
    src_ = random_bf16(sz(dev / 2), opt().seed + 11, s());
    dst_ = be::DeviceBuffer(std::max<std::size_t>(sz(dev), 2));
    if (pinned > 0 || disk > 0) {
      pinned_ = be::PinnedBuffer(std::max(sz(pinned), be::round_up_direct(sz(disk))));
      std::memset(pinned_.data(), 0x5A, pinned_.size());  // differs from the random device data
    }
    pageable_.assign(sz(pageable), static_cast<char>(0x3C));
    if (disk > 0) {
      disk_path_ = opt().scratch_dir + "/threewalls_calibrate_" + std::to_string(::getpid()) + ".bin";
      // As OpRunner's disk tier: slots of the largest read, each read from the next slot (copies.hpp).
      disk_slot_bytes_ = sz(disk);
      be::write_random_file(disk_path_, be::round_up_direct(sz(disk)) * be::disk_slots(sz(disk)), opt().seed);
    }
  }

  void measure(const StopRule& rule, Record& r) override {
    const std::size_t bytes = sz(r.point.bytes);
    const std::string& op = r.point.op;
    void* dev_src = src_.data();
    void* dev_dst = dst_.data();
    if (op == "copy_disk_read") {
      bool direct = false;
      // Every read from the next slot of the file (never the offset just read), as expert fetches are.
      auto next = [&] { return be::disk_slot_offset(disk_slot_bytes_, disk_reads_++); };
      measure_host(rule, ctx_.clock, 1, [&] { direct = be::read_file_into(disk_path_, next(), bytes, pinned_).direct; },
                   r, {});
      const auto res = be::read_file_into(disk_path_, next(), bytes, pinned_);
      if (res.bytes != bytes)
        throw std::runtime_error("correctness check failed: read " + std::to_string(res.bytes) + " bytes");
      r.check = std::string("passed: ") + std::to_string(bytes) + " bytes read" +
                (direct ? " (O_DIRECT)" : " (buffered: page cache)") + ", each read from the next of " +
                std::to_string(be::disk_slots(disk_slot_bytes_)) + " slots of the file";
      return;
    }
    Work w;
    const void* got = nullptr;
    const void* want = nullptr;
    bool got_dev = true, want_dev = true, batch = true;
    if (op == "copy_h2d_pinned") {
      w = [&](cudaStream_t st) { be::copy_h2d(dev_dst, pinned_.data(), bytes, st); };
      got = dev_dst, want = pinned_.data(), want_dev = false;
    } else if (op == "copy_d2h_pinned") {
      w = [&](cudaStream_t st) { be::copy_d2h(pinned_.data(), dev_src, bytes, st); };
      got = pinned_.data(), got_dev = false, want = dev_src;
    } else if (op == "copy_h2d_pageable") {
      w = [&](cudaStream_t st) { be::copy_h2d(dev_dst, pageable_.data(), bytes, st); };
      got = dev_dst, want = pageable_.data(), want_dev = false, batch = false;  // host-synchronous staging
    } else if (op == "copy_d2h_pageable") {
      w = [&](cudaStream_t st) { be::copy_d2h(pageable_.data(), dev_src, bytes, st); };
      got = pageable_.data(), got_dev = false, want = dev_src, batch = false;
    } else {
      w = [&](cudaStream_t st) { be::copy_d2d(dev_dst, dev_src, bytes, st); };
      got = dev_dst, want = dev_src;
    }
    device(w, batch, rule, r);
    TW_CUDA_CHECK(cudaStreamSynchronize(s()));
    r.check = compare_bytes(got, got_dev, want, want_dev, bytes);
  }

 private:
  // Compares three 64-byte windows (start, middle, end) of two buffers (device or host).
  static std::string compare_bytes(const void* got, bool got_dev, const void* want, bool want_dev, std::size_t bytes) {
    CheckLog log("copied bytes equal their source (start, middle, end)");
    for (const std::size_t at : {std::size_t{0}, bytes / 2, bytes > 64 ? bytes - 64 : 0}) {
      const std::size_t n = std::min<std::size_t>(64, bytes - at);
      std::vector<unsigned char> g(n), w(n);
      TW_CUDA_CHECK(cudaMemcpy(g.data(), static_cast<const char*>(got) + at, n,
                               got_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost));
      TW_CUDA_CHECK(cudaMemcpy(w.data(), static_cast<const char*>(want) + at, n,
                               want_dev ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost));
      for (std::size_t i = 0; i < n; ++i) log.expect_near(g[i], w[i], 0.5, "byte " + std::to_string(at + i));
    }
    return log.passed();
  }

  // Declared first, released last (after the buffers), as the driver released them at a section's end.
  std::string disk_path_;
  std::size_t disk_slot_bytes_ = 0;  // the disk-read file's slot size (the largest read)
  std::uint64_t disk_reads_ = 0;     // reads so far: the next slot to read
  be::DeviceBuffer src_;
  be::DeviceBuffer dst_;
  be::PinnedBuffer pinned_;
  std::vector<char> pageable_;
};

}  // namespace

std::unique_ptr<GroupBench> make_copy_bench(const BenchContext& ctx) { return std::make_unique<CopyBench>(ctx); }

}  // namespace threewalls::calibration::bench::detail

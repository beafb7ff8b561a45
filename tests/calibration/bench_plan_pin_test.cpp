// The calibration plan pinned point for point: for each mode, GPU count and --only group, a
// checksum of every point's label, family, inputs, FLOPs, bytes, group size and held-out flag, in
// plan order; the whole plan is the groups' plans in the measurement order; and the op table's rows.
// A change of the grids (a point moved, dropped, relabelled or reordered) fails here; a deliberate
// one updates the pinned values with the change.
#include <gtest/gtest.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "threewalls/calibration/bench/plan.hpp"

using namespace threewalls::calibration::bench;

namespace {

// FNV-1a, 64 bits.
struct Hash {
  std::uint64_t h = 0xcbf29ce484222325ULL;
  void add(const std::string& s) {
    for (const unsigned char c : s) {
      h ^= c;
      h *= 0x100000001b3ULL;
    }
    h ^= 0xff;  // field separator
    h *= 0x100000001b3ULL;
  }
  void add(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%a", v);
    add(std::string(buf));
  }
};

std::string point_text(const PointSpec& p) {
  std::string s = p.label() + " | " + p.family + " |";
  char buf[64];
  for (const double v : p.inputs) {
    std::snprintf(buf, sizeof buf, " %a", v);
    s += buf;
  }
  std::snprintf(buf, sizeof buf, " | flops %a bytes %a group %d", p.flops, p.bytes, p.group_size);
  return s + buf;
}

std::uint64_t checksum(const std::vector<PointSpec>& points) {
  Hash h;
  for (const auto& p : points) h.add(point_text(p));
  return h.h;
}

std::vector<PointSpec> plan(Mode mode, int gpus, std::set<std::string> only) {
  PlanOptions o;
  o.mode = mode;
  o.gpus = gpus;
  o.only = std::move(only);
  return make_plan(o);
}

// The groups in the order `calibrate` measures them.
const std::vector<std::string> kMeasurementOrder{"copy",       "memory",       "gemm",    "grouped",
                                                 "attention",  "host",         "kernels", "concurrency",
                                                 "collective", "interference", "device"};

struct Pinned {
  const char* mode;
  int gpus;
  const char* group;
  std::size_t points;
  std::uint64_t checksum;
};

// Taken from the plan before its grids moved into the family modules; since then changed deliberately
// where a grid gained points (the fused attention's few-tile shapes; the decode attention's small
// batches and off-round caches) and where a group was added (device, the per-process device memory;
// no other group's points moved).
const std::vector<Pinned> kPinned{
    {"quick", 1, "copy", 33, 0x7c37bcb9f1cb3a16ULL},         {"quick", 1, "memory", 48, 0xa7ce394b22b57127ULL},
    {"quick", 1, "gemm", 59, 0x55559eccae2a916aULL},         {"quick", 1, "grouped", 20, 0x8e559d1cd85beab5ULL},
    {"quick", 1, "attention", 52, 0x654387be9e886f7bULL},    {"quick", 1, "host", 23, 0xe271ddc791f3c7c8ULL},
    {"quick", 1, "kernels", 99, 0x44231eda26cf0bc0ULL},      {"quick", 1, "concurrency", 12, 0x241edda1d6659d37ULL},
    {"quick", 1, "collective", 0, 0xcbf29ce484222325ULL},    {"quick", 1, "interference", 0, 0xcbf29ce484222325ULL},
    {"quick", 1, "device", 18, 0xa92c3d4e1e16e253ULL},       {"quick", 2, "copy", 33, 0x7c37bcb9f1cb3a16ULL},
    {"quick", 2, "memory", 48, 0xa7ce394b22b57127ULL},       {"quick", 2, "gemm", 59, 0x55559eccae2a916aULL},
    {"quick", 2, "grouped", 20, 0x8e559d1cd85beab5ULL},      {"quick", 2, "attention", 52, 0x654387be9e886f7bULL},
    {"quick", 2, "host", 23, 0xe271ddc791f3c7c8ULL},         {"quick", 2, "kernels", 99, 0x44231eda26cf0bc0ULL},
    {"quick", 2, "concurrency", 12, 0x241edda1d6659d37ULL},  {"quick", 2, "collective", 78, 0x979b63db974286ddULL},
    {"quick", 2, "interference", 19, 0xdccfbd50cc773281ULL}, {"quick", 2, "device", 18, 0xa92c3d4e1e16e253ULL},
    {"quick", 4, "copy", 33, 0x7c37bcb9f1cb3a16ULL},         {"quick", 4, "memory", 48, 0xa7ce394b22b57127ULL},
    {"quick", 4, "gemm", 59, 0x55559eccae2a916aULL},         {"quick", 4, "grouped", 20, 0x8e559d1cd85beab5ULL},
    {"quick", 4, "attention", 52, 0x654387be9e886f7bULL},    {"quick", 4, "host", 23, 0xe271ddc791f3c7c8ULL},
    {"quick", 4, "kernels", 99, 0x44231eda26cf0bc0ULL},      {"quick", 4, "concurrency", 12, 0x241edda1d6659d37ULL},
    {"quick", 4, "collective", 208, 0xa4d2138ae7711318ULL},  {"quick", 4, "interference", 19, 0xdccfbd50cc773281ULL},
    {"quick", 4, "device", 18, 0xa92c3d4e1e16e253ULL},       {"quick", 8, "copy", 33, 0x7c37bcb9f1cb3a16ULL},
    {"quick", 8, "memory", 48, 0xa7ce394b22b57127ULL},       {"quick", 8, "gemm", 59, 0x55559eccae2a916aULL},
    {"quick", 8, "grouped", 20, 0x8e559d1cd85beab5ULL},      {"quick", 8, "attention", 52, 0x654387be9e886f7bULL},
    {"quick", 8, "host", 23, 0xe271ddc791f3c7c8ULL},         {"quick", 8, "kernels", 99, 0x44231eda26cf0bc0ULL},
    {"quick", 8, "concurrency", 12, 0x241edda1d6659d37ULL},  {"quick", 8, "collective", 468, 0xdbb337db8d06f2c7ULL},
    {"quick", 8, "interference", 19, 0xdccfbd50cc773281ULL}, {"quick", 8, "device", 18, 0xa92c3d4e1e16e253ULL},
    {"full", 1, "copy", 55, 0x7e2950414bbcdb9cULL},          {"full", 1, "memory", 152, 0xd9851deef00770f7ULL},
    {"full", 1, "gemm", 460, 0xf7b560fa8eb9f9a2ULL},         {"full", 1, "grouped", 64, 0x60c7f5027d7940a7ULL},
    {"full", 1, "attention", 160, 0x05d77af35c99ed2dULL},    {"full", 1, "host", 31, 0xace0c3cedac0cd5cULL},
    {"full", 1, "kernels", 192, 0x912c179f4c48d66bULL},      {"full", 1, "concurrency", 24, 0xe96b14ba54a92331ULL},
    {"full", 1, "collective", 0, 0xcbf29ce484222325ULL},     {"full", 1, "interference", 0, 0xcbf29ce484222325ULL},
    {"full", 1, "device", 18, 0xa92c3d4e1e16e253ULL},        {"full", 2, "copy", 55, 0x7e2950414bbcdb9cULL},
    {"full", 2, "memory", 152, 0xd9851deef00770f7ULL},       {"full", 2, "gemm", 460, 0xf7b560fa8eb9f9a2ULL},
    {"full", 2, "grouped", 64, 0x60c7f5027d7940a7ULL},       {"full", 2, "attention", 160, 0x05d77af35c99ed2dULL},
    {"full", 2, "host", 31, 0xace0c3cedac0cd5cULL},          {"full", 2, "kernels", 192, 0x912c179f4c48d66bULL},
    {"full", 2, "concurrency", 24, 0xe96b14ba54a92331ULL},   {"full", 2, "collective", 156, 0x88edbc3e9439b513ULL},
    {"full", 2, "interference", 31, 0xe6242908435f161fULL},  {"full", 2, "device", 18, 0xa92c3d4e1e16e253ULL},
    {"full", 4, "copy", 55, 0x7e2950414bbcdb9cULL},          {"full", 4, "memory", 152, 0xd9851deef00770f7ULL},
    {"full", 4, "gemm", 460, 0xf7b560fa8eb9f9a2ULL},         {"full", 4, "grouped", 64, 0x60c7f5027d7940a7ULL},
    {"full", 4, "attention", 160, 0x05d77af35c99ed2dULL},    {"full", 4, "host", 31, 0xace0c3cedac0cd5cULL},
    {"full", 4, "kernels", 192, 0x912c179f4c48d66bULL},      {"full", 4, "concurrency", 24, 0xe96b14ba54a92331ULL},
    {"full", 4, "collective", 416, 0x2a3d21d2b4aee67aULL},   {"full", 4, "interference", 31, 0xe6242908435f161fULL},
    {"full", 4, "device", 18, 0xa92c3d4e1e16e253ULL},        {"full", 8, "copy", 55, 0x7e2950414bbcdb9cULL},
    {"full", 8, "memory", 152, 0xd9851deef00770f7ULL},       {"full", 8, "gemm", 460, 0xf7b560fa8eb9f9a2ULL},
    {"full", 8, "grouped", 64, 0x60c7f5027d7940a7ULL},       {"full", 8, "attention", 160, 0x05d77af35c99ed2dULL},
    {"full", 8, "host", 31, 0xace0c3cedac0cd5cULL},          {"full", 8, "kernels", 192, 0x912c179f4c48d66bULL},
    {"full", 8, "concurrency", 24, 0xe96b14ba54a92331ULL},   {"full", 8, "collective", 936, 0x7b25b57c75e275f3ULL},
    {"full", 8, "interference", 31, 0xe6242908435f161fULL},  {"full", 8, "device", 18, 0xa92c3d4e1e16e253ULL},
};

}  // namespace

TEST(CalibrationPlanPinned, EveryGroupIsPinnedInTheMeasurementOrder) {
  EXPECT_EQ(std::set<std::string>(op_groups().begin(), op_groups().end()),
            std::set<std::string>(kMeasurementOrder.begin(), kMeasurementOrder.end()));
}

TEST(CalibrationPlanPinned, EveryGroupsPointsAreTheSameForEveryModeAndGpuCount) {
  for (const Mode mode : {Mode::quick, Mode::full}) {
    for (const int gpus : {1, 2, 4, 8}) {
      for (const auto& group : kMeasurementOrder) {
        const auto points = plan(mode, gpus, {group});
        const auto it = std::find_if(kPinned.begin(), kPinned.end(), [&](const Pinned& p) {
          return p.mode == std::string(to_string(mode)) && p.gpus == gpus && p.group == group;
        });
        char got[160];
        std::snprintf(got, sizeof got, "{\"%s\", %d, \"%s\", %zu, 0x%016" PRIx64 "ULL},", to_string(mode), gpus,
                      group.c_str(), points.size(), checksum(points));
        if (it == kPinned.end()) {
          ADD_FAILURE() << "not pinned: " << got;
          continue;
        }
        EXPECT_EQ(points.size(), it->points) << got;
        EXPECT_EQ(checksum(points), it->checksum) << got;
      }
    }
  }
}

TEST(CalibrationPlanPinned, TheWholePlanIsTheGroupsInTheMeasurementOrder) {
  for (const Mode mode : {Mode::quick, Mode::full}) {
    for (const int gpus : {1, 2, 4, 8}) {
      std::vector<std::string> concatenated;
      for (const auto& group : kMeasurementOrder) {
        for (const auto& p : plan(mode, gpus, {group})) concatenated.push_back(point_text(p));
      }
      std::vector<std::string> whole;
      for (const auto& p : plan(mode, gpus, {})) whole.push_back(point_text(p));
      EXPECT_EQ(whole, concatenated) << to_string(mode) << " " << gpus;
      std::set<std::string> all(kMeasurementOrder.begin(), kMeasurementOrder.end());
      std::vector<std::string> every;
      for (const auto& p : plan(mode, gpus, all)) every.push_back(point_text(p));
      EXPECT_EQ(every, whole) << to_string(mode) << " " << gpus;
    }
  }
}

TEST(CalibrationPlanPinned, OpTableRows) {
  std::vector<std::string> rows;
  for (const auto& o : op_table())
    rows.push_back(o.name + " | " + o.group + " | " + o.family + " | " + o.what + " | " + o.definition);
  std::sort(rows.begin(), rows.end());
  Hash h;
  for (const auto& r : rows) h.add(r);
  char got[64];
  std::snprintf(got, sizeof got, "%zu 0x%016" PRIx64, rows.size(), h.h);
  EXPECT_STREQ(got, "112 0x5476b295be40050c");
}

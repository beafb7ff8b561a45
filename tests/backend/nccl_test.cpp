// NCCL wrappers: single-rank communicators on one GPU (every collective path), a peer that never
// joins (timeout + abort instead of a hang), and two-GPU collectives when two GPUs are present.
// CPU references compute in double from float inputs on purpose: float->double promotion is the
// intent here, so -Wdouble-promotion is silenced for this test file only.
#pragma GCC diagnostic ignored "-Wdouble-promotion"
#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "gpu_test_util.hpp"
#include "threewalls/backend/error.hpp"
#include "threewalls/backend/nccl.hpp"

namespace threewalls::backend {
namespace {
using namespace threewalls::backend::testing;
using scenarios::Group;
using scenarios::Layout;

TEST(Nccl, SingleRankCommunicatorRunsEveryCollective) {
  TW_REQUIRE_GPU();
  const Layout layout(1, 1, 1, 1, 1, 1, 1, 1);
  const UniqueIdTable ids = UniqueIdTable::create(layout, {Group::tp, Group::ep});
  CommTable table = CommTable::create(layout, 0, ids, {Group::tp, Group::ep}, std::chrono::seconds(60));
  ASSERT_TRUE(table.has(Group::tp));
  NcclComm& c = table.comm(Group::tp);
  EXPECT_EQ(c.size(), 1);
  const std::size_t n = 1000;
  const auto x = round_bf16(random_floats(n, 1));
  DeviceBuffer in = upload_bf16(x), out(n * 2);
  Stream s;
  const auto expect_copy = [&](const char* what) {
    c.wait_stream(s, what);
    EXPECT_EQ(rel_error(download_bf16(out, n), x), 0.0) << what;
    poison(out);
  };
  poison(out);
  all_reduce(in.data(), out.data(), n, c, s);
  expect_copy("all_reduce");
  all_gather(in.data(), out.data(), n, c, s);
  expect_copy("all_gather");
  reduce_scatter(in.data(), out.data(), n, c, s);
  expect_copy("reduce_scatter");
  broadcast(in.data(), out.data(), n, 0, c, s);
  expect_copy("broadcast");
  all_to_all(in.data(), out.data(), n, table.comm(Group::ep), s);
  expect_copy("all_to_all");
  all_to_all_v(in.data(), {n}, {0}, out.data(), {n}, {0}, c, s);
  expect_copy("all_to_all_v");
  c.check(ncclGroupStart(), "ncclGroupStart()", __FILE__, __LINE__);
  send(in.data(), n, 0, c, s);
  recv(out.data(), n, 0, c, s);
  c.check(ncclGroupEnd(), "ncclGroupEnd()", __FILE__, __LINE__);
  expect_copy("send/recv to self");
}

TEST(Nccl, MissingGroupInCommTableIsAnInputError) {
  TW_REQUIRE_GPU();
  CommTable empty;
  EXPECT_THROW(static_cast<void>(empty.comm(Group::dp)), InputError);
}

TEST(Nccl, PeerThatNeverJoinsTimesOutAndAbortsInsteadOfHanging) {
  TW_REQUIRE_GPU();
  // A 2-rank tp group of which only rank 0 exists in this process.
  const Layout layout(2, 1, 1, 1, 2, 1, 1, 2);
  const UniqueIdTable ids = UniqueIdTable::create(layout, {Group::tp});
  const auto start = std::chrono::steady_clock::now();
  try {
    CommTable t = CommTable::create(layout, 0, ids, {Group::tp}, std::chrono::milliseconds(3000));
    FAIL() << "communicator init with a missing peer succeeded";
  } catch (const DeviceError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("timed out"), std::string::npos) << m;
    EXPECT_NE(m.find("aborted"), std::string::npos) << m;
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(60));
}

TEST(Nccl, TwoGpusAllReduceAndAllToAllGiveTheRightData) {
  TW_REQUIRE_GPU();
  if (gpu_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices, found " << gpu_count();
  const Layout layout(1, 1, 2, 1, 1, 2, 1, 2);  // dp = 2, ep = 2
  const UniqueIdTable ids = UniqueIdTable::create(layout, {Group::dp, Group::ep});
  const std::size_t n = 4096;
  std::vector<std::vector<float>> inputs{random_floats(n, 1), random_floats(n, 2)};
  for (auto& v : inputs) v = round_bf16(v);
  std::vector<std::vector<float>> reduced(2), exchanged(2);
  std::vector<std::string> errors(2);
  auto rank_main = [&](int rank) {
    try {
      set_device(rank);
      set_thread_rank(rank);
      CommTable t = CommTable::create(layout, rank, ids, {Group::dp, Group::ep}, std::chrono::seconds(120));
      Stream s;
      DeviceBuffer in = upload_bf16(inputs[static_cast<std::size_t>(rank)]), out(n * 2), out2(n * 2);
      all_reduce(in.data(), out.data(), n, t.comm(Group::dp), s);
      all_to_all(in.data(), out2.data(), n / 2, t.comm(Group::ep), s);
      t.comm(Group::dp).wait_stream(s, "test");
      reduced[static_cast<std::size_t>(rank)] = download_bf16(out, n);
      exchanged[static_cast<std::size_t>(rank)] = download_bf16(out2, n);
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(rank)] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  ASSERT_EQ(errors[0], "");
  ASSERT_EQ(errors[1], "");
  std::vector<double> sum(n);
  for (std::size_t i = 0; i < n; ++i) sum[i] = double(inputs[0][i]) + inputs[1][i];
  EXPECT_LT(rel_error(reduced[0], sum), 1e-2);
  EXPECT_LT(rel_error(reduced[1], sum), 1e-2);
  // all-to-all: rank r receives half p of member p's input.
  for (int r = 0; r < 2; ++r) {
    for (int p = 0; p < 2; ++p) {
      for (std::size_t i = 0; i < n / 2; ++i) {
        ASSERT_EQ(exchanged[static_cast<std::size_t>(r)][static_cast<std::size_t>(p) * n / 2 + i],
                  inputs[static_cast<std::size_t>(p)][static_cast<std::size_t>(r) * n / 2 + i]);
      }
    }
  }
}

TEST(Nccl, VersionIsReported) {
  TW_REQUIRE_GPU();
  EXPECT_EQ(nccl_version().rfind("2.", 0), 0U) << nccl_version();
}

}  // namespace
}  // namespace threewalls::backend

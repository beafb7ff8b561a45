#include "threewalls/notebooks_export/synthetic.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

#include "threewalls/core/error.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/profiler/summary.hpp"

namespace threewalls::notebooks_export {

namespace tp = profiler;

long long synthetic_records_per_rank_step(const SyntheticSpec& s) {
  return static_cast<long long>(s.microbatches) * s.layers * 10 + 5;
}

namespace {

// One op of the shared op list. Base durations in microseconds (before scale, noise, slowdown).
struct OpDef {
  const char* phase;
  tp::Wall wall;
  double dur_us;
  const char* group;  // collective group, or nullptr
};

constexpr OpDef kFwd[5] = {{"attn_qkv_fwd", tp::Wall::compute, 120, nullptr},
                           {"attn_core_fwd", tp::Wall::compute, 200, nullptr},
                           {"moe_dispatch_fwd", tp::Wall::communication, 80, "ep"},
                           {"moe_experts_fwd", tp::Wall::compute, 250, nullptr},
                           {"moe_combine_fwd", tp::Wall::communication, 80, "ep"}};
constexpr OpDef kBwd[5] = {{"moe_combine_bwd", tp::Wall::communication, 80, "ep"},
                           {"moe_experts_bwd", tp::Wall::compute, 500, nullptr},
                           {"moe_dispatch_bwd", tp::Wall::communication, 80, "ep"},
                           {"attn_core_bwd", tp::Wall::compute, 400, nullptr},
                           {"attn_qkv_bwd", tp::Wall::compute, 240, nullptr}};
constexpr double kLaunchGapUs = 4.0;     // host time between layers: nothing recorded, the "host" wall
constexpr double kFlopsPerUs = 4e8;      // 400 TFLOP/s while computing
constexpr double kBytesPerUs = 3e6;      // 3 TB/s while moving memory

}  // namespace

void write_synthetic_run(const std::filesystem::path& dir, const SyntheticSpec& spec) {
  if (spec.ranks < 1 || spec.stages < 1 || spec.ranks % spec.stages != 0 || spec.steps < 1 || spec.layers < 1 ||
      spec.microbatches < 1) {
    throw InputError("synthetic run: ranks, stages, steps, layers, microbatches must be positive and stages divide ranks");
  }
  tp::SamplingConfig cfg;
  cfg.record_every_n_steps = 1;
  cfg.flush_every_n_steps = 5;
  tp::SamplingPolicy policy(cfg, spec.ranks);
  tp::RunHeader h = tp::make_header(spec.source, spec.ranks);
  h.scenario = {spec.scenario, "(synthetic)", "0000000000000000"};
  h.device = spec.source == "sim" ? "simulated h100" : "synthetic h100";
  if (spec.source == "sim") h.calibration_profile = tp::ProfileId{"synthetic", "(none)", "h100"};
  h.argv = {"threewalls", "(synthetic run)"};
  h.seed = spec.seed;
  h.settings["synthetic"] = OrderedJson{{"layers", spec.layers}, {"microbatches", spec.microbatches},
                                        {"noise", spec.noise},   {"slow_rank", spec.slow_rank},
                                        {"slow_phase", spec.slow_phase}, {"slow_factor", spec.slow_factor},
                                        {"slow_from", spec.slow_from}, {"slow_to", spec.slow_to}};
  const int per_stage = spec.ranks / spec.stages;
  for (int s = 0; s < spec.stages; ++s) {
    tp::RankClassInfo c;
    c.id = s;
    c.label = "stage " + std::to_string(s);
    c.pp_stage = s;
    for (int r = s * per_stage; r < (s + 1) * per_stage; ++r) c.ranks.push_back(r);
    h.rank_classes.push_back(std::move(c));
  }
  tp::WriterOptions wo;
  tp::RunDirWriter w(dir, h, policy, wo);
  const auto compute = w.stream_id("compute");
  const auto copy = w.stream_id("copy");
  const auto dp_comm = w.stream_id("dp_comm");
  const auto host = w.stream_id("host");

  std::mt19937_64 rng(spec.seed);
  std::normal_distribution<double> gauss(0.0, 1.0);
  const int n = spec.ranks;
  std::vector<double> t(static_cast<std::size_t>(n));
  std::vector<double> epoch(static_cast<std::size_t>(n));
  std::vector<tp::PhaseRecord> pending;  // one step's records, written with their step record
  double clock = 0.0;
  double model_flops = 0.0;

  for (int step = 0; step < spec.steps; ++step) {
    std::fill(epoch.begin(), epoch.end(), clock);
    std::fill(t.begin(), t.end(), clock);
    pending.clear();
    const bool slow_step = step >= spec.slow_from && (spec.slow_to < 0 || step <= spec.slow_to);
    auto duration = [&](int rank, const OpDef& op) {
      double d = op.dur_us * spec.time_scale;
      if (spec.noise > 0) d *= std::exp(spec.noise * gauss(rng));
      if (rank == spec.slow_rank && slow_step && op.wall == tp::Wall::compute &&
          (spec.slow_phase.empty() || spec.slow_phase == op.phase)) {
        d *= spec.slow_factor;
      }
      return d;
    };
    auto record = [&](int rank, const OpDef& op, std::uint32_t stream, int layer, int mb, double start, double dur,
                      tp::CoarseView coarse = tp::CoarseView::none) {
      tp::PhaseRecord p;
      p.step = step;
      p.rank = rank;
      p.phase = w.phase_id(op.phase);
      p.stream = stream;
      p.layer = layer;
      p.microbatch = mb;
      p.start_us = start - epoch[static_cast<std::size_t>(rank)];
      p.dur_us = dur;
      p.wall = op.wall;
      p.coarse = coarse;
      if (op.wall == tp::Wall::compute) p.flops = op.dur_us * spec.time_scale * kFlopsPerUs;
      p.bytes = op.dur_us * spec.time_scale * kBytesPerUs;
      if (op.group) {
        p.group = w.group_id(op.group);
        if (spec.write_group_id) p.group_id = 0;
        if (std::string(op.group) == "ep") p.tokens = 4096;
      }
      if (op.wall == tp::Wall::compute && rank == 0) model_flops += p.flops * n;
      pending.push_back(p);
    };
    // A local op on each rank's compute stream.
    auto local = [&](const OpDef& op, std::uint32_t stream, int layer, int mb,
                     tp::CoarseView coarse = tp::CoarseView::none) {
      for (int r = 0; r < n; ++r) {
        double d = duration(r, op);
        record(r, op, stream, layer, mb, t[static_cast<std::size_t>(r)], d, coarse);
        t[static_cast<std::size_t>(r)] += d;
      }
    };
    // A collective over every rank: each arrives when its stream reaches it; all finish together.
    auto collective = [&](const OpDef& op, std::uint32_t stream, int layer, int mb, std::vector<double>& clocks,
                          tp::CoarseView coarse = tp::CoarseView::none) {
      double last = *std::max_element(clocks.begin(), clocks.end());
      double end = last + duration(-1, op);
      for (int r = 0; r < n; ++r) {
        record(r, op, stream, layer, mb, clocks[static_cast<std::size_t>(r)], end - clocks[static_cast<std::size_t>(r)], coarse);
        clocks[static_cast<std::size_t>(r)] = end;
      }
    };
    auto run_op = [&](const OpDef& op, int layer, int mb) {
      if (op.group) {
        collective(op, compute, layer, mb, t);
      } else {
        local(op, compute, layer, mb);
      }
    };

    local({"data_h2d", tp::Wall::memory, 50, nullptr}, copy, tp::kAbsent, tp::kAbsent, tp::CoarseView::host_to_device);
    for (int mb = 0; mb < spec.microbatches; ++mb) {
      for (int l = 0; l < spec.layers; ++l) {
        for (const auto& op : kFwd) run_op(op, l, mb);
        for (auto& x : t) x += kLaunchGapUs;
      }
    }
    std::vector<double> dp_clock;
    for (int mb = 0; mb < spec.microbatches; ++mb) {
      if (mb == spec.microbatches - 1) dp_clock = t;  // gradient reduction overlaps the last backward
      for (int l = spec.layers - 1; l >= 0; --l) {
        for (const auto& op : kBwd) run_op(op, l, mb);
        for (auto& x : t) x += kLaunchGapUs;
      }
    }
    collective({"dp_grad_reduce_scatter", tp::Wall::communication, 2000.0 * spec.layers, "dp"}, dp_comm, tp::kAbsent,
               tp::kAbsent, dp_clock);
    for (int r = 0; r < n; ++r) t[static_cast<std::size_t>(r)] = std::max(t[static_cast<std::size_t>(r)], dp_clock[static_cast<std::size_t>(r)]);
    local({"optimizer", tp::Wall::memory, 300, nullptr}, compute, tp::kAbsent, tp::kAbsent);
    collective({"loss_allreduce", tp::Wall::communication, 20, "dp"}, compute, tp::kAbsent, tp::kAbsent, t,
               tp::CoarseView::training_metrics);
    local({"loss_host_read", tp::Wall::host, 10, nullptr}, host, tp::kAbsent, tp::kAbsent, tp::CoarseView::training_metrics);

    for (const auto& p : pending) w.add(p);
    for (int r = 0; r < n; ++r) {
      w.add(tp::StepRecord{step, r, epoch[static_cast<std::size_t>(r)],
                           t[static_cast<std::size_t>(r)] - epoch[static_cast<std::size_t>(r)]});
    }
    w.end_step(step);
    clock = *std::max_element(t.begin(), t.end()) + 100.0;  // host work between steps
  }
  w.close();

  tp::SummaryInputs in;
  in.model_flops_per_step = Flops(model_flops / spec.steps);
  in.tokens_per_step = static_cast<double>(n) * spec.microbatches * 4096.0;
  in.gpu = "h100";
  in.gpu_memory = gibibytes(80);
  if (spec.source == "real") {
    for (int r = 0; r < n; ++r) in.measured_peak_by_rank[r] = gibibytes(41.5 + 0.01 * r);
  } else {
    for (const auto& c : h.rank_classes) {
      in.memory_classes.push_back(tp::MemoryClass{c.id, c.label, static_cast<int>(c.ranks.size()), gibibytes(40),
                                                  {{"weights", gibibytes(10)}, {"gradients", gibibytes(10)},
                                                   {"optimizer", gibibytes(12)}, {"activations", gibibytes(8)}}});
    }
  }
  tp::SummaryBuilder sb(w.header(), in);
  w.write_summary(sb.json(w.kept_steps(), w.kept_phases(), w.names()));
}

}  // namespace threewalls::notebooks_export

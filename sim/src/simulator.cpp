#include "threewalls/sim/simulator.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>

#include "threewalls/calibration/cost_model.hpp"
#include "threewalls/calibration/profile.hpp"
#include "threewalls/calibration/resolve.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/core/version.hpp"
#include "threewalls/profiler/run_dir.hpp"
#include "threewalls/profiler/sampling.hpp"
#include "threewalls/records/records.hpp"
#include "threewalls/scenarios/layout.hpp"
#include "threewalls/scenarios/run_volume.hpp"
#include "threewalls/scenarios/stepper.hpp"
#include "threewalls/sim/simgrid_network.hpp"

namespace threewalls::sim {

namespace {

using scenarios::Group;
using scenarios::Op;
using scenarios::OpKind;
using scenarios::StepGraph;

// Step-ranged slowdowns active in `step`.
bool active(const scenarios::Slowdown& d, int step) {
  return step >= d.from_step && (d.to_step < 0 || step <= d.to_step);
}

// The records of `rank` (a member of class c) for one step: the records owner's templates with this
// step's times, appended to `ops` (those of the ops `only` lists when given), and the step's record.
profiler::StepRecord step_records(const records::OpRecords& templates, const StepResult& r, std::size_t c, int step,
                                  int rank, std::vector<profiler::PhaseRecord>& ops,
                                  const std::vector<std::uint32_t>* only = nullptr) {
  const ClassTimeline& tl = r.classes[c];
  profiler::StepRecord sr;
  sr.step = step;
  sr.rank = rank;
  sr.epoch_us = r.epoch * 1e6;
  sr.dur_us = tl.step_end * 1e6;
  const bool marked = tl.record_start.size() == tl.start.size() && tl.record_end.size() == tl.end.size();
  const std::size_t base = ops.size();
  if (only != nullptr) {
    templates.append_ops(rank, *only, ops);
  } else {
    templates.append_rank(rank, ops);
  }
  for (std::size_t k = 0; base + k < ops.size(); ++k) {
    const std::size_t i = only != nullptr ? (*only)[k] : k;
    profiler::PhaseRecord& p = ops[base + k];
    p.step = step;
    const double t0 = marked ? tl.record_start[i] : tl.start[i];
    const double t1 = marked ? tl.record_end[i] : tl.end[i];
    p.start_us = t0 * 1e6;
    p.dur_us = (t1 - t0) * 1e6;
    if (marked && i < tl.launch_wait.size()) p.launch_wait_us = static_cast<float>(tl.launch_wait[i] * 1e6);
  }
  return sr;
}

// SteadyRound's span in a step of `m` micro-batches: the starts (seconds from the step's start) of
// the last model chunk's forward of micro-batch m - 1 - microbatches and of m - 1 on the first pipeline
// stage's class where they are furthest apart; nullopt when a class of that stage lacks either.
std::optional<std::pair<double, double>> steady_round_span(const StepGraph& g, const StepResult& r, int m,
                                                           int microbatches) {
  if (microbatches < 1 || m - 1 - microbatches < 0) return std::nullopt;
  const int mb0 = m - 1 - microbatches;
  std::optional<std::pair<double, double>> span;
  for (std::size_t c = 0; c < g.classes.size(); ++c) {
    const scenarios::RankClass& rc = g.classes[c];
    if (rc.pp_stage != 0) continue;
    // Per micro-batch (m - 1 - round, m - 1): the last chunk of its forward and that chunk's first start.
    std::array<int, 2> chunk{-2, -2};
    std::array<double, 2> start{0.0, 0.0};
    for (std::size_t i = 0; i < rc.ops.size(); ++i) {
      const Op& op = rc.ops[i];
      const int k = op.microbatch == m - 1 ? 1 : op.microbatch == mb0 ? 0 : -1;
      if (k < 0 || (op.flags & (scenarios::kBackward | scenarios::kRecompute)) != 0) continue;
      if (op.wall != Wall::compute && op.wall != Wall::memory) continue;
      const auto kk = static_cast<std::size_t>(k);
      const double t = r.classes[c].start[i];
      if (op.chunk > chunk[kk]) {
        chunk[kk] = op.chunk;
        start[kk] = t;
      } else if (op.chunk == chunk[kk]) {
        start[kk] = std::min(start[kk], t);
      }
    }
    if (chunk[0] == -2 || chunk[1] == -2) return std::nullopt;
    if (!span || start[1] - start[0] > span->second - span->first) span.emplace(start[0], start[1]);
  }
  return span;
}

}  // namespace

SimResult simulate(const scenarios::Scenario& s, const OpCoster& coster, const ProfileInfoForHeader& profile,
                   const SimOptions& opt) {
  SimResult result;
  const int steps = opt.steps >= 0 ? opt.steps : s.run.steps;
  if (steps < 1) throw InputError("sim: --steps must be at least 1 (got " + std::to_string(steps) + ")");

  // The run's steps in order: an inference step's routing and expert cache follow from the steps before it.
  scenarios::Stepper stepper(s);
  StepGraph first = stepper.expand(0);
  const bool per_step = first.varies_per_step;
  result.model_flops_per_step = first.model_flops;
  result.tokens_per_step = first.tokens;
  for (const auto& rc : first.classes) {
    result.classes.push_back({rc.id, rc.label, rc.ranks, rc.pp_stage});
    result.ops_per_step += rc.ops.size();
  }
  MemoryOptions memory = opt.memory;
  if (!memory.nccl) memory.nccl = coster.nccl_memory();  // the profile's nccl.memory, when it has one
  if (!memory.device) memory.device = coster.device_memory();  // and its device.memory
  result.memory = memory_model(s, first, memory);

  Platform base(s.cluster);
  for (const auto& d : s.cluster.slowdowns) {
    if (d.rank < 0 || d.rank >= base.world()) {
      throw InputError("[cluster.slowdown] rank " + std::to_string(d.rank) + " is outside the world of " +
                       std::to_string(base.world()) + " ranks");
    }
    if (d.link == scenarios::SlowLink::none) {
      const auto& rc = first.class_of(d.rank);
      if (rc.ranks.size() > 1) {
        result.warnings.push_back("slowdown of rank " + std::to_string(d.rank) + " applies to its whole rank class " +
                                  std::to_string(rc.id) + " (" + rc.label + ", " + std::to_string(rc.ranks.size()) +
                                  " ranks): the expansion did not give it a class of its own");
      }
    }
  }
  if (!profile.not_measured.empty()) {
    result.warnings.push_back("calibration profile " + profile.id + " is not a measurement (" + profile.not_measured +
                              "): its predictions are estimates from facts and datasheets, not calibrated");
  }
  if (!profile.gpu.empty() && profile.gpu != scenarios::to_string(s.cluster.gpu)) {
    result.warnings.push_back("calibration profile " + profile.id + " is for " + profile.gpu + " but the cluster is " +
                              scenarios::to_string(s.cluster.gpu));
  }

  // Ops the coster prices with another kernel's fit than the one they run on, once per sentence.
  std::set<std::string> substitutions;
  auto note_substitutions = [&](const StepGraph& g) {
    if (!opt.substitution_warnings) return;
    for (const auto& rc : g.classes) {
      for (const Op& op : rc.ops) {
        if (auto w = coster.substitution(op); w && substitutions.insert(*w).second) result.warnings.push_back(*w);
      }
    }
  };
  note_substitutions(first);

  ExecutorOptions eo = executor_options_of(s);
  eo.fidelity = opt.fidelity;
  eo.allreduce = opt.allreduce;
  const Executor exec(coster, eo);

  // Run header and writer.
  OrderedJson simj;
  simj["fidelity"] = to_string(opt.fidelity);
  simj["network"] = SimGridEngine::settings();
  simj["network"]["used"] = opt.fidelity == Fidelity::flow;
  simj["allreduce_algorithm"] = to_string(opt.allreduce);
  simj["placement"] = "representatives";
  simj["platform"] = base.describe();
  simj["host_lane"] =
      "eager op: kernel_launch (collectives: collective_launch; GEMM, grouped GEMM, attention: their library-call "
      "launch costs when the profile has them) + event_record per cross-stream wait and event; CUDA-graph "
      "run: graph_launch + graph_node per op; per step: stream fence and join; recorded steps: two timing events per op; "
      "disk reads on the host thread";
  simj["hardware_queues"] = eo.hardware_queues;
  if (eo.framework != scenarios::Framework::cpp) {
    const HostCosts hc = coster.host_costs();
    // Whether the profile measured PyTorch's op bodies: asked of a forward GEMM (pytorch_host.linear_fwd).
    scenarios::Op probe;
    probe.kind = scenarios::OpKind::gemm;
    const bool bodies = coster.framework_body_host(probe, true).has_value();
    std::string fw = std::string(scenarios::to_string(eo.framework)) +
                     (bodies ? ": an op whose PyTorch body the profile measured (pytorch_host.*) pays that host time "
                               "in place of its launch; every other forward launch outside a CUDA-graph run also "
                               "pays host.framework_op"
                             : ": the profile has no pytorch_host.* families (PyTorch's host time per op body): "
                               "every forward launch outside a CUDA-graph run also pays host.framework_op");
    fw += hc.framework_backward_op ? ", every backward one host.framework_backward_op (the autograd engine) instead"
                                   : "; the profile has no host.framework_backward_op: backward launches pay "
                                     "host.framework_op";
    fw += hc.framework_sync ? "; device-to-host reads cost host.framework_sync"
                            : "; the profile has no host.framework_sync: device-to-host reads cost host.gpu_read";
    simj["framework"] = fw;
    if (!hc.framework_backward_op || !hc.framework_sync) {
      result.warnings.push_back(std::string("calibration profile ") + profile.id + " lacks " +
                                (!hc.framework_backward_op ? "host.framework_backward_op" : "") +
                                (!hc.framework_backward_op && !hc.framework_sync ? " and " : "") +
                                (!hc.framework_sync ? "host.framework_sync" : "") +
                                ": run.framework = \"pytorch_eager\" is charged without them (python3 -m "
                                "threewalls.bench.framework measures them)");
    }
  }
  simj["memory"] = OrderedJson{{"fused_attention", opt.memory.fused_attention}, {"dropout", opt.memory.dropout}};
  simj["profile_reason"] = profile.reason;
  simj["host_scale"] = opt.host_scale;
  simj["disk_scale"] = opt.disk_scale;
  OrderedJson settings = OrderedJson::object();
  settings["steps"] = steps;
  settings["warmup_steps_simulated"] = 0;
  settings["simulator"] = simj;
  // A simulation is a function of its inputs (scenario, profile, settings, seed): its run id is
  // derived from them, so the same inputs give byte-identical run directories.
  const std::string inputs = s.content_hash + "|" + s.name + "|" + profile.id + "|" + std::to_string(s.world_size()) +
                             "|" + std::to_string(s.run.seed) + "|" + std::string(tool_version()) + "|" +
                             settings.dump();
  profiler::RunHeader header = records::run_header("sim", s, first, inputs);
  header.calibration_profile = profiler::ProfileId{profile.id, profile.path, profile.gpu};
  header.device = std::string("simulated ") + scenarios::to_string(s.cluster.gpu);
  header.argv = opt.argv;
  header.start_time = opt.start_time;
  header.settings = std::move(settings);

  // The scenario's sampling: which steps and ranks the run directory records, and, as the profiler's
  // timing markers cost host time in a real run's recorded steps (docs/simulator.md, "Host lane"),
  // which steps and classes carry them, whether or not this simulation writes a run directory.
  const profiler::SamplingPolicy sampling(records::sampling_config(s, first), s.world_size());
  auto timing_of = [&](const StepGraph& g, int step) {
    std::vector<Timing> t(g.classes.size(), Timing::none);
    if (!sampling.enabled() || !sampling.records(step)) return t;
    const Timing kind =
        s.run.profiler.granularity == scenarios::Granularity::coarse ? Timing::coarse_ops : Timing::every_op;
    for (std::size_t c = 0; c < g.classes.size(); ++c) {
      for (int r : g.classes[c].ranks) {
        if (sampling.records_rank(r)) {
          t[c] = kind;
          break;
        }
      }
    }
    return t;
  };

  std::unique_ptr<profiler::RunDirWriter> writer;
  profiler::Names local_names;
  if (!opt.out_dir.empty() && s.run.profiler.enabled) {
    profiler::WriterOptions wo;
    wo.overwrite = opt.overwrite;
    wo.keep_records = false;
    writer = std::make_unique<profiler::RunDirWriter>(opt.out_dir, header, sampling, wo);
    result.run_dir = opt.out_dir;
    if (s.run.profiler.recorded == scenarios::RecordedRanks::automatic &&
        records::recorded_ranks(s, first) == scenarios::RecordedRanks::representatives) {
      result.warnings.push_back(
          "run.profiler.ranks = \"auto\" records one rank of each rank class (" +
          std::to_string(writer->policy().recording_ranks().size()) + " of " + std::to_string(s.world_size()) +
          " ranks): every rank would write more than " + std::to_string(scenarios::kAutoEveryRankMaxBytes >> 30) +
          " GiB (the ranks of a class repeat its phases); set run.profiler.ranks = \"all\" to record every rank");
    }
  }
  profiler::Names& names = writer ? writer->names() : local_names;

  // Records of every class representative, all steps, for the summary (the simulator knows them all).
  std::vector<profiler::StepRecord> sum_steps;
  std::vector<profiler::PhaseRecord> sum_phases;
  // Inference: what the records cannot carry (summary.hpp, InferenceStepInput), per step.
  std::map<int, profiler::InferenceStepInput> inference_steps;

  // Without phase statistics and a run directory, the summary reads of the phase records only those
  // of each step's critical rank, the communication and coarse-view records, and whether one is
  // detailed (profiler::summarize): of the other classes, only those records are kept (and the first
  // one that is detailed), in their order.
  const bool summary_records_only = !opt.phase_stats && !writer;
  std::vector<std::uint32_t> kept;
  std::vector<std::size_t> class_begin;
  // Records of one simulated step: the summary's (representatives) and the files' (recording ranks).
  // SimOptions::steady_round: the first step's span (seconds from its start).
  std::optional<std::pair<double, double>> round_span;
  auto emit = [&](const StepGraph& g, const StepResult& r, int step) {
    if (step == 0 && opt.steady_round > 0 && opt.steady_rounds > 0 && s.train) {
      round_span = steady_round_span(g, r, s.train->num_microbatches, opt.steady_round * opt.steady_rounds);
    }
    if (!per_step && sum_phases.empty() && !summary_records_only) {
      // Every step runs the first step's ops: one record per op of each class representative.
      sum_steps.reserve(first.classes.size() * static_cast<std::size_t>(steps));
      sum_phases.reserve(result.ops_per_step * static_cast<std::size_t>(steps));
    }
    const records::OpRecords templates(g, names);
    if (auto in = records::inference_step(g)) inference_steps[step] = std::move(*in);
    // The summary keeps every class's records of every step: grow it once per step, geometrically
    // (a no-op when the run's records were reserved above).
    std::size_t adding = 0;
    for (const auto& rc : g.classes) adding += rc.ops.size();
    if (!summary_records_only && sum_phases.capacity() < sum_phases.size() + adding) {
      sum_phases.reserve(std::max(sum_phases.size() + adding, 2 * sum_phases.capacity()));
    }
    // The critical class: the longest step, the lowest rank on ties (summarize's rule).
    std::size_t critical = 0;
    for (std::size_t c = 1; c < g.classes.size(); ++c) {
      const double d = r.classes[c].step_end * 1e6, longest = r.classes[critical].step_end * 1e6;
      if (d > longest || (d == longest && g.classes[c].representative() < g.classes[critical].representative())) {
        critical = c;
      }
    }
    // The summary's records of class c, when it keeps them whole: sum_steps[first_step + c] and
    // sum_phases[class_begin[c], class_begin[c + 1]).
    const std::size_t first_step = sum_steps.size();
    class_begin.assign(1, sum_phases.size());
    for (std::size_t c = 0; c < g.classes.size(); ++c) {
      const int rep = g.classes[c].representative();
      if (!summary_records_only || c == critical) {
        sum_steps.push_back(step_records(templates, r, c, step, rep, sum_phases));
        class_begin.push_back(sum_phases.size());
        continue;
      }
      kept.clear();
      bool detailed = false;
      const std::vector<Op>& ops = g.classes[c].ops;
      for (std::uint32_t i = 0; i < ops.size(); ++i) {
        const bool coarse = records::coarse_view(ops[i]) != profiler::CoarseView::none;
        if (ops[i].wall == Wall::communication || coarse || !detailed) kept.push_back(i);
        detailed = detailed || !coarse;
      }
      sum_steps.push_back(step_records(templates, r, c, step, rep, sum_phases, &kept));
    }
    if (writer && writer->policy().records(step)) {
      std::vector<profiler::PhaseRecord> ops;
      for (int rank : writer->policy().recording_ranks()) {
        if (!writer->records(step, rank)) continue;
        const auto c = static_cast<std::size_t>(g.class_of_rank.at(static_cast<std::size_t>(rank)));
        if (rank == g.classes[c].representative()) {
          // A representative's records are the summary's (a writer makes the summary keep them whole).
          writer->add(sum_steps[first_step + c]);
          writer->add(std::span(sum_phases).subspan(class_begin[c], class_begin[c + 1] - class_begin[c]));
          continue;
        }
        ops.clear();
        writer->add(step_records(templates, r, c, step, rank, ops));
        writer->add(ops);
      }
    }
    if (writer) writer->end_step(step);
  };

  auto run_all = [&](FlowEngine* engine) {
    double epoch = engine != nullptr ? engine->now() : 0.0;
    std::vector<double> link_bw;
    for (const Link& l : base.links()) link_bw.push_back(l.bandwidth.value);
    // A training step whose slowdowns are those of the previous step is that step again: it is
    // simulated once and its timeline reused at the new epoch (every step starts on an idle
    // machine), which keeps long runs cheap and their steps identical.
    std::optional<StepResult> previous;
    std::vector<bool> previous_active;
    std::vector<Timing> previous_timing;
    for (int step = 0; step < steps; ++step) {
      std::vector<bool> now_active;
      for (const auto& d : s.cluster.slowdowns) now_active.push_back(active(d, step));
      const std::vector<Timing> now_timing = per_step ? std::vector<Timing>() : timing_of(first, step);
      if (!per_step && previous && now_active == previous_active && now_timing == previous_timing) {
        previous->epoch = epoch;
        epoch = previous->epoch + previous->duration;
        emit(first, *previous, step);
        continue;
      }
      StepGraph expanded;
      const StepGraph* g = &first;
      if (per_step && step > 0) {
        expanded = stepper.expand(step);
        g = &expanded;
        note_substitutions(expanded);
      }
      // Slowdowns of this step.
      Platform platform = base;
      std::vector<double> factor(g->classes.size(), 1.0);
      for (const auto& d : s.cluster.slowdowns) {
        if (!active(d, step)) continue;
        if (d.link == scenarios::SlowLink::none) {
          factor[static_cast<std::size_t>(g->class_of_rank.at(static_cast<std::size_t>(d.rank)))] *= d.factor;
        } else {
          platform.slow_link(d.rank, d.link, d.factor);
        }
      }
      if (engine != nullptr) {
        for (std::uint32_t id = 0; id < platform.links().size(); ++id) {
          const double bw = platform.links()[id].bandwidth.value;
          if (bw != link_bw[id]) {
            engine->set_link_bandwidth(id, BytesPerSecond(bw));
            link_bw[id] = bw;
          }
        }
      }
      const std::vector<Timing> timing = per_step ? timing_of(*g, step) : now_timing;
      StepResult r = exec.run_step(*g, platform, factor, epoch, engine, timing);
      if (!std::isfinite(r.duration) || !std::isfinite(r.epoch + r.duration)) {
        throw InputError(s.source_path + ": step " + std::to_string(step) + " would take " +
                         std::to_string(r.duration) +
                         " s, which is not a finite time; the cluster's rates and latencies or the calibration "
                         "profile's values are out of range");
      }
      result.collectives += r.collectives;
      result.flows += r.flows_started;
      epoch = r.epoch + r.duration;
      emit(*g, r, step);
      previous = std::move(r);
      previous_active = now_active;
      previous_timing = now_timing;
    }
  };

  if (opt.fidelity == Fidelity::flow) {
    // The platform holds the GPUs the flows reach only: those of the step graph, or, when the graph
    // varies per step (inference), of every step's graph, expanded once more here in order by a
    // stepper of its own (unless the first step's flows already reach every GPU).
    std::vector<int> ranks = exec.flow_ranks(first);
    if (per_step && static_cast<int>(ranks.size()) < base.world()) {
      scenarios::Stepper scan(s);
      for (int step = 1; step < steps; ++step) {
        const std::vector<int> more = exec.flow_ranks(scan.expand(step));
        ranks.insert(ranks.end(), more.begin(), more.end());
      }
      std::sort(ranks.begin(), ranks.end());
      ranks.erase(std::unique(ranks.begin(), ranks.end()), ranks.end());
    }
    SimGridEngine engine(base, ranks, opt.solo_flows);
    engine.run([&]() { run_all(&engine); });
  } else {
    run_all(nullptr);
  }

  // Summary.
  profiler::SummaryInputs in = records::summary_inputs(s, first);
  in.gpu_memory = s.cluster.gpu_memory;
  for (const ClassMemory& cm : result.memory.classes) {
    profiler::MemoryClass mc;
    mc.id = cm.id;
    mc.label = cm.label;
    mc.ranks = cm.ranks;
    mc.peak = cm.peak();
    mc.breakdown = {{"weights", cm.breakdown.weights},         {"gradients", cm.breakdown.gradients},
                    {"optimizer", cm.breakdown.optimizer},     {"activations", cm.breakdown.activations},
                    {"buffers", cm.breakdown.buffers},         {"graph_pools", cm.breakdown.graph_pools}};
    in.memory_classes.push_back(std::move(mc));
  }
  in.oom = result.memory.oom();
  in.inference_steps = std::move(inference_steps);
  if (round_span) in.wall_marks_us = {round_span->first * 1e6, round_span->second * 1e6};
  const profiler::SummaryBuilder builder(header, in);
  result.summary = builder.build(sum_steps, sum_phases, names, opt.phase_stats);
  if (round_span) {
    SteadyRound sr;
    sr.microbatches = opt.steady_round;
    sr.rounds = opt.steady_rounds;
    sr.period_us = (round_span->second - round_span->first) * 1e6 / opt.steady_rounds;
    const profiler::StepSummary& first_step = result.summary.steps.front();
    if (first_step.walls_until.size() == 2) {
      sr.walls = first_step.walls_until[1];
      *sr.walls -= first_step.walls_until[0];
      *sr.walls *= 1.0 / opt.steady_rounds;
    }
    result.steady_round = sr;
  }
  result.summary_json = builder.to_json(result.summary);
  if (writer) {
    writer->write_summary(result.summary_json);
    writer->close();
  }
  return result;
}

SimResult simulate(const scenarios::Scenario& s, const std::string& calibration, const SimOptions& opt) {
  const std::string spec = calibration.empty() ? s.calibration_profile : calibration;
  const std::filesystem::path scenario_dir =
      s.source_path.empty() ? std::filesystem::path() : std::filesystem::path(s.source_path).parent_path();
  const calibration::ResolvedProfile resolved =
      calibration::resolve_profile(spec, scenarios::to_string(s.cluster.gpu), scenario_dir);
  const calibration::Profile profile = calibration::Profile::load(resolved.path);
  const calibration::CostModel model(profile);
  const CostModelCoster coster(model, opt.host_scale, opt.disk_scale, s.run.framework);
  ProfileInfoForHeader info{profile.id(), resolved.path.string(), profile.hardware().gpu_kind, resolved.reason, ""};
  // A synthetic profile measured no GPU (its [hardware] machine says so and how it was made).
  if (profile.hardware().gpus_seen == 0) info.not_measured = profile.hardware().machine;
  return simulate(s, coster, info, opt);
}

}  // namespace threewalls::sim

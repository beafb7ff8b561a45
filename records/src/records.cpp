#include "threewalls/records/records.hpp"

#include <algorithm>
#include <array>

#include "threewalls/scenarios/run_volume.hpp"

namespace threewalls::records {

using scenarios::Group;
using scenarios::Op;
using scenarios::OpKind;
using scenarios::StepGraph;

namespace {
constexpr int kGroups = static_cast<int>(Group::embedding) + 1;
}  // namespace

profiler::RunHeader run_header(std::string_view source, const scenarios::Scenario& s, const StepGraph& g,
                               std::optional<std::string_view> content_key) {
  profiler::RunHeader header = profiler::make_header(std::string(source), s.world_size(), content_key);
  header.scenario = {s.name, s.source_path, s.content_hash};
  header.seed = s.run.seed;
  for (const auto& rc : g.classes) header.rank_classes.push_back({rc.id, rc.label, rc.ranks, rc.pp_stage});
  return header;
}

profiler::SamplingConfig sampling_config(const scenarios::Scenario& s, const StepGraph& g) {
  const scenarios::ProfilerSpec& ps = s.run.profiler;
  profiler::SamplingConfig c;
  c.enabled = ps.enabled;
  c.start_step = ps.start_step;
  c.end_step = ps.end_step;
  c.record_every_n_steps = ps.record_every_n_steps;
  c.flush_every_n_steps = ps.flush_every_n_steps;
  c.granularity = ps.granularity;
  if (recorded_ranks(s, g) == scenarios::RecordedRanks::representatives) {
    for (const auto& rc : g.classes) c.ranks.push_back(rc.representative());
    std::sort(c.ranks.begin(), c.ranks.end());
  } else {
    c.ranks = ps.ranks;
  }
  return c;
}

scenarios::RecordedRanks recorded_ranks(const scenarios::Scenario& s, const StepGraph& g) {
  const scenarios::RecordedRanks r = s.run.profiler.recorded;
  if (r != scenarios::RecordedRanks::automatic) return r;
  std::size_t ops = 0;
  for (const auto& rc : g.classes) ops = std::max(ops, rc.ops.size());
  return scenarios::auto_records_every_rank(s, static_cast<long long>(ops)) ? scenarios::RecordedRanks::all
                                                                            : scenarios::RecordedRanks::representatives;
}

profiler::CoarseView coarse_view(const Op& op) {
  if ((op.flags & scenarios::kDataLoad) != 0) return profiler::CoarseView::host_to_device;
  if ((op.flags & scenarios::kMetrics) != 0) return profiler::CoarseView::training_metrics;
  return profiler::CoarseView::none;
}

OpRecords::OpRecords(const StepGraph& g, profiler::Names& names) : g_(&g) {
  for (const std::string& p : g.phases) phase_.push_back(names.phases.intern(p));
  for (const auto& s : g.streams) stream_.push_back(names.streams.intern(s.name));
  for (int v = 0; v < kGroups; ++v) {
    const auto grp = static_cast<Group>(v);
    group_.push_back(grp == Group::none ? profiler::kNoName : names.groups.intern(scenarios::to_string(grp)));
  }
}

OpRecords::OpRecords(const StepGraph& g, profiler::RecordSink& sink) : g_(&g) {
  phase_.assign(g.phases.size(), 0);
  stream_.assign(g.streams.size(), 0);
  group_.assign(kGroups, profiler::kNoName);
  if (!sink.enabled()) return;
  for (std::size_t i = 0; i < g.phases.size(); ++i) phase_[i] = sink.phase_id(g.phases[i]);
  for (std::size_t i = 0; i < g.streams.size(); ++i) stream_[i] = sink.stream_id(g.streams[i].name);
  for (int v = 1; v < kGroups; ++v)
    group_[static_cast<std::size_t>(v)] = sink.group_id(scenarios::to_string(static_cast<Group>(v)));
}

std::vector<profiler::PhaseRecord> OpRecords::of_rank(int rank) const {
  std::vector<profiler::PhaseRecord> out;
  append_rank(rank, out);
  return out;
}

void OpRecords::append_rank(int rank, std::vector<profiler::PhaseRecord>& out) const {
  append(
      rank, g_->class_of(rank).ops.size(), [](std::size_t k) { return k; }, out);
}

void OpRecords::append_ops(int rank, std::span<const std::uint32_t> ops,
                           std::vector<profiler::PhaseRecord>& out) const {
  append(
      rank, ops.size(), [&](std::size_t k) { return static_cast<std::size_t>(ops[k]); }, out);
}

template <typename OpIndex>
void OpRecords::append(int rank, std::size_t n, const OpIndex& op_index,
                       std::vector<profiler::PhaseRecord>& out) const {
  const StepGraph& g = *g_;
  const scenarios::RankClass& rc = g.class_of(rank);
  // group_id (run_dir.md): which instance of a group a collective runs in, its lowest global rank.
  std::array<std::int32_t, kGroups> group_id;
  group_id.fill(profiler::kAbsent - 1);
  auto instance_of = [&](Group grp) {
    std::int32_t& id = group_id[static_cast<std::size_t>(grp)];
    if (id == profiler::kAbsent - 1) {
      const std::vector<int> members = g.layout.group_members(grp, rank);
      id = members.empty() ? profiler::kAbsent : *std::min_element(members.begin(), members.end());
    }
    return id;
  };
  const std::size_t base = out.size();
  out.resize(base + n);
  for (std::size_t k = 0; k < n; ++k) {
    const Op& op = rc.ops[op_index(k)];
    profiler::PhaseRecord& r = out[base + k];
    r.rank = rank;
    r.phase = phase_[op.phase];
    r.stream = stream_[op.stream];
    r.layer = op.layer;
    r.microbatch = op.microbatch;
    r.bytes = op.bytes;
    r.flops = op.flops;
    r.expert = op.expert;
    if (op.kind == OpKind::send || op.kind == OpKind::recv) r.peer = g.layout.peer_of(op, rank);
    if (op.is_comm()) r.group = group_[static_cast<std::size_t>(op.group)];
    if (op.kind == OpKind::collective && op.group != Group::none) r.group_id = instance_of(op.group);
    r.tokens = op.tokens;
    r.wall = op.wall;
    r.coarse = coarse_view(op);
  }
}

profiler::SummaryInputs summary_inputs(const scenarios::Scenario& s, const StepGraph& g) {
  profiler::SummaryInputs in;
  in.model_flops_per_step = Flops(g.model_flops);
  in.tokens_per_step = g.tokens;
  in.gpu = to_string(s.cluster.gpu);
  in.gpu_peak = gpu_spec(s.cluster.gpu).peak_bf16;
  return in;
}

std::optional<profiler::InferenceStepInput> inference_step(const StepGraph& g) {
  if (g.step_kind != "prefill" && g.step_kind != "decode") return std::nullopt;
  profiler::InferenceStepInput in;
  in.kind = g.step_kind;
  in.tokens = g.tokens;
  in.model_flops = g.model_flops;
  for (const auto& rc : g.classes) {
    for (int r : rc.ranks) in.by_rank[r] = {rc.experts_activated, rc.experts_cache_hits};
  }
  return in;
}

}  // namespace threewalls::records

// Chrome Trace Event Format (the JSON object form), as Perfetto and chrome://tracing read it:
// https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
// "X" complete events need name, ph, ts, dur, pid, tid (ts and dur in microseconds); "M" metadata
// events process_name / thread_name / *_sort_index carry their value in args.
#include <map>
#include <set>
#include <unordered_map>

#include "output.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/notebooks_export/export.hpp"

namespace threewalls::notebooks_export {

using profiler::kAbsent;
using profiler::kNoName;

const char* to_string(ExportFormat f) {
  switch (f) {
    case ExportFormat::perfetto: return "perfetto";
    case ExportFormat::csv: return "csv";
    case ExportFormat::notebook: return "notebook";
    case ExportFormat::html: return "html";
  }
  return "?";
}

ExportFormat parse_export_format(const std::string& s) {
  if (s == "perfetto") return ExportFormat::perfetto;
  if (s == "csv") return ExportFormat::csv;
  if (s == "notebook") return ExportFormat::notebook;
  if (s == "html") return ExportFormat::html;
  throw InputError("--format: unknown format \"" + s + "\"; allowed: perfetto, csv, notebook, html");
}

namespace {

// Events are separated by ",\n" written before every event but the first (JSON has no trailing comma).
void begin_event(std::string& out, bool& first) {
  if (!first) out += ",\n";
  first = false;
}

void metadata(std::string& out, bool& first, const char* name, long long pid, long long tid, const std::string& key,
              const std::string& value_json) {
  begin_event(out, first);
  out += "{\"name\":\"";
  out += name;
  out += "\",\"ph\":\"M\",\"pid\":";
  detail::append_int(out, pid);
  out += ",\"tid\":";
  detail::append_int(out, tid);
  out += ",\"args\":{\"";
  out += key;
  out += "\":";
  out += value_json;
  out += "}}";
}

std::string json_str(const std::string& s) {
  std::string out;
  append_json_string(out, s);
  return out;
}

}  // namespace

void write_perfetto(const std::vector<const profiler::RunData*>& runs, const std::filesystem::path& path,
                    const ExportOptions& options) {
  if (runs.empty()) throw InputError("export: no run directory given");
  for (const auto* r : runs) {
    if (r->header.world_size >= kPidStride) {
      throw InputError(r->dir.string() + ": world size " + std::to_string(r->header.world_size) +
                       " does not fit the trace's pid numbering (at most " + std::to_string(kPidStride - 1) + " ranks)");
    }
  }
  detail::OutFile f(path, options.force);
  std::string& out = f.buf();
  out += "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"generator\":\"threewalls export\",\"runs\":[";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    if (i) out += ',';
    out += json_str(runs[i]->label());
  }
  out += "]},\n\"traceEvents\":[\n";
  bool first = true;
  for (std::size_t ri = 0; ri < runs.size(); ++ri) {
    const profiler::RunData& run = *runs[ri];
    const long long base = static_cast<long long>(ri) * kPidStride;
    const std::string run_name = "run " + std::to_string(ri) + " " + run.header.source + ":" + run.header.scenario.name;
    // Metadata: one process per recorded rank, one thread per stream it used, thread 0 for steps.
    std::map<int, std::set<std::uint32_t>> streams_of_rank;
    for (int r : run.header.ranks) streams_of_rank[r];
    for (const auto& p : run.phases) streams_of_rank[p.rank].insert(p.stream);
    for (const auto& s : run.steps) streams_of_rank[s.rank];
    for (const auto& [rank, streams] : streams_of_rank) {
      const long long pid = base + rank;
      metadata(out, first, "process_name", pid, 0, "name", json_str(run_name + " rank " + std::to_string(rank)));
      metadata(out, first, "process_sort_index", pid, 0, "sort_index", std::to_string(pid));
      metadata(out, first, "thread_name", pid, 0, "name", "\"steps\"");
      metadata(out, first, "thread_sort_index", pid, 0, "sort_index", "0");
      for (auto s : streams) {
        metadata(out, first, "thread_name", pid, 1 + static_cast<long long>(s), "name", run.names.streams.json(s));
        metadata(out, first, "thread_sort_index", pid, 1 + static_cast<long long>(s), "sort_index", std::to_string(1 + s));
      }
    }
    std::unordered_map<std::uint64_t, double> epoch;
    for (const auto& s : run.steps) {
      epoch[(static_cast<std::uint64_t>(s.rank) << 32U) | static_cast<std::uint32_t>(s.step)] = s.epoch_us;
      begin_event(out, first);
      out += "{\"name\":\"step ";
      detail::append_int(out, s.step);
      out += "\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":";
      detail::append_us(out, s.epoch_us);
      out += ",\"dur\":";
      detail::append_us(out, s.dur_us);
      out += ",\"pid\":";
      detail::append_int(out, base + s.rank);
      out += ",\"tid\":0,\"args\":{\"step\":";
      detail::append_int(out, s.step);
      out += "}}";
      f.maybe_flush();
    }
    for (const auto& p : run.phases) {
      auto it = epoch.find((static_cast<std::uint64_t>(p.rank) << 32U) | static_cast<std::uint32_t>(p.step));
      const double e = it == epoch.end() ? 0.0 : it->second;  // readers guarantee a step record
      begin_event(out, first);
      out += "{\"name\":";
      out += run.names.phases.json(p.phase);
      out += ",\"cat\":\"";
      out += profiler::to_string(p.wall);
      out += "\",\"ph\":\"X\",\"ts\":";
      detail::append_us(out, e + p.start_us);
      out += ",\"dur\":";
      detail::append_us(out, p.dur_us);
      out += ",\"pid\":";
      detail::append_int(out, base + p.rank);
      out += ",\"tid\":";
      detail::append_int(out, 1 + static_cast<long long>(p.stream));
      out += ",\"args\":{\"step\":";
      detail::append_int(out, p.step);
      if (p.layer != kAbsent) {
        out += ",\"layer\":";
        detail::append_int(out, p.layer);
      }
      if (p.microbatch != kAbsent) {
        out += ",\"mb\":";
        detail::append_int(out, p.microbatch);
      }
      if (p.expert != kAbsent) {
        out += ",\"expert\":";
        detail::append_int(out, p.expert);
      }
      out += ",\"bytes\":";
      append_json_number(out, p.bytes);
      out += ",\"flops\":";
      append_json_number(out, p.flops);
      if (p.peer != kAbsent) {
        out += ",\"peer\":";
        detail::append_int(out, p.peer);
      }
      if (p.group != kNoName) {
        out += ",\"group\":";
        out += run.names.groups.json(p.group);
      }
      if (p.group_id != kAbsent) {
        out += ",\"group_id\":";
        detail::append_int(out, p.group_id);
      }
      if (p.tokens != kAbsent) {
        out += ",\"tokens\":";
        detail::append_int(out, p.tokens);
      }
      if (p.launch_wait_us > 0.0F) {
        out += ",\"launch_wait_us\":";
        append_json_number(out, static_cast<double>(p.launch_wait_us));
      }
      out += "}}";
      f.maybe_flush();
    }
  }
  out += "\n]}\n";
  f.close();
}

}  // namespace threewalls::notebooks_export

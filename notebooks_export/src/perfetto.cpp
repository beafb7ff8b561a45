// Chrome Trace Event Format (the JSON object form), as Perfetto and chrome://tracing read it:
// https://docs.google.com/document/d/1CvAClvFfyA5R-PhYUmn5OOQtYMH4h6I0nSsKchNAySU
// "X" complete events need name, ph, ts, dur, pid, tid (ts and dur in microseconds); "M" metadata
// events process_name / thread_name / *_sort_index carry their value in args.
#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <unordered_map>
#include <utility>
#include <vector>

#include "output.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/notebooks_export/export.hpp"
#include "threewalls/profiler/summary.hpp"

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

// An op's span on the trace's clock in whole nanoseconds: both ends rounded from microseconds.
struct Span {
  long long start = 0;
  long long end = 0;
};
Span span_ns(double start_us, double dur_us) {
  return Span{std::llround(start_us * 1000.0), std::llround((start_us + dur_us) * 1000.0)};
}

// Peak memory of each recorded rank from summary.json, as (part, bytes): the memory model's
// breakdown of the rank's class (simulated runs), or the measured peak (real runs). Empty without a
// summary.
std::map<int, std::vector<std::pair<std::string, double>>> memory_peaks(const profiler::RunData& run) {
  std::map<int, std::vector<std::pair<std::string, double>>> out;
  if (!run.summary || !run.summary->contains("memory") || !run.summary->at("memory").is_object()) return out;
  const Json& mem = run.summary->at("memory");
  if (mem.contains("measured_peak_bytes_by_rank") && mem.at("measured_peak_bytes_by_rank").is_object()) {
    for (const auto& [rank, bytes] : mem.at("measured_peak_bytes_by_rank").items()) {
      if (bytes.is_number()) out[std::stoi(rank)].emplace_back("measured peak", bytes.get<double>());
    }
  }
  if (!out.empty() || !mem.contains("classes") || !mem.at("classes").is_array()) return out;
  std::map<int, const Json*> by_class;
  for (const Json& c : mem.at("classes")) {
    if (c.contains("class") && c.at("class").is_number_integer()) by_class[c.at("class").get<int>()] = &c;
  }
  for (int rank : run.header.ranks) {
    const auto c = by_class.find(run.header.rank_class_of(rank));
    if (c == by_class.end()) continue;
    const Json& cls = *c->second;
    if (cls.contains("breakdown_bytes") && cls.at("breakdown_bytes").is_object()) {
      for (const auto& [part, bytes] : cls.at("breakdown_bytes").items()) {
        if (bytes.is_number()) out[rank].emplace_back(part, bytes.get<double>());
      }
    } else if (cls.contains("peak_bytes") && cls.at("peak_bytes").is_number()) {
      out[rank].emplace_back("peak", cls.at("peak_bytes").get<double>());
    }
  }
  return out;
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
  long long trimmed = 0;
  long long trimmed_max_ns = 0;
  long long flow_id = 0;
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
      const Span sp = span_ns(s.epoch_us, s.dur_us);
      begin_event(out, first);
      out += "{\"name\":\"step ";
      detail::append_int(out, s.step);
      out += "\",\"cat\":\"step\",\"ph\":\"X\",\"ts\":";
      detail::append_ns_as_us(out, sp.start);
      out += ",\"dur\":";
      detail::append_ns_as_us(out, sp.end - sp.start);
      out += ",\"pid\":";
      detail::append_int(out, base + s.rank);
      out += ",\"tid\":0,\"args\":{\"step\":";
      detail::append_int(out, s.step);
      out += "}}";
      f.maybe_flush();
    }
    // Every op's span in whole nanoseconds (both ends rounded, so ops that follow each other in the
    // records still do), then per track in start order: an op that begins inside the previous one
    // and ends after it starts where the previous ends (records round start and duration separately,
    // so neighbours can overlap by a nanosecond; Perfetto nests slices and cannot show an overlap).
    std::vector<Span> spans(run.phases.size());
    std::vector<std::size_t> order(run.phases.size());
    for (std::size_t i = 0; i < run.phases.size(); ++i) {
      const auto& p = run.phases[i];
      auto it = epoch.find((static_cast<std::uint64_t>(p.rank) << 32U) | static_cast<std::uint32_t>(p.step));
      const double e = it == epoch.end() ? 0.0 : it->second;  // readers guarantee a step record
      spans[i] = span_ns(e + p.start_us, p.dur_us);
      order[i] = i;
    }
    std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
      const auto& pa = run.phases[a];
      const auto& pb = run.phases[b];
      if (pa.rank != pb.rank) return pa.rank < pb.rank;
      if (pa.stream != pb.stream) return pa.stream < pb.stream;
      if (spans[a].start != spans[b].start) return spans[a].start < spans[b].start;
      return spans[a].end > spans[b].end;  // an enclosing op before the ops it encloses
    });
    long long track_end = 0;
    for (std::size_t k = 0; k < order.size(); ++k) {
      const auto& p = run.phases[order[k]];
      Span& sp = spans[order[k]];
      const bool same_track =
          k > 0 && run.phases[order[k - 1]].rank == p.rank && run.phases[order[k - 1]].stream == p.stream;
      if (same_track && sp.start < track_end && sp.end > track_end) {
        trimmed_max_ns = std::max(trimmed_max_ns, track_end - sp.start);
        ++trimmed;
        sp.start = track_end;
      }
      track_end = same_track ? std::max(track_end, sp.end) : sp.end;
      begin_event(out, first);
      out += "{\"name\":";
      out += run.names.phases.json(p.phase);
      out += ",\"cat\":\"";
      out += profiler::to_string(p.wall);
      out += "\",\"ph\":\"X\",\"ts\":";
      detail::append_ns_as_us(out, sp.start);
      out += ",\"dur\":";
      detail::append_ns_as_us(out, sp.end - sp.start);
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
    // Flows: each pipeline send to the receive it delivers to (profiler::p2p_pairs). A flow starts in
    // the middle of the send's slice and ends in the middle of the receive's ("bp":"e": bound to the
    // enclosing slice), so both ends bind to their slice whatever Perfetto's rounding.
    for (const auto& [send, recv] : profiler::p2p_pairs(run.steps, run.phases, run.names)) {
      ++flow_id;
      for (const std::size_t i : {send, recv}) {
        const auto& p = run.phases[i];
        begin_event(out, first);
        out += i == send ? "{\"name\":\"send -> recv\",\"cat\":\"p2p\",\"ph\":\"s\",\"id\":"
                         : "{\"name\":\"send -> recv\",\"cat\":\"p2p\",\"ph\":\"f\",\"bp\":\"e\",\"id\":";
        detail::append_int(out, flow_id);
        out += ",\"ts\":";
        detail::append_ns_as_us(out, spans[i].start + (spans[i].end - spans[i].start) / 2);
        out += ",\"pid\":";
        detail::append_int(out, base + p.rank);
        out += ",\"tid\":";
        detail::append_int(out, 1 + static_cast<long long>(p.stream));
        out += "}";
      }
      f.maybe_flush();
    }
    // Memory: a counter per rank at each of its steps, in GiB: the peak of summary.json (the memory
    // model's breakdown of the rank's class for a simulation, the allocator's peak for a real run).
    // Records hold no memory over time, so the track is the step's peak, not a timeline.
    for (const auto& [rank, parts] : memory_peaks(run)) {
      for (const auto& s : run.steps) {
        if (s.rank != rank) continue;
        begin_event(out, first);
        out += "{\"name\":\"peak memory GiB\",\"ph\":\"C\",\"ts\":";
        detail::append_ns_as_us(out, span_ns(s.epoch_us, 0.0).start);
        out += ",\"pid\":";
        detail::append_int(out, base + rank);
        out += ",\"tid\":0,\"args\":{";
        bool first_arg = true;
        for (const auto& [name, bytes] : parts) {
          if (!first_arg) out += ',';
          first_arg = false;
          out += json_str(name);
          out += ':';
          append_json_number(out, bytes / (1024.0 * 1024.0 * 1024.0));
        }
        out += "}}";
      }
      f.maybe_flush();
    }
  }
  out += "\n],\n\"threewallsTrimmed\":{\"overlaps_trimmed\":";
  detail::append_int(out, trimmed);
  out += ",\"max_trimmed_ns\":";
  detail::append_int(out, trimmed_max_ns);
  out += "}";
  out += "}\n";
  f.close();
}

}  // namespace threewalls::notebooks_export

// Tidy CSV (RFC 4180: comma separated, "\n" line ends, fields quoted when they hold a comma, a quote
// or a line break, quotes doubled). One header row per file; an empty cell is an absent value.
#include <algorithm>
#include <unordered_map>

#include "csv.hpp"
#include "output.hpp"
#include "threewalls/core/error.hpp"
#include "threewalls/notebooks_export/export.hpp"
#include "threewalls/profiler/summary.hpp"

namespace threewalls::notebooks_export {

using profiler::kAbsent;
using profiler::kNoName;

namespace detail {

void append_csv_field(std::string& out, std::string_view s) {
  if (s.find_first_of(",\"\n\r") == std::string_view::npos) {
    out += s;
    return;
  }
  out += '"';
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  out += '"';
}

namespace {
void opt_int(std::string& out, long long v) {
  if (v != kAbsent) append_int(out, v);
}
}  // namespace

void write_csv_files(const std::vector<const profiler::RunData*>& runs, const std::filesystem::path& dir, bool force) {
  if (runs.empty()) throw InputError("export: no run directory given");
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) throw SystemError(dir.string() + ": cannot create directory: " + ec.message());

  {
    OutFile f(dir / "runs.csv", force);
    std::string& out = f.buf();
    out += "run,source,scenario,dir,label,world_size,device\n";
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const auto& h = runs[i]->header;
      append_int(out, static_cast<long long>(i));
      out += ',';
      append_csv_field(out, h.source);
      out += ',';
      append_csv_field(out, h.scenario.name);
      out += ',';
      append_csv_field(out, runs[i]->dir.string());
      out += ',';
      append_csv_field(out, runs[i]->label());
      out += ',';
      append_int(out, h.world_size);
      out += ',';
      append_csv_field(out, h.device);
      out += '\n';
    }
    f.close();
  }
  {
    OutFile f(dir / "phases.csv", force);
    std::string& out = f.buf();
    out +=
        "run,step,rank,phase,layer,microbatch,expert,stream,wall,start_us,dur_us,epoch_us,bytes,flops,peer,group,"
        "group_id,tokens,coarse,launch_wait_us,posted_receive\n";
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const profiler::RunData& run = *runs[i];
      std::unordered_map<std::uint64_t, double> epoch;
      for (const auto& s : run.steps) {
        epoch[(static_cast<std::uint64_t>(s.rank) << 32U) | static_cast<std::uint32_t>(s.step)] = s.epoch_us;
      }
      // Names quoted once per run, not once per row.
      std::vector<std::string> phase_csv;
      for (const auto& n : run.names.phases.names()) {
        phase_csv.emplace_back();
        append_csv_field(phase_csv.back(), n);
      }
      // posted_receive: a pipeline receive, posted before its data can arrive (profiler::is_receive_phase).
      std::vector<bool> receive_phase;
      for (const auto& n : run.names.phases.names()) receive_phase.push_back(profiler::is_receive_phase(n));
      std::vector<std::string> stream_csv;
      for (const auto& n : run.names.streams.names()) {
        stream_csv.emplace_back();
        append_csv_field(stream_csv.back(), n);
      }
      for (const auto& p : run.phases) {
        append_int(out, static_cast<long long>(i));
        out += ',';
        append_int(out, p.step);
        out += ',';
        append_int(out, p.rank);
        out += ',';
        out += phase_csv[p.phase];
        out += ',';
        opt_int(out, p.layer);
        out += ',';
        opt_int(out, p.microbatch);
        out += ',';
        opt_int(out, p.expert);
        out += ',';
        out += stream_csv[p.stream];
        out += ',';
        out += profiler::to_string(p.wall);
        out += ',';
        append_us(out, p.start_us);
        out += ',';
        append_us(out, p.dur_us);
        out += ',';
        auto it = epoch.find((static_cast<std::uint64_t>(p.rank) << 32U) | static_cast<std::uint32_t>(p.step));
        if (it != epoch.end()) append_us(out, it->second);
        out += ',';
        append_json_number(out, p.bytes);
        out += ',';
        append_json_number(out, p.flops);
        out += ',';
        opt_int(out, p.peer);
        out += ',';
        if (p.group != kNoName) append_csv_field(out, run.names.groups.name(p.group));
        out += ',';
        opt_int(out, p.group_id);
        out += ',';
        opt_int(out, p.tokens);
        out += ',';
        // Always a name ("none" too): a column empty in most rows but a word in a few loads in pandas
        // as float in some chunks and text in others (DtypeWarning).
        out += profiler::to_string(p.coarse);
        out += ',';
        append_us(out, static_cast<double>(p.launch_wait_us));
        out += p.wall == profiler::Wall::communication && p.peer != kAbsent && receive_phase[p.phase] ? ",1\n" : ",0\n";
        f.maybe_flush();
      }
    }
    f.close();
  }
  {
    OutFile f(dir / "steps.csv", force);
    std::string& out = f.buf();
    out += "run,step,rank,epoch_us,dur_us\n";
    for (std::size_t i = 0; i < runs.size(); ++i) {
      for (const auto& s : runs[i]->steps) {
        append_int(out, static_cast<long long>(i));
        out += ',';
        append_int(out, s.step);
        out += ',';
        append_int(out, s.rank);
        out += ',';
        append_us(out, s.epoch_us);
        out += ',';
        append_us(out, s.dur_us);
        out += '\n';
        f.maybe_flush();
      }
    }
    f.close();
  }
  {
    // Peak memory from summary.json: a row per rank class (a simulation: the memory model's
    // breakdown) and a row per rank with a measured peak (a real run).
    std::vector<std::string> parts;  // breakdown keys, in first-seen order over every run
    for (const auto* run : runs) {
      if (!run->summary || !run->summary->contains("memory")) continue;
      const Json& mem = run->summary->at("memory");
      if (!mem.contains("classes") || !mem.at("classes").is_array()) continue;
      for (const Json& c : mem.at("classes")) {
        if (!c.contains("breakdown_bytes") || !c.at("breakdown_bytes").is_object()) continue;
        for (const auto& [k, v] : c.at("breakdown_bytes").items()) {
          if (std::find(parts.begin(), parts.end(), k) == parts.end()) parts.push_back(k);
        }
      }
    }
    OutFile f(dir / "memory.csv", force);
    std::string& out = f.buf();
    out += "run,kind,class,label,ranks,rank,peak_bytes,gpu_memory_bytes,oom";
    for (const auto& p : parts) {
      out += ',';
      append_csv_field(out, p + "_bytes");
    }
    out += '\n';
    auto number = [&out](const Json& j, const char* key) {
      if (j.contains(key) && j.at(key).is_number()) append_json_number(out, j.at(key).get<double>(), 15);
    };
    for (std::size_t i = 0; i < runs.size(); ++i) {
      if (!runs[i]->summary || !runs[i]->summary->contains("memory")) continue;
      const Json& mem = runs[i]->summary->at("memory");
      std::string capacity;
      if (mem.contains("gpu_memory_bytes") && mem.at("gpu_memory_bytes").is_number()) {
        append_json_number(capacity, mem.at("gpu_memory_bytes").get<double>(), 15);
      }
      std::string oom;
      if (mem.contains("oom") && mem.at("oom").is_boolean()) oom = mem.at("oom").get<bool>() ? "1" : "0";
      if (mem.contains("classes") && mem.at("classes").is_array()) {
        for (const Json& c : mem.at("classes")) {
          append_int(out, static_cast<long long>(i));
          out += ",model,";
          if (c.contains("class") && c.at("class").is_number_integer()) append_int(out, c.at("class").get<long long>());
          out += ',';
          if (c.contains("label") && c.at("label").is_string()) append_csv_field(out, c.at("label").get<std::string>());
          out += ',';
          if (c.contains("ranks") && c.at("ranks").is_number_integer()) append_int(out, c.at("ranks").get<long long>());
          out += ",,";
          number(c, "peak_bytes");
          out += ',' + capacity + ',' + oom;
          for (const auto& p : parts) {
            out += ',';
            if (c.contains("breakdown_bytes") && c.at("breakdown_bytes").is_object())
              number(c.at("breakdown_bytes"), p.c_str());
          }
          out += '\n';
        }
      }
      if (mem.contains("measured_peak_bytes_by_rank") && mem.at("measured_peak_bytes_by_rank").is_object()) {
        for (const auto& [rank, v] : mem.at("measured_peak_bytes_by_rank").items()) {
          if (!v.is_number()) continue;
          append_int(out, static_cast<long long>(i));
          out += ",measured,,,,";
          append_csv_field(out, rank);
          out += ',';
          append_json_number(out, v.get<double>(), 15);
          out += ',' + capacity + ',' + oom;
          for (std::size_t k = 0; k < parts.size(); ++k) out += ',';
          out += '\n';
        }
      }
    }
    f.close();
  }
  {
    OutFile f(dir / "walls.csv", force);
    std::string& out = f.buf();
    out += "run,step,critical_rank,step_time_us,compute_us,memory_us,communication_us,host_us,bubble_us,"
           "exposed_comm_us,overlapped_comm_us\n";
    for (std::size_t i = 0; i < runs.size(); ++i) {
      const auto& run = *runs[i];
      profiler::Summary s = profiler::summarize(run.steps, run.phases, run.names);
      for (const auto& st : s.steps) {
        append_int(out, static_cast<long long>(i));
        out += ',';
        append_int(out, st.step);
        out += ',';
        append_int(out, st.critical_rank);
        out += ',';
        append_us(out, st.step_time_us);
        if (st.walls) {
          for (double v : {st.walls->compute_us, st.walls->memory_us, st.walls->communication_us, st.walls->host_us,
                           st.walls->bubble_us, st.walls->exposed_comm_us, st.walls->overlapped_comm_us}) {
            out += ',';
            append_us(out, v);
          }
        } else {
          out += ",,,,,,,";
        }
        out += '\n';
      }
    }
    f.close();
  }
}

}  // namespace detail

void write_csv(const std::vector<const profiler::RunData*>& runs, const std::filesystem::path& dir,
               const ExportOptions& options) {
  detail::write_csv_files(runs, dir, options.force);
}

}  // namespace threewalls::notebooks_export

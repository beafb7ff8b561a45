#include "threewalls/calibration/bench/hardware_info.hpp"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <thread>

namespace threewalls::calibration::bench {

namespace {

std::vector<std::string> split_ws(const std::string& line) {
  std::istringstream in(line);
  std::vector<std::string> out;
  std::string t;
  while (in >> t) out.push_back(t);
  return out;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  std::size_t i = 0;
  while (i < s.size() && std::isspace(static_cast<unsigned char>(s[i]))) ++i;
  return s.substr(i);
}

std::string describe_link(const std::string& code) {
  if (code.size() > 2 && code.rfind("NV", 0) == 0 && std::isdigit(static_cast<unsigned char>(code[2]))) {
    return code + " (NVLink, " + code.substr(2) + " links)";
  }
  if (code == "PIX") return code + " (PCIe, one switch)";
  if (code == "PXB") return code + " (PCIe, several switches)";
  if (code == "PHB") return code + " (PCIe host bridge)";
  if (code == "NODE") return code + " (PCIe within a NUMA node)";
  if (code == "SYS") return code + " (PCIe across NUMA nodes)";
  return code;
}

}  // namespace

std::string gpu_kind_of(const std::string& name) {
  std::string up = name;
  std::transform(up.begin(), up.end(), up.begin(), [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
  if (up.find("H200") != std::string::npos) return "h200";
  if (up.find("H100") != std::string::npos) return "h100";
  if (up.find("GB200") != std::string::npos) return "gb200";
  if (up.find("B200") != std::string::npos) return "b200";
  return "";
}

std::vector<std::string> links_from_topology(const std::string& text, int gpus) {
  std::istringstream in(text);
  std::string line;
  std::vector<std::string> columns;
  std::map<std::string, int> pairs;  // code -> pairs
  while (std::getline(in, line)) {
    // ANSI escapes (nvidia-smi colours the header on a terminal) are dropped.
    std::string clean;
    for (std::size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\x1b') {
        while (i < line.size() && line[i] != 'm') ++i;
        continue;
      }
      clean += line[i];
    }
    const auto tok = split_ws(clean);
    if (tok.empty()) continue;
    if (columns.empty()) {
      if (tok[0].rfind("GPU", 0) == 0) {
        for (const auto& t : tok) {
          if (t.rfind("GPU", 0) == 0 || t.rfind("NIC", 0) == 0 || t.rfind("mlx", 0) == 0) {
            columns.push_back(t);
          } else {
            break;
          }
        }
      }
      continue;
    }
    if (tok[0].rfind("GPU", 0) != 0 || tok[0].size() < 4 || !std::isdigit(static_cast<unsigned char>(tok[0][3])))
      continue;
    const int row = std::atoi(tok[0].c_str() + 3);
    if (row >= gpus) continue;
    for (std::size_t c = 0; c < columns.size() && c + 1 < tok.size(); ++c) {
      if (columns[c].rfind("GPU", 0) != 0) continue;
      const int col = std::atoi(columns[c].c_str() + 3);
      if (col <= row || col >= gpus) continue;  // each pair once, among the GPUs used
      ++pairs[tok[c + 1]];
    }
  }
  std::vector<std::string> out;
  for (const auto& [code, n] : pairs) {
    out.push_back(describe_link(code) + ": " + std::to_string(n) + " GPU pair" + (n == 1 ? "" : "s"));
  }
  return out;
}

SmiQuery parse_smi_query(const std::string& csv) {
  SmiQuery q;
  std::istringstream in(csv);
  std::string line;
  if (!std::getline(in, line)) return q;
  std::vector<std::string> f;
  std::string cell;
  std::istringstream cells(line);
  while (std::getline(cells, cell, ',')) f.push_back(trim(cell));
  auto number = [](const std::string& s) {
    try {
      std::size_t used = 0;
      const double v = std::stod(s, &used);
      return used > 0 ? v : 0.0;
    } catch (...) {
      return 0.0;
    }
  };
  if (!f.empty() && !f[0].empty() && f[0].find("N/A") == std::string::npos) q.driver_version = f[0];
  if (f.size() > 1) q.max_sm_clock_mhz = number(f[1]);
  if (f.size() > 2) q.max_memory_clock_mhz = number(f[2]);
  return q;
}

std::string run_command(const std::string& command, bool& ok) {
  ok = false;
  std::FILE* p = ::popen((command + " 2>/dev/null").c_str(), "r");
  if (!p) return {};
  std::string out;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p)) > 0) out.append(buf.data(), n);
  const int rc = ::pclose(p);
  ok = rc == 0;
  return out;
}

std::string describe_machine() {
  std::array<char, 256> host{};
  if (::gethostname(host.data(), host.size() - 1) != 0) host[0] = '\0';
  std::string cpu = "unknown CPU";
  {
    std::ifstream in("/proc/cpuinfo");
    std::string line;
    while (std::getline(in, line)) {
      if (line.rfind("model name", 0) == 0) {
        const auto colon = line.find(':');
        if (colon != std::string::npos) cpu = trim(line.substr(colon + 1));
        break;
      }
    }
  }
  double mem_gib = 0.0;
  {
    std::ifstream in("/proc/meminfo");
    std::string key;
    double kb = 0.0;
    while (in >> key >> kb) {
      if (key == "MemTotal:") {
        mem_gib = kb / (1024.0 * 1024.0);
        break;
      }
      in.ignore(256, '\n');
    }
  }
  std::string ib;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/sys/class/infiniband", ec)) {
    ib += (ib.empty() ? "" : ", ") + e.path().filename().string();
  }
  char buf[512];
  std::snprintf(buf, sizeof buf, "host %s; CPU %s (%u logical CPUs); %.0f GiB RAM; InfiniBand devices: %s", host.data(),
                cpu.c_str(), std::thread::hardware_concurrency(), mem_gib, ib.empty() ? "none" : ib.c_str());
  return buf;
}

}  // namespace threewalls::calibration::bench

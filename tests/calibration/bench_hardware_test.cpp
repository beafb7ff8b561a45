// Hardware identity text handling (calibration/bench/hardware_info.hpp).
#include <gtest/gtest.h>

#include "threewalls/calibration/bench/hardware_info.hpp"

using namespace threewalls::calibration::bench;

namespace {
// `nvidia-smi topo -m` of a 4-GPU NVLink box with two NICs (layout as nvidia-smi prints it).
const char* kTopo4 =
    "\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m\n"
    "GPU0\t X \tNV18\tNV18\tNV18\tPXB\tSYS\t0-47\t0\t\tN/A\n"
    "GPU1\tNV18\t X \tNV18\tNV18\tPXB\tSYS\t0-47\t0\t\tN/A\n"
    "GPU2\tNV18\tNV18\t X \tNV18\tSYS\tPXB\t48-95\t1\t\tN/A\n"
    "GPU3\tNV18\tNV18\tNV18\t X \tSYS\tPXB\t48-95\t1\t\tN/A\n"
    "NIC0\tPXB\tPXB\tSYS\tSYS\t X \tSYS\n"
    "NIC1\tSYS\tSYS\tPXB\tPXB\tSYS\t X \n"
    "\n"
    "Legend:\n\n  X    = Self\n  SYS  = Connection traversing PCIe as well as the SMP interconnect\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n";
}  // namespace

TEST(HardwareInfo, LinksComeFromTheTopologyMatrixAmongTheGpusUsed) {
  EXPECT_EQ(links_from_topology(kTopo4, 4), std::vector<std::string>{"NV18 (NVLink, 18 links): 6 GPU pairs"});
  EXPECT_EQ(links_from_topology(kTopo4, 2), std::vector<std::string>{"NV18 (NVLink, 18 links): 1 GPU pair"});
  EXPECT_TRUE(links_from_topology(kTopo4, 1).empty());
  EXPECT_TRUE(links_from_topology("nvidia-smi: command not found", 4).empty());
  const char* pcie =
      "\tGPU0\tGPU1\tCPU Affinity\n"
      "GPU0\t X \tSYS\t0-15\n"
      "GPU1\tSYS\t X \t16-31\n";
  EXPECT_EQ(links_from_topology(pcie, 2), std::vector<std::string>{"SYS (PCIe across NUMA nodes): 1 GPU pair"});
}

TEST(HardwareInfo, SmiQueryAndGpuKind) {
  const SmiQuery q = parse_smi_query("580.159.04, 1980, 2619\n580.159.04, 1980, 2619\n");
  EXPECT_EQ(q.driver_version, "580.159.04");
  EXPECT_EQ(q.max_sm_clock_mhz, 1980.0);
  EXPECT_EQ(q.max_memory_clock_mhz, 2619.0);
  const SmiQuery bad = parse_smi_query("[N/A], [N/A]");
  EXPECT_EQ(bad.driver_version, "");
  EXPECT_EQ(bad.max_sm_clock_mhz, 0.0);
  EXPECT_EQ(gpu_kind_of("NVIDIA H100 80GB HBM3"), "h100");
  EXPECT_EQ(gpu_kind_of("NVIDIA H200"), "h200");
  EXPECT_EQ(gpu_kind_of("NVIDIA A100-SXM4-80GB"), "");
  EXPECT_FALSE(describe_machine().empty());
}

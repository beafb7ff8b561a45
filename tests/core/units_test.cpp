#include "threewalls/core/units.hpp"

#include <gtest/gtest.h>

#include <stdexcept>

using namespace threewalls;

TEST(Units, BytesSiAndIecPrefixes) {
  EXPECT_DOUBLE_EQ(parse_bytes("80GiB").value, 80.0 * 1024 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(parse_bytes("80GB").value, 80e9);
  EXPECT_DOUBLE_EQ(parse_bytes("1.5 MiB").value, 1.5 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(parse_bytes("4096B").value, 4096.0);
  EXPECT_DOUBLE_EQ(parse_bytes("1kB").value, 1000.0);
  EXPECT_DOUBLE_EQ(parse_bytes("1KiB").value, 1024.0);
}

TEST(Units, BandwidthBytesAndBits) {
  EXPECT_DOUBLE_EQ(parse_bandwidth("450GBps").value, 450e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("450GB/s").value, 450e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("400Gbps").value, 50e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("400Gb/s").value, 50e9);
  EXPECT_DOUBLE_EQ(parse_bandwidth("1GiBps").value, 1024.0 * 1024 * 1024);
}

TEST(Units, Durations) {
  EXPECT_DOUBLE_EQ(parse_duration("1.5us").value, 1.5e-6);
  EXPECT_DOUBLE_EQ(parse_duration("1.5\xC2\xB5s").value, 1.5e-6);
  EXPECT_DOUBLE_EQ(parse_duration("2ms").value, 2e-3);
  EXPECT_DOUBLE_EQ(parse_duration("100ns").value, 100e-9);
  EXPECT_DOUBLE_EQ(parse_duration("3s").value, 3.0);
}

TEST(Units, FlopRates) {
  EXPECT_DOUBLE_EQ(parse_flop_rate("989TFLOPS").value, 989e12);
  EXPECT_DOUBLE_EQ(parse_flop_rate("1.9PFLOP/s").value, 1.9e15);
}

TEST(Units, MissingOrWrongUnitIsErrorNamingAllowedUnits) {
  try {
    parse_bandwidth("450");
    FAIL() << "no exception";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("missing unit"), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("Bps"), std::string::npos);
  }
  EXPECT_THROW(parse_bytes("80GiBps"), std::invalid_argument);
  EXPECT_THROW(parse_duration("5 minutes"), std::invalid_argument);
  EXPECT_THROW(parse_bytes("-1GB"), std::invalid_argument);
  EXPECT_THROW(parse_bytes("GB"), std::invalid_argument);
  EXPECT_THROW(parse_flop_rate("989TiFLOPS"), std::invalid_argument);
}

TEST(Units, TypedArithmetic) {
  Seconds t = Bytes(1e9) / BytesPerSecond(100e9);
  EXPECT_DOUBLE_EQ(t.value, 0.01);
  Seconds t2 = Flops(1e15) / FlopsPerSecond(1e15);
  EXPECT_DOUBLE_EQ(t2.value, 1.0);
  EXPECT_EQ(format_bytes(gibibytes(80)), "80 GiB");
  EXPECT_EQ(format_duration(microseconds(3.5)), "3.5 us");
  EXPECT_EQ(format_duration(Seconds(9.78e-18)), "0 ns");  // round-off of a sum, not a duration
  EXPECT_EQ(format_duration(Seconds(-2e-15)), "0 ns");
  EXPECT_EQ(format_duration(Seconds(2.5e-12)), "0.0025 ns");
}

#pragma once
// Checks that phase records follow the fake device's trace (tests of the executor on the fake device).
//
// A record's absolute time is its step's epoch_us + start_us, the epoch placed on the host clock
// through the recorder's anchor, a marker the fake stream thread stamps when it gets to run: on a
// loaded 2-core machine that stamp is up to ~1 ms late, which shifts every record of the run alike.
// So: one common offset (the median of record start - trace start, bounded), and each record's start
// and duration within the fake device's scheduling noise of the trace (but for rare descheduled ones).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

namespace threewalls::backend::testing {

struct Placed {
  double record_start_us = 0.0;  // epoch + start_us
  double record_dur_us = 0.0;
  double trace_start_us = 0.0;
  double trace_dur_us = 0.0;
  std::string what;  // for messages
};

inline void expect_records_follow_the_trace(const std::vector<Placed>& v, const std::string& what,
                                            double noise_us = 450.0, double max_offset_us = 5000.0) {
  ASSERT_GT(v.size(), 10U) << what;
  std::vector<double> off;
  off.reserve(v.size());
  for (const Placed& p : v) off.push_back(p.record_start_us - p.trace_start_us);
  std::vector<double> sorted = off;
  std::sort(sorted.begin(), sorted.end());
  const double offset = sorted[sorted.size() / 2];
  EXPECT_LT(std::abs(offset), max_offset_us) << what << ": records placed on the host clock through the anchor";
  // A stream thread descheduled between stamping a marker and starting its op (milliseconds on a busy
  // machine) puts that one record off; a systematic error would put most of them off. So at most 5%
  // (and at least one allowed), each named.
  std::size_t off_records = 0;
  std::string names;
  for (std::size_t i = 0; i < v.size(); ++i) {
    const bool bad = std::abs(off[i] - offset) > noise_us || std::abs(v[i].record_dur_us - v[i].trace_dur_us) > noise_us;
    if (!bad) continue;
    ++off_records;
    names += " " + v[i].what + " (start " + std::to_string(off[i] - offset) + " us, duration " +
             std::to_string(v[i].record_dur_us - v[i].trace_dur_us) + " us off)";
  }
  EXPECT_LE(off_records, std::max<std::size_t>(1, v.size() / 20)) << what << ": records off the trace:" << names;
}

}  // namespace threewalls::backend::testing

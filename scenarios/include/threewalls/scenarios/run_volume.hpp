#pragma once

// How much a run records (docs/run_dir.md): the one estimate of a run directory's size, used by the
// `work-size` rule (the largest run directory a scenario may ask) and by run.profiler.ranks = "auto"
// (every rank while that stays small, one rank per rank class beyond).

#include "threewalls/scenarios/scenario.hpp"

namespace threewalls::scenarios {

// Bytes of one phase record as the run-directory writer prints it (a JSONL line): measured with
// `threewalls sim --steps 1` on the shipped examples, total bytes of the phases files / records:
// 185 (small_moe_1gpu) to 191 (mixtral_8x7b_64gpu, 3,818,175 bytes / 19,976 records) bytes.
inline constexpr long long kBytesPerRecord = 190;
// Bytes of the header line at the top of every phases file: the run header (the recording ranks
// appear there as a count; their list is written once, in run.json): about 2 KB on the shipped
// examples, 4 KiB leaves room for long paths and command lines.
inline constexpr long long kHeaderBytesPerFile = 4096;
// run.profiler.ranks = "auto" records every rank while the run directory of all of them stays within
// this (a 64-GPU Mixtral step: 0.13 GiB), else one rank per rank class: a simulation of thousands of
// GPUs writes a few files, not one per GPU of identical records.
inline constexpr long long kAutoEveryRankMaxBytes = 1LL << 30;

// Products of sizes (parallel degrees, tokens, ops, bytes) saturate at kProductCap instead of
// overflowing 64 bits: a rule compares them with bounds far below it, which a saturated product fails
// exactly as the true one would. Non-positive factors give 0.
inline constexpr long long kProductCap = 1LL << 62;
long long saturating_mul(long long a, long long b);

// Steps of the run that record (run.profiler start_step, end_step, record_every_n_steps; 0 when
// the profiler is off).
long long recorded_steps(const Scenario& s);
// Records one recorded rank writes per recorded step when a rank runs `ops_per_rank_step` ops:
// every op, or the three coarse records.
long long records_per_rank_step(const Scenario& s, long long ops_per_rank_step);
// The size of a run directory: recorded steps x recorded ranks x records per rank and step x
// kBytesPerRecord, plus kHeaderBytesPerFile per recorded rank (saturating at kProductCap).
long long run_dir_bytes(long long steps, long long ranks, long long records_per_rank_and_step);
// Whether run.profiler.ranks = "auto" records every rank of `s` (else one per rank class), a rank
// running `ops_per_rank_step` ops per step.
bool auto_records_every_rank(const Scenario& s, long long ops_per_rank_step);

}  // namespace threewalls::scenarios

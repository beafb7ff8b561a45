"""The sampling knobs mean what the C++ SamplingPolicy's mean (tests/profiler/sampling_test.cpp)."""
import unittest

import support  # noqa: F401  (puts the package on the path when run alone)
from threewalls.errors import InputError
from threewalls.profiler.sampling import SamplingConfig, SamplingPolicy, resolve_ranks


class SamplingTest(unittest.TestCase):
    def test_records_every_nth_step_from_start_step(self):
        p = SamplingPolicy(SamplingConfig(start_step=3, record_every_n_steps=4), 1)
        self.assertEqual([s for s in range(20) if p.records(s)], [3, 7, 11, 15, 19])

    def test_end_step_is_inclusive(self):
        p = SamplingPolicy(SamplingConfig(start_step=2, end_step=8, record_every_n_steps=3), 1)
        self.assertEqual([s for s in range(20) if p.records(s)], [2, 5, 8])

    def test_default_records_every_tenth_step_of_every_rank(self):
        p = SamplingPolicy(None, 4)
        self.assertEqual([s for s in range(25) if p.records(s)], [0, 10, 20])
        self.assertEqual(p.recording_ranks, [0, 1, 2, 3])

    def test_ranks_list_selects_ranks(self):
        p = SamplingPolicy(SamplingConfig(ranks=[3, 1]), 4)
        self.assertEqual(p.recording_ranks, [1, 3])
        self.assertEqual([r for r in range(4) if p.records_rank(r)], [1, 3])
        self.assertFalse(p.records_rank(7))

    def test_coarse_granularity_keeps_only_coarse_view_phases(self):
        p = SamplingPolicy(SamplingConfig(granularity="coarse"), 1)
        self.assertFalse(p.records_phase(None))
        self.assertTrue(p.records_phase("host_to_device"))
        self.assertTrue(p.records_phase("training_metrics"))
        self.assertTrue(SamplingPolicy(SamplingConfig(), 1).records_phase(None))

    def test_flush_after_every_n_steps_counted_from_start_and_at_end_step(self):
        # The case of tests/profiler/sampling_test.cpp: start 2, end 12, every step, flush every 4.
        p = SamplingPolicy(SamplingConfig(start_step=2, end_step=12, record_every_n_steps=1, flush_every_n_steps=4), 1)
        self.assertEqual([s for s in range(20) if p.flush_after(s)], [5, 9, 12, 13, 17])

    def test_disabled_records_nothing(self):
        p = SamplingPolicy(SamplingConfig(enabled=False), 2)
        self.assertFalse(any(p.records(s) for s in range(30)))
        self.assertFalse(p.records_rank(0))
        self.assertFalse(p.flush_after(9))
        self.assertEqual(p.recording_ranks, [])

    def test_bad_knobs_are_errors_naming_the_knob_and_allowed_values(self):
        cases = [
            (SamplingConfig(start_step=-1), 1, "profiler.start_step: -1 is negative; allowed: 0 or more"),
            (SamplingConfig(end_step=-2), 1, "profiler.end_step: -2 is not allowed"),
            (SamplingConfig(start_step=5, end_step=3), 1, "profiler.end_step: 3 is before start_step 5"),
            (SamplingConfig(record_every_n_steps=0), 1, "profiler.record_every_n_steps: 0; allowed: 1 or more"),
            (SamplingConfig(flush_every_n_steps=0), 1, "profiler.flush_every_n_steps: 0; allowed: 1 or more"),
            (SamplingConfig(ranks=[4]), 4, "profiler.ranks: rank 4 is outside the world; allowed: 0..3"),
            (SamplingConfig(ranks=[1, 1]), 4, "profiler.ranks: rank 1 is listed twice"),
            (SamplingConfig(granularity="op"), 1, "profiler.granularity: 'op'; allowed: layer, coarse"),
            (SamplingConfig(), 0, "profiler.ranks: world size must be positive"),
        ]
        for cfg, world, msg in cases:
            with self.assertRaises(InputError) as cm:
                SamplingPolicy(cfg, world)
            self.assertIn(msg, str(cm.exception))

    def test_effective_knobs_go_into_json(self):
        p = SamplingPolicy(SamplingConfig(start_step=1, ranks=[2, 0], granularity="coarse"), 3)
        self.assertEqual(p.to_json(), {"enabled": True, "start_step": 1, "end_step": -1, "record_every_n_steps": 10,
                                       "flush_every_n_steps": 10, "recorded_ranks": 2, "granularity": "coarse"})

    def test_scenario_ranks_key(self):
        self.assertEqual(resolve_ranks("all", 4), [])
        self.assertEqual(resolve_ranks("auto", 4), [])
        self.assertEqual(resolve_ranks([1, 2], 4), [1, 2])
        self.assertEqual(resolve_ranks("representatives", 4, [0, 2, 0]), [0, 2])
        with self.assertRaises(InputError):
            resolve_ranks("some", 4)


if __name__ == "__main__":
    unittest.main()

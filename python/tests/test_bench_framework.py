"""python3 -m threewalls.bench.framework on the CPU: the figures, and the profile families it writes
(host.framework_op replaced by the measured point, host.framework_backward_op and host.framework_sync
appended, every other family untouched). The GPU figures
come from scripts/python_gpu_checks.sh on a GPU machine."""
import json
import os
import tomllib
import unittest

from support import REPO, tempdir

from threewalls.bench import framework, spread

PROFILE = os.path.join(REPO, "calibration", "profiles", "h100.toml")


class FrameworkBench(unittest.TestCase):
    def test_cpu_figures_and_families(self):
        out = tempdir(self)
        self.assertEqual(framework.main(["--out", out, "--profile", PROFILE, "--device", "cpu", "--ops", "50",
                                         "--repeats", "3"]), 0)
        with open(os.path.join(out, "framework.json")) as f:
            j = json.load(f)
        figs = j["figures"]
        self.assertGreater(figs["eager_op_us"]["median_us"], 0)
        self.assertGreater(figs["autograd_node_us"]["median_us"], 0)
        self.assertIsNone(figs["item_us"])  # device-only figures
        with open(PROFILE, "rb") as f:
            base = tomllib.load(f)
        with open(os.path.join(out, "framework_families.toml"), "rb") as f:
            fam = tomllib.load(f)
        launch_us = base["host"]["kernel_launch"]["fit"]["value_s"] * 1e6
        want = {"framework_op": max(figs["eager_op_us"]["median_us"] - launch_us, 0.01) * 1e-6,
                "framework_backward_op": max(figs["autograd_node_us"]["median_us"] - launch_us, 0.01) * 1e-6,
                "framework_sync": figs["where_us"]["median_us"] * 1e-6,
                "framework_autograd_op": max(figs["autograd_op_us"]["median_us"] - launch_us, 0.01) * 1e-6,
                "framework_record_op": figs["record_op_us"]["median_us"] * 1e-6}
        self.assertIsNone(figs["attention_plan_us"])  # CUDA only: no host.framework_attention_plan written
        self.assertNotIn("framework_attention_plan", fam["host"])
        self.assertIsNone(figs["stream_op_us"])  # CUDA only: no host.framework_stream_op written
        self.assertNotIn("framework_stream_op", fam["host"])
        self.assertGreater(figs["autograd_linear_us"]["median_us"], 0)
        for name, want_s in want.items():
            self.assertAlmostEqual(fam["host"][name]["fit"]["value_s"], want_s, delta=want_s * 1e-5, msg=name)
            self.assertIn("smoke test", fam["host"][name]["note"])
            self.assertEqual(fam["host"][name]["points"][0]["count"], 3)
            self.assertEqual(fam["host"][name]["model"], "median_v1")
        self.assertNotIn("framework_backward_op", base["host"])  # appended: the shipped profile lacks it
        self.assertIn("host.framework_backward_op host.framework_sync", j["merge"])
        same = lambda x, y: json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)  # noqa: E731 (nan)
        for k in set(base) | set(fam):
            if k != "host":
                self.assertTrue(same(base.get(k), fam.get(k)), k)
        for k in set(base["host"]) | set(fam["host"]):
            if k not in want:
                self.assertTrue(same(base["host"].get(k), fam["host"].get(k)), k)
        # Run again on its own output: the families are replaced, not appended twice.
        out2 = tempdir(self)
        self.assertEqual(framework.main(["--out", out2, "--profile", os.path.join(out, "framework_families.toml"),
                                         "--device", "cpu", "--ops", "20", "--repeats", "2"]), 0)
        with open(os.path.join(out2, "framework_families.toml")) as f:
            text = f.read()
        for name in want:
            self.assertEqual(text.count(f"[host.{name}]"), 1, name)
        tomllib.loads(text)

    def test_stream_family_is_a_point_per_stream_count(self):
        """host.framework_stream_op as the GPU writes it: stream_cycle_v1, one point per N (seconds), the
        fit the medians; replaced, not appended, when the profile has it; bad --stream-counts refused."""
        with open(PROFILE, encoding="utf-8") as f:
            text = f.read()
        fig = {"median_us": 5.0, "p10_us": 4.0, "p90_us": 6.0, "repeats": 3}
        figs = {"eager_op_us": fig, "autograd_node_us": fig, "autograd_op_us": fig, "where_us": fig,
                "record_op_us": fig, "stream_op_us": {"4": dict(fig, median_us=7.0, p90_us=9.0), "2": fig}}
        notes = {f: "n" for f in framework.FAMILIES + (framework.STREAM_FAMILY,)}
        once = framework.families_toml(text, PROFILE, figs, notes)
        fam = tomllib.loads(once)["host"]["framework_stream_op"]
        self.assertEqual(fam["model"], "stream_cycle_v1")
        self.assertEqual([p["streams"] for p in fam["points"]], [2, 4])
        self.assertEqual(fam["fit"]["streams"], [2, 4])
        self.assertEqual(fam["fit"]["extra_s"], [5e-6, 7e-6])
        twice = framework.families_toml(once, PROFILE, figs, notes)
        self.assertEqual(twice.count("[host.framework_stream_op]"), 1)
        for bad in ("1,4", "x", "2,128", ""):
            with self.subTest(bad=bad):
                self.assertEqual(framework.main(["--out", tempdir(self), "--device", "cpu", "--stream-counts", bad]), 2)

    def test_families_need_the_family_in_the_profile(self):
        fig = {"median_us": 5, "p10_us": 5, "p90_us": 5, "repeats": 1}
        with self.assertRaisesRegex(SystemExit, "no single \\[host.framework_op\\]"):
            framework.families_toml("[host.kernel_launch.fit]\nvalue_s = 1e-6\n", "p.toml",
                                    {"eager_op_us": fig, "autograd_node_us": fig, "autograd_op_us": fig,
                                     "where_us": fig, "record_op_us": fig},
                                    {f: "n" for f in framework.FAMILIES})

    def test_the_spread_stays_within_the_samples(self):
        # A figure floored at 0.01 us in one of three repeats: the p10 is within the samples, not
        # extrapolated below zero (-0.58 by statistics' default), which the profile loader refuses.
        p10, med, p90 = spread.p10_median_p90([0.01, 1.0, 2.0])
        self.assertGreaterEqual(p10, 0.01)
        self.assertEqual(med, 1.0)
        for samples in ([3.0], [0.01, 2.0], [5.0, 0.5, 9.0, 0.02, 7.0]):
            p10, med, p90 = spread.p10_median_p90(samples)
            self.assertTrue(min(samples) <= p10 <= med <= p90 <= max(samples), samples)
        with self.assertRaises(ValueError):
            spread.p10_median_p90([])


if __name__ == "__main__":
    unittest.main()

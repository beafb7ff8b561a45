"""python3 -m threewalls.bench.framework on the CPU: the figures, and the profile families it writes
(host.framework_op replaced by the measured point, every other family untouched). The GPU figures
come from scripts/python_gpu_checks.sh on a GPU machine."""
import json
import os
import tomllib
import unittest

from support import REPO, tempdir

from threewalls.bench import framework

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
        want_s = max(figs["eager_op_us"]["median_us"] - launch_us, 0.01) * 1e-6
        self.assertAlmostEqual(fam["host"]["framework_op"]["fit"]["value_s"], want_s, delta=want_s * 1e-5)
        self.assertIn("smoke test", fam["host"]["framework_op"]["note"])
        self.assertEqual(fam["host"]["framework_op"]["points"][0]["count"], 3)
        same = lambda x, y: json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)  # noqa: E731 (nan)
        for k in set(base) | set(fam):
            if k != "host":
                self.assertTrue(same(base.get(k), fam.get(k)), k)
        for k in set(base["host"]) | set(fam["host"]):
            if k != "framework_op":
                self.assertTrue(same(base["host"].get(k), fam["host"].get(k)), k)

    def test_families_need_the_family_in_the_profile(self):
        with self.assertRaisesRegex(SystemExit, "no single \\[host.framework_op\\]"):
            framework.families_toml("[host.kernel_launch.fit]\nvalue_s = 1e-6\n", "p.toml",
                                    {"median_us": 5, "p10_us": 5, "p90_us": 5, "repeats": 1}, "n")


if __name__ == "__main__":
    unittest.main()

"""scripts/python_gpu_checks.sh's plumbing on the CPU (--cpu-smoke): install into a temporary
folder, the overhead measurement's JSON, runner runs, simulation and compare of each. The GPU
numbers come from the same script on a GPU machine."""
import json
import os
import subprocess
import sys
import unittest

from support import REPO, need_bin, tempdir


class GpuChecksScriptTest(unittest.TestCase):
    def test_cpu_smoke(self):
        b = need_bin(self)
        out = os.path.join(tempdir(self), "checks")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env.update({"PYTHON": sys.executable, "THREEWALLS": b})
        r = subprocess.run([os.path.join(REPO, "scripts", "python_gpu_checks.sh"), out, "--cpu-smoke"], env=env,
                           capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("runner: 3 of 3 runs finished", r.stdout)  # two scenarios and the Kineto trace
        with open(os.path.join(out, "checks.json")) as f:
            checks = json.load(f)
        self.assertEqual(sorted(checks["overhead"]), ["eager", "grouped"])
        with open(os.path.join(out, "overhead", "overhead_grouped.json")) as f:
            ov = json.load(f)
        self.assertEqual(sorted(ov["step_time_s"]), ["every1", "every10", "off"])
        self.assertEqual(len(ov["step_time_s"]["off"]), 2)
        self.assertGreater(ov["phase_records_per_run"]["every1"][0], ov["phase_records_per_run"]["every10"][0])
        for name in ("tiny_moe", "tiny_mla_infer"):
            self.assertTrue(os.path.exists(os.path.join(out, "runs", name, "summary.json")), name)
            with open(os.path.join(out, "compare", name + ".json")) as f:
                self.assertGreater(json.load(f)["matched_records"], 100)
        # PyTorch's host costs as profile families, refitted into a profile by the C++ tool.
        with open(os.path.join(out, "framework", "framework.json")) as f:
            fw = json.load(f)
        self.assertGreater(fw["figures"]["eager_op_us"]["median_us"], 0)
        self.assertTrue(os.path.exists(os.path.join(out, "framework", "framework_families.toml")))
        merged = os.path.join(out, "framework", "profile_pytorch.toml")
        if os.path.exists(os.path.join(os.path.dirname(b), "..", "calibration", "threewalls_merge_families")):
            with open(merged) as f:
                text = f.read()
            self.assertIn("measured: python3 -m threewalls.bench.framework", text)
            # PyTorch's kernels: the benchmark's raw output refitted by the C++ tools into the same profile.
            self.assertIn("[pytorch.unpermute_fwd]", text)
            self.assertIn("measured by python3 -m threewalls.bench.pytorch_kernels", text)
        # The runner's torch.profiler trace, imported, lines up with the runner's own records.
        with open(os.path.join(out, "kineto", "runner_vs_import.json")) as f:
            c = json.load(f)
        self.assertGreater(c["matched_records"], 100)
        self.assertEqual((len(c["only_in_a"]), len(c["only_in_b"])), (0, 0))
        with open(os.path.join(out, "kineto", "import_vs_sim.json")) as f:
            self.assertGreater(json.load(f)["matched_records"], 100)
        # Results are never overwritten.
        r = subprocess.run([os.path.join(REPO, "scripts", "python_gpu_checks.sh"), out, "--cpu-smoke"], env=env,
                           capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 2)
        self.assertIn("results are never overwritten", r.stderr)


if __name__ == "__main__":
    unittest.main()

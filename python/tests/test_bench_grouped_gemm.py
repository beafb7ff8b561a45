"""python3 -m threewalls.bench.grouped_gemm on the CPU: the rows per group, and the profile it writes
(grouped_gemm.fp8's points and note replaced by the measured ones, every other family untouched). The
GPU figures come from a GPU machine (docs/calibration.md, "FP8 grouped GEMM")."""
import json
import os
import tomllib
import unittest

from support import REPO, tempdir

from threewalls.bench import grouped_gemm

PROFILE = os.path.join(REPO, "calibration", "profiles", "h100.toml")


class GroupedGemmBench(unittest.TestCase):
    def test_rows_spread_as_the_calibration_spreads_them_then_padded(self):
        self.assertEqual(grouped_gemm.group_rows(64, 4, 16), [16, 16, 16, 16])
        self.assertEqual(grouped_gemm.group_rows(66, 4, 10), [32, 32, 16, 16])  # 17, 17, 16, 16 padded
        self.assertEqual(grouped_gemm.group_rows(100, 3, 60), [64, 32, 32])  # hot 60, then 20 and 20
        self.assertEqual(grouped_gemm.group_rows(40, 1, 40), [48])

    def test_cpu_points_and_families(self):
        out = tempdir(self)
        self.assertEqual(grouped_gemm.main(["--out", out, "--profile", PROFILE, "--device", "cpu", "--iters", "1",
                                            "--repeats", "1", "--max-points", "2"]), 0)
        with open(os.path.join(out, "grouped_gemm.json")) as f:
            j = json.load(f)
        self.assertEqual(len(j["points"]), 2)
        for p in j["points"]:
            self.assertTrue(all(r % 16 == 0 for r in p["rows"]))
            self.assertEqual(sum(p["rows"]), p["total_rows"])
            self.assertGreater(p["fp8"]["median_s"], 0)
        with open(PROFILE, "rb") as f:
            base = tomllib.load(f)
        with open(os.path.join(out, "grouped_fp8_families.toml"), "rb") as f:
            fam = tomllib.load(f)
        fp8 = fam["grouped_gemm"]["fp8"]
        self.assertEqual(len(fp8["points"]), 2)
        self.assertAlmostEqual(fp8["points"][0]["median_s"], j["points"][0]["fp8"]["median_s"])
        self.assertIn("smoke test", fp8["note"])
        self.assertEqual(fp8["model"], base["grouped_gemm"]["fp8"]["model"])
        same = lambda x, y: json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)  # noqa: E731 (nan)
        for k in set(base) | set(fam):
            if k != "grouped_gemm":
                self.assertTrue(same(base.get(k), fam.get(k)), k)
        self.assertTrue(same(base["grouped_gemm"]["bf16"], fam["grouped_gemm"]["bf16"]))

    def test_a_profile_without_the_family_is_refused(self):
        with self.assertRaisesRegex(SystemExit, "no single \\[grouped_gemm.fp8\\]"):
            grouped_gemm.families_toml("[grouped_gemm.bf16]\nmodel = \"x\"\n", "p.toml", [], "n")


if __name__ == "__main__":
    unittest.main()

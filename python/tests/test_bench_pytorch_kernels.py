"""python3 -m threewalls.bench.pytorch_kernels on the CPU: the raw output it writes (the calibration
raw format), refitted into the pytorch.* families by the C++ tool. The GPU figures come from a GPU
machine (docs/validation/pytorch_kernels_h200_2026-11-28.md)."""
import json
import os
import subprocess
import unittest

import torch

from support import REPO, need_bin, tempdir

from threewalls.bench import pytorch_kernels
from threewalls.runner import kernels

PROFILE = os.path.join(REPO, "calibration", "profiles", "h200.toml")


class PytorchKernelsBench(unittest.TestCase):
    def run_bench(self, *extra):
        out = os.path.join(tempdir(self), "pk")
        self.assertEqual(pytorch_kernels.main(["--out", out, "--profile", PROFILE, "--device", "cpu", "--iters", "1",
                                               "--repeats", "2", *extra]), 0)
        return out

    def refit(self, out):
        """The C++ fit of the raw folder `out` (threewalls_refit_raw): the fitted profile's text."""
        refit = os.path.join(os.path.dirname(need_bin(self)), "..", "calibration", "bench", "threewalls_refit_raw")
        toml = os.path.join(out, "fitted.toml")
        r = subprocess.run([refit, out, toml], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(toml) as f:
            return f.read()

    def test_raw_output_refits_into_the_families(self):
        out = self.run_bench("--only", "pytorch.unpermute_fwd,pytorch.unpermute_bwd,pytorch.adam_step")
        with open(os.path.join(out, "points.jsonl")) as f:
            lines = [json.loads(line) for line in f]
        self.assertEqual(lines[0]["format"], "threewalls.calibration_raw")
        self.assertIn("smoke test", lines[0]["hardware"]["machine"])
        fams = {r["family"] for r in lines[1:]}
        # The op bodies' host time beside their device time (not the optimizer's: a loop per tensor).
        self.assertEqual(fams, {"pytorch.unpermute_fwd", "pytorch.unpermute_bwd", "pytorch.adam_step",
                                "pytorch_host.unpermute_fwd", "pytorch_host.unpermute_bwd"})
        for r in lines[1:]:
            prefix, rest = r["family"].split(".", 1)
            self.assertEqual(r["op"], prefix + "_" + rest)
            self.assertEqual(list(r["params"].values()), r["inputs"])
            self.assertGreater(r["median_s"], 0)
        unperm = [r for r in lines[1:] if r["family"] == "pytorch.unpermute_fwd"]
        self.assertEqual(list(unperm[0]["params"]), ["tokens", "topk", "hidden"])
        # Forward host points with and without autograd recording; backward ones recording.
        host_fwd = [r for r in lines[1:] if r["family"] == "pytorch_host.unpermute_fwd"]
        self.assertEqual(sorted({r["inputs"][0] for r in host_fwd}), [0.0, 1.0])
        self.assertEqual({r["inputs"][0] for r in lines[1:] if r["family"] == "pytorch_host.unpermute_bwd"}, {1.0})
        # The C++ fit reads it: the families' inputs and ops are the kernel_terms table's.
        text = self.refit(out)
        for fam in fams:
            self.assertIn(f"[{fam}]", text)
            self.assertIn(f"[{fam}.fit]", text)
        self.assertIn("measured by python3 -m threewalls.bench.pytorch_kernels", text)

    def test_a_raw_folder_is_never_overwritten_and_unknown_families_are_refused(self):
        out = self.run_bench("--only", "pytorch.add_bwd")
        with self.assertRaisesRegex(SystemExit, "never overwritten"):
            pytorch_kernels.main(["--out", out, "--profile", PROFILE, "--device", "cpu", "--only", "pytorch.add_bwd"])
        with self.assertRaisesRegex(SystemExit, "unknown families"):
            pytorch_kernels.main(["--out", os.path.join(tempdir(self), "x"), "--profile", PROFILE, "--device", "cpu",
                                  "--only", "pytorch.nope"])

    def test_the_decode_attention_body_is_a_device_family_and_the_training_one_host_only(self):
        out = self.run_bench("--only", "pytorch.attention_decode,pytorch.attention_fwd", "--max-points", "2")
        with open(os.path.join(out, "points.jsonl")) as f:
            fams = {json.loads(line)["family"] for line in list(f)[1:]}
        self.assertEqual(fams, {"pytorch.attention_decode", "pytorch_host.attention_decode",
                                "pytorch_host.attention_fwd"})

    def test_the_eager_loops_unweighted_combine_has_host_families_of_its_own_that_refit(self):
        # The scatter without router weights (an EP rank's loop over its received rows): host time only,
        # as the weighted combine's, on the same shapes.
        out = self.run_bench("--only", "pytorch.expert_scatter_unweighted_fwd,pytorch.expert_scatter_unweighted_bwd,"
                             "pytorch.expert_scatter_fwd", "--max-points", "2")
        with open(os.path.join(out, "points.jsonl")) as f:
            lines = [json.loads(line) for line in list(f)[1:]]
        fams = {r["family"] for r in lines}
        self.assertEqual(fams, {"pytorch_host.expert_scatter_unweighted_fwd", "pytorch_host.expert_scatter_unweighted_bwd",
                                "pytorch_host.expert_scatter_fwd"})
        self.assertEqual({r["op"] for r in lines if "unweighted" in r["family"]},
                         {"pytorch_host_expert_scatter_unweighted_fwd", "pytorch_host_expert_scatter_unweighted_bwd"})
        with open(os.path.join(out, "pytorch_kernels.json")) as f:
            shapes = {(p["family"], tuple(p["shape"])) for p in json.load(f)["points"] if "shape" in p}
        self.assertEqual({s for f, s in shapes if f == "pytorch_host.expert_scatter_unweighted_fwd"},
                         {s for f, s in shapes if f == "pytorch_host.expert_scatter_fwd"})
        text = self.refit(out)
        for fam in fams:
            self.assertIn(f"[{fam}.fit]", text)

    def test_the_op_bodies_compute_what_their_ops_mean(self):
        # unpermute: each token's rows, weighted, summed back; permute: rows in expert order.
        y = torch.arange(12.0).reshape(4, 3)
        idx = torch.tensor([[1, 0], [0, 1], [1, 0], [0, 1]])
        w = torch.full((4, 2), 0.5)
        xs, ws, token_of_row = kernels.permute(y, idx, w, 2)
        self.assertEqual(xs.shape, (8, 3))
        self.assertEqual(token_of_row.tolist(), [0, 1, 2, 3, 0, 1, 2, 3])
        back = kernels.unpermute(xs, ws, token_of_row, 4)
        self.assertTrue(torch.allclose(back, y))  # two halves of each token's row
        weights, chosen = kernels.route(torch.tensor([[0.0, 5.0, 1.0]]), 2)
        self.assertEqual(chosen.tolist(), [[1, 2]])
        self.assertAlmostEqual(float(weights.sum()), float(torch.softmax(torch.tensor([0.0, 5.0, 1.0]), 0)[1:].sum()),
                               places=5)
        # attention: one query over two keys, heads side by side; GQA shares a KV head.
        q = torch.zeros(1, 2, 1, 4)
        k = torch.zeros(1, 1, 2, 4)
        v = torch.arange(8.0).reshape(1, 1, 2, 4)
        o = kernels.attention(q, k, v, causal=False)
        self.assertEqual(o.shape, (1, 8))
        self.assertTrue(torch.allclose(o, torch.tensor([[2.0, 3.0, 4.0, 5.0] * 2])))  # the mean of the values
        # The eager loop's combine: out[rows] += ye * weights[rows, slot].
        out = torch.zeros(3, 2)
        rows, slot = torch.tensor([0, 2]), torch.tensor([1, 0])
        wts = torch.tensor([[1.0, 2.0], [0.0, 0.0], [3.0, 4.0]])
        kernels.expert_scatter(out, rows, torch.ones(2, 2), kernels.expert_weights(wts, rows, slot))
        self.assertEqual(out.tolist(), [[2.0, 2.0], [0.0, 0.0], [3.0, 3.0]])
        # Without router weights (the loop over an EP rank's received rows): out[rows] += ye.
        kernels.expert_scatter(out, rows, torch.ones(2, 2), None)
        self.assertEqual(out.tolist(), [[3.0, 3.0], [0.0, 0.0], [4.0, 4.0]])
        self.assertEqual(kernels.expert_gather(torch.arange(6.0).reshape(3, 2), rows).tolist(), [[0, 1], [4, 5]])


if __name__ == "__main__":
    unittest.main()

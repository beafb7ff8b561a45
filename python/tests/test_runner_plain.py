"""The reference runner's unrecorded steps run plain PyTorch (F.linear, index_add_, PyTorch's own
autograd: no Python autograd functions, no markers) and compute what its recorded steps compute; its
eager expert loop is Hugging Face's (one leaf weight per expert projection, torch.where per expert).
On the CPU."""
import os
import unittest

from support import SCENARIOS, tempdir, variant
from threewalls.profiler import Profiler, SamplingConfig
from threewalls.runner import scenario as scen
from threewalls.runner.model import Model
from threewalls.runner.ops import Ctx
from threewalls.runner.run import train_forward

import torch

TINY = os.path.join(SCENARIOS, "tiny_moe.toml")


def graph_nodes(t):
    """Every autograd node behind t, by type name (a Python autograd function's node is named after
    its class: _LinearBackward, _EndMarkerBackward, ...)."""
    seen, names, keep, todo = set(), [], [], [t.grad_fn]
    while todo:
        n = todo.pop()
        if n is None or id(n) in seen:
            continue
        seen.add(id(n))
        keep.append(n)  # ids stay unique while the nodes live
        names.append(type(n).__name__)
        todo.extend(nx for nx, _ in n.next_functions)
    return names


class PlainSteps(unittest.TestCase):
    def setUp(self):
        d = tempdir(self)
        path = variant(TINY, [("train", {"expert_execution": "sequential"})], "tiny_seq", d)
        self.s = scen.load(path)
        # Steps 0, 2, 4, ... are recorded, 1, 3, ... not.
        self.prof = Profiler(os.path.join(d, "run"), sampling=SamplingConfig(record_every_n_steps=2), use_cuda=False,
                             scenario={"name": "t", "path": path, "hash": "0"})
        self.model = Model(self.s, rank=0, device=torch.device("cpu"), dtype=torch.float32)
        self.c = Ctx(self.prof, 0)
        self.c.mb = 0
        g = torch.Generator().manual_seed(5)
        V = self.s.model["vocab_size"]
        self.ids = torch.randint(0, V, (1, self.s.step["seq_length"]), generator=g)
        self.labels = torch.randint(0, V, (1, self.s.step["seq_length"]), generator=g)

    def tearDown(self):
        self.prof.finish(summary=False)

    def step(self, k):
        """Step k's forward and backward: the loss, the autograd node names and the gradients."""
        self.prof.begin_step(k)
        for p in self.model.params.values():
            p.grad = None
        loss = train_forward(self.s, self.model, self.c, self.ids, self.labels)
        nodes = graph_nodes(loss)
        loss.backward()
        self.prof.end_step()
        return loss.detach(), nodes, {n: p.grad.clone() for n, p in self.model.params.items()}

    def test_unrecorded_steps_run_plain_pytorch_and_compute_the_same(self):
        loss_r, nodes_r, grads_r = self.step(0)
        loss_p, nodes_p, grads_p = self.step(1)
        python_fns = ("_Linear", "_ScatterAdd", "_EndMarker", "_Embedding", "_Grouped")
        self.assertTrue(any(n.startswith(python_fns) for n in nodes_r), "the recorded step is instrumented")
        self.assertEqual([n for n in nodes_p if n.startswith(python_fns) or n == "BackwardCFunction"], [])
        # Hugging Face's loop: each expert projection is a leaf weight (no select or slice of a
        # stacked weight, whose backward writes a full-size gradient per expert).
        self.assertNotIn("SelectBackward0", nodes_p)
        self.assertEqual(sum(1 for n in self.model.params if ".experts." in n), 8 * 3)
        self.assertEqual(nodes_p.count("AccumulateGrad"), len(self.model.params))
        self.assertIn("IndexAddBackward0", nodes_p)
        torch.testing.assert_close(loss_p, loss_r)
        self.assertEqual(set(grads_p), set(grads_r))
        for n in grads_r:
            torch.testing.assert_close(grads_p[n], grads_r[n], rtol=1e-4, atol=1e-6, msg=n)

    def test_recorded_steps_read_each_experts_rows(self):
        self.step(0)
        self.step(1)
        self.prof.finish(summary=False)
        from threewalls.profiler.summary import read_records
        recs = read_records(self.prof.out_dir)["phases"]
        reads = [r for r in recs if r["phase"] == "expert_rows_read_fwd"]
        self.assertEqual(sorted({r["step"] for r in recs}), [0])
        self.assertEqual(sorted(r["expert"] for r in reads), list(range(8)))
        self.assertTrue(all(r["wall"] == "host" and r["stream"] == "host" for r in reads))



class StepWallTimes(unittest.TestCase):
    def test_every_measured_step_has_a_wall_time_split_by_recording(self):
        import json
        from threewalls.runner.run import run
        d = tempdir(self)
        path = variant(TINY, [("train", {"expert_execution": "sequential"}), ("run", {"steps": 4, "warmup_steps": 1})],
                       "tiny_walls", d)
        wall = os.path.join(d, "walls.json")
        self.assertEqual(run([path, "--out", os.path.join(d, "run"), "--device", "cpu", "--record-every", "2",
                              "--wall-json", wall]), 0)
        with open(wall) as f:
            j = json.load(f)
        self.assertEqual([(x["step"], x["recorded"]) for x in j["steps"]], [(0, True), (1, False), (2, True), (3, False)])
        self.assertTrue(all(x["wall_ms"] > 0 for x in j["steps"]))
        self.assertGreater(j["median_ms"]["unrecorded"], 0)


if __name__ == "__main__":
    unittest.main()


class HostProbeKeyTest(unittest.TestCase):
    def test_the_runners_probe_key_is_the_one_compare_reads(self):
        """The runner writes its host probe under the key core/host_probe.hpp declares (the one
        `threewalls compare` and calibration::host_probe_scale read)."""
        import re
        from threewalls.runner.run import TORCH_EAGER_OP_KEY
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        with open(os.path.join(root, "core", "include", "threewalls", "core", "host_probe.hpp")) as f:
            m = re.search(r'kTorchEagerOpKey = "([^"]+)"', f.read())
        self.assertIsNotNone(m)
        self.assertEqual(TORCH_EAGER_OP_KEY, m.group(1))

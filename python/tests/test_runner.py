"""The reference runner on the CPU: its run directories are read by `threewalls compare` and line up,
record for record, with `threewalls sim` of the same scenario (the per-expert ops of inference
excepted: those follow each side's own routing)."""
import json
import os
import subprocess
import sys
import unittest

from support import REPO, SCENARIOS, cli, env_with_package, need_bin, run_runner, tempdir, threewalls_bin, variant
from threewalls.profiler.summary import read_records

TINY = os.path.join(SCENARIOS, "tiny_moe.toml")
TINY_EP2 = os.path.join(SCENARIOS, "tiny_moe_ep2.toml")
TINY_INFER = os.path.join(SCENARIOS, "tiny_mla_infer.toml")


class RunnerTest(unittest.TestCase):
    def sim_and_run(self, scenario, world=1):
        need_bin(self)
        d = tempdir(self)
        sim, real = os.path.join(d, "sim"), os.path.join(d, "real")
        cli(self, "sim", scenario, "--out", sim)
        run_runner(self, scenario, real, world=world)
        cmp_json = os.path.join(d, "compare.json")
        cli(self, "compare", real, sim, "--json", cmp_json)
        cli(self, "analyze", real)
        self.sim_dir = sim
        with open(cmp_json) as f:
            return json.load(f), real

    def assert_same_fields(self, real):
        """scripts/check_record_keys.sh: the same keys, and the same field names on every record."""
        r = subprocess.run([os.path.join(REPO, "scripts", "check_record_keys.sh"), self.sim_dir, real],
                           capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def assert_lined_up(self, cmp, records):
        self.assertEqual((cmp["matched_records"], len(cmp["only_in_a"]), len(cmp["only_in_b"])), (records, 0, 0),
                         (cmp["only_in_a"][:5], cmp["only_in_b"][:5]))

    def test_training_lines_up_with_the_simulation(self):
        cmp, real = self.sim_and_run(TINY)
        self.assert_lined_up(cmp, 3 * 153)
        self.assert_same_fields(real)
        with open(os.path.join(real, "summary.json")) as f:
            summ = json.load(f)
        self.assertEqual(len(summ["steps"]), 3)
        self.assertGreater(summ["model_flops_per_step"], 0)
        with open(os.path.join(real, "run.json")) as f:
            run = json.load(f)
        self.assertEqual(run["settings"]["runner"]["experts"], "grouped")
        self.assertEqual(run["scenario"]["name"], "tiny_moe")

    def test_expert_parallel_training_on_two_processes(self):
        d = tempdir(self)
        # With the distributed optimizer (reduce-scatter, all-gather) and dense layers' buckets split.
        path = variant(TINY_EP2, [("train", {"use_distributed_optimizer": True, "grad_bucket_size": 20000})],
                       "tiny_moe_ep2_dist", d)
        cmp, real = self.sim_and_run(path, world=2)
        self.assertGreater(cmp["matched_records"], 1000)
        self.assert_lined_up(cmp, cmp["matched_records"])
        self.assert_same_fields(real)
        phases = {p["phase"] for p in cmp["phases"]}
        for ph in ("moe_dispatch_fwd", "moe_combine_bwd", "moe_sort_fwd", "moe_unsort_bwd", "dp_grad_reduce_scatter",
                   "dp_param_allgather", "optimizer_grad_norm_allreduce", "training_metrics_allreduce"):
            self.assertIn(ph, phases)

    def test_eager_loop_at_ep2_with_unrecorded_steps_on_two_processes(self):
        # python/scenarios/ep2/qwen3_moe_4l_eager_ep2.toml's path, tiny: Hugging Face's loop over the
        # received rows (no torch.where read at ep > 1), PyTorch's host in the simulation
        # (main_grad_copy), every other step unrecorded; the all-to-alls and gradient collectives
        # line up on both ranks, and --wall-json holds both kinds of step.
        d = tempdir(self)
        path = variant(TINY_EP2, [("train", {"expert_execution": "sequential", "use_distributed_optimizer": True}),
                                  ("run", {"framework": "pytorch_eager"}),
                                  ("run.profiler", {"record_every_n_steps": 2})], "tiny_moe_ep2_eager", d)
        need_bin(self)
        sim, real, walls = os.path.join(d, "sim"), os.path.join(d, "real"), os.path.join(d, "walls.json")
        cli(self, "sim", path, "--out", sim)
        run_runner(self, path, real, world=2, extra=["--wall-json", walls])
        cmp_json = os.path.join(d, "compare.json")
        cli(self, "compare", real, sim, "--json", cmp_json)
        with open(cmp_json) as f:
            cmp = json.load(f)
        self.assert_lined_up(cmp, cmp["matched_records"])
        self.assertEqual(cmp["matched_steps"], [0, 2])  # of steps 0..2: every other one recorded
        phases = {p["phase"] for p in cmp["phases"]}
        self.assertTrue({"moe_dispatch_fwd", "moe_combine_bwd", "expert_gate_wgrad", "main_grad_copy",
                         "dp_grad_reduce_scatter", "dp_param_allgather"} <= phases, phases)
        self.assertNotIn("expert_rows_read_fwd", phases)
        with open(walls) as f:
            w = json.load(f)
        self.assertEqual([(x["step"], x["recorded"]) for x in w["steps"]], [(0, True), (1, False), (2, True)])

    def test_eager_experts_mla_and_the_other_options_line_up(self):
        d = tempdir(self)
        mla = variant(TINY, [("model", {"attention": "mla", "num_query_groups": None, "kv_channels": None,
                                        "q_lora_rank": 32, "kv_lora_rank": 32, "qk_head_dim": 16,
                                        "qk_pos_emb_head_dim": 8, "v_head_dim": 16}),
                             ("train", {"expert_execution": "sequential"}), ("run", {"framework": "pytorch_eager"})],
                      "tiny_mla_seq", d)
        cmp, _ = self.sim_and_run(mla)
        self.assert_lined_up(cmp, cmp["matched_records"])
        # Hugging Face's loop: torch.where per expert, a device-to-host read the simulation has too.
        self.assertTrue({"expert_gate_wgrad", "expert_rows_read_fwd"} <= {p["phase"] for p in cmp["phases"]})
        other = variant(TINY, [("model", {"swiglu": False, "normalization": "layernorm",
                                          "untie_embeddings_and_output_weights": False}),
                               ("train", {"expert_execution": "streams:2", "moe_shared_expert_overlap": True,
                                          "sync_routing_stats": True, "sync_after_copy": True}),
                               ("run", {"framework": "pytorch_eager"})], "tiny_other", d)
        cmp, _ = self.sim_and_run(other)
        self.assert_lined_up(cmp, cmp["matched_records"])
        phases = {p["phase"] for p in cmp["phases"]}
        self.assertTrue({"expert_fc1_dgrad", "moe_routing_stats_read_fwd", "host_to_device_sync"} <= phases, phases)

    def test_inference_prefill_and_decode(self):
        grouped = variant(TINY_INFER, [("infer", {"expert_execution": "grouped"})], "tiny_infer_grouped", tempdir(self))
        for scenario, expert_op in ((TINY_INFER, "expert_gate_fwd"), (grouped, "expert_fc1_fwd")):
            cmp, real = self.sim_and_run(scenario)
            per_expert = ("expert_", "moe_routing_stats_read")
            for side in ("only_in_a", "only_in_b"):
                stray = [k for k in cmp[side] if not k["phase"].startswith(per_expert)]
                self.assertEqual(stray, [], side)
            phases = {p["phase"] for p in cmp["phases"]}
            self.assertTrue({"kv_cache_write_fwd", "attn_q_up_fwd", "sampled_token_read", "loss_fwd", expert_op}
                            <= phases, phases)
            with open(os.path.join(real, "summary.json")) as f:
                steps = json.load(f)["steps"]
            self.assertEqual(len(steps), 3)

    def test_a_world_that_differs_from_the_scenario_is_refused(self):
        d = tempdir(self)
        r = subprocess.run([sys.executable, "-m", "threewalls.runner", TINY_EP2, "--out", os.path.join(d, "r"),
                            "--device", "cpu"], env=env_with_package(), capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("the scenario's world is 2 GPUs", r.stderr)
        r = subprocess.run([sys.executable, "-m", "threewalls.runner", os.path.join(SCENARIOS, "..", "..", "..",
                                                                                   "scenarios", "examples",
                                                                                   "small_moe_tp2_ep2.toml"),
                            "--out", os.path.join(d, "r2")], env=env_with_package(), capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("[parallel] tp = 2: the PyTorch runner does not execute tensor parallelism", r.stderr)
        self.assertFalse(os.path.exists(os.path.join(d, "r2")))



def _has_transformers() -> bool:
    try:
        import transformers  # noqa: F401
        return True
    except ImportError:
        return False


_TINY_OLMOE = {"model_type": "olmoe", "hidden_size": 64, "intermediate_size": 32, "num_attention_heads": 4,
               "num_key_value_heads": 4, "num_experts": 8, "num_experts_per_tok": 2, "num_hidden_layers": 16,
               "vocab_size": 250, "max_position_embeddings": 64, "tie_word_embeddings": False}


class HuggingFaceSourceTest(unittest.TestCase):
    """--hf-config: transformers' own model class with random weights as the runner's second source."""

    def files(self, **over):
        d = tempdir(self)
        cfg = dict(_TINY_OLMOE, **over)
        path = os.path.join(d, "config.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        scen = variant(TINY, [("model", {"first_dense_layers": 0, "moe_shared_expert_intermediate_size": 0,
                                         "num_query_groups": 4, "attention": "mha", "ffn_hidden_size": 32,
                                         "moe_ffn_hidden_size": 32, "position_embedding_type": "rope",
                                         "qk_layernorm": True}),
                              ("train", {"expert_execution": "sequential"}),
                              ("run", {"framework": "pytorch_eager"})], "tiny_olmoe_hf", d)
        return d, path, scen

    def run_cpu(self, scen, out, *args):
        return subprocess.run([sys.executable, "-m", "threewalls.runner", scen, "--out", out, "--device", "cpu",
                               *args], env=env_with_package(), capture_output=True, text=True, timeout=240)

    def runner(self, scen, cfg, out, *args):
        return self.run_cpu(scen, out, "--hf-config", cfg, *args)

    @unittest.skipIf(_has_transformers(), "transformers is installed here: the option runs")
    def test_without_transformers_the_option_is_refused(self):
        d, cfg, scen = self.files()
        r = self.runner(scen, cfg, os.path.join(d, "run"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--hf-config needs the transformers package", r.stderr)

    @unittest.skipUnless(_has_transformers(), "transformers is not installed (the GPU machines have it)")
    def test_a_transformers_model_runs_and_compares_with_the_simulation(self):
        d, cfg, scen = self.files()
        run = os.path.join(d, "run")
        r = self.runner(scen, cfg, run)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(run, "run.json")) as f:
            runner = json.load(f)["settings"]["runner"]
        self.assertEqual((runner["model"], runner["model_type"]), ("transformers", "olmoe"))
        phases = {}
        for x in read_records(run)["phases"]:
            phases.setdefault(x["phase"], set()).add(x.get("layer"))
        for name in ("self_attn_fwd", "self_attn_bwd", "moe_fwd", "moe_bwd"):
            self.assertEqual(phases.get(name), {0, 1}, name)
        for name in ("optimizer_step", "training_metrics_read", "host_to_device", "lm_head_fwd"):
            self.assertIn(name, phases)
        if threewalls_bin():
            sim = os.path.join(d, "sim")
            cli(self, "sim", scen, "--out", sim)
            cmp_json = os.path.join(d, "compare.json")
            cli(self, "compare", run, sim, "--json", cmp_json)
            with open(cmp_json) as f:
                self.assertGreater(json.load(f)["matched_records"], 0)

    def test_hf_params_without_a_transformers_model_is_refused(self):
        d, _, scen = self.files()
        r = self.run_cpu(scen, os.path.join(d, "run"), "--hf-params", "bf16")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--hf-params applies to --hf-config runs only", r.stderr)

    @unittest.skipUnless(_has_transformers(), "transformers is not installed (the GPU machines have it)")
    def test_bf16_parameters_train_in_bf16(self):
        d, cfg, scen = self.files()
        run = os.path.join(d, "run")
        r = self.runner(scen, cfg, run, "--hf-params", "bf16")
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        with open(os.path.join(run, "run.json")) as f:
            runner = json.load(f)["settings"]["runner"]
        self.assertTrue(runner["precision"].startswith("bf16 parameters"), runner["precision"])

    @unittest.skipUnless(_has_transformers(), "transformers is not installed (the GPU machines have it)")
    def test_a_config_that_is_not_the_scenarios_model_is_refused(self):
        d, cfg, scen = self.files(hidden_size=128)
        r = self.runner(scen, cfg, os.path.join(d, "run"))
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("hidden_size = 128, but", r.stderr)


if __name__ == "__main__":
    unittest.main()

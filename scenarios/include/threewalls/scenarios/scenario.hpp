#pragma once
// The in-memory form of a scenario file (docs/scenario_reference.md is generated from the registry
// that fills these structs; see registry.hpp). Every field here is set by the loader from exactly one
// registry entry, or derived in validate.cpp (marked "derived").
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "threewalls/core/units.hpp"
#include "threewalls/core/vocabulary.hpp"

namespace threewalls::scenarios {

// GPU kinds and record granularity are the core vocabulary (core/vocabulary.hpp).
using threewalls::GpuKind;
using threewalls::Granularity;
using threewalls::to_string;

enum class AttentionKind : std::uint8_t { mha, gqa, mla };
// How attention runs: fused (flash-style: cuDNN's SDPA graph, split-KV decode) or unfused (batched
// GEMMs with the scores in memory and a softmax kernel between them, as eager frameworks run it).
enum class AttentionImpl : std::uint8_t { fused, unfused };
enum class Normalization : std::uint8_t { rmsnorm, layernorm };
// Which position embedding the StepGraph times: none, or rotary on the queries and keys (Megatron's
// fused RoPE, --position-embedding-type rope).
enum class PositionEmbedding : std::uint8_t { none, rope };
enum class Precision : std::uint8_t { bf16, fp8 };
// Megatron's --fp8-recipe: how Transformer Engine scales the fp8 operands of a GEMM. delayed: one
// scale per tensor from an amax history (the cast kernel records the amax); tensorwise: one scale per
// tensor from the tensor's own amax (current scaling: an amax pass before the cast); blockwise: scales
// per 1 x 128 activation block and 128 x 128 weight block (DeepSeek-V3's recipe); mxfp8: per 1 x 32
// block, E8M0 scales (Blackwell). What each costs: docs/stepgraph.md, "FP8 quantisation".
enum class Fp8Recipe : std::uint8_t { delayed, tensorwise, blockwise, mxfp8 };
// Megatron's --fp8-format: e4m3 everywhere, or hybrid (e4m3 forward, e5m2 gradients). Same bytes and
// kernels either way: it does not change a prediction.
enum class Fp8Format : std::uint8_t { e4m3, hybrid };
enum class RecomputeGranularity : std::uint8_t { none, selective, full };
// What drives the GPU (run.framework): the C++ executor (threewalls run), or PyTorch eager, whose
// every op also pays the framework's host dispatch (host.framework_op).
enum class Framework : std::uint8_t { cpp, pytorch_eager };
enum class RecomputeMethod : std::uint8_t { uniform, block };
// Storage type of Adam's moments (Megatron's precision-aware optimizer: --exp-avg-dtype, --exp-avg-sq-dtype).
enum class MomentDtype : std::uint8_t { fp32, bf16, fp16, fp8 };
// Megatron-FSDP's --data-parallel-sharding-strategy; none = no FSDP (DDP or the distributed optimizer).
enum class DataParallelSharding : std::uint8_t { none, no_shard, optim, optim_grads, optim_grads_params };
enum class Dispatcher : std::uint8_t { alltoall, allgather, flex };
enum class ExpertExecutionKind : std::uint8_t { sequential, streams, grouped, split };
enum class Topology : std::uint8_t { fat_tree, rail_optimized };
enum class OffloadTier : std::uint8_t { hbm, host_pinned, nvme };
enum class CachePolicy : std::uint8_t { lru, lfu };
enum class Prefetch : std::uint8_t { none, next_layer, all_predicted };
enum class ExpertSync : std::uint8_t { barrier, per_expert };
enum class SlowLink : std::uint8_t { none, nvlink, pcie, nic };

struct ModelSpec {
  std::string name;
  int num_layers = 0;
  int hidden_size = 0;
  int ffn_hidden_size = 0;  // dense MLP; 0 when every layer is MoE
  int num_attention_heads = 0;
  int num_query_groups = 0;  // defaults to num_attention_heads (MHA)
  int kv_channels = 0;       // head dim; defaults to hidden_size / num_attention_heads
  AttentionKind attention = AttentionKind::mha;
  AttentionImpl attention_impl = AttentionImpl::fused;
  // Multi-latent attention (DeepSeek-V2/V3); used only when attention = mla.
  int q_lora_rank = 0;  // 0: queries are not compressed
  int kv_lora_rank = 0;
  int qk_head_dim = 0;
  int qk_pos_emb_head_dim = 0;
  int v_head_dim = 0;
  int vocab_size = 0;
  bool swiglu = true;
  bool untie_embeddings_and_output_weights = true;
  Normalization normalization = Normalization::rmsnorm;
  // A norm (model.normalization) of every query and key head before attention (Megatron
  // --qk-layernorm; Qwen3, OLMoE); MHA and GQA only.
  bool qk_layernorm = false;
  PositionEmbedding position_embedding_type = PositionEmbedding::none;
  // Sliding-window attention (Megatron --window-size (window_size - 1, 0), --window-attn-skip-freq;
  // Hugging Face sliding_window): a windowed layer's query attends to itself and the window_size - 1
  // keys before it; with window_attn_skip_freq = n every n-th layer (1-based) keeps full attention.
  // window_size = 0: every layer has full (causal) attention.
  int window_size = 0;
  int window_attn_skip_freq = 0;
  // Mixture of experts. num_experts = 0 means a dense model.
  int num_experts = 0;
  int moe_ffn_hidden_size = 0;
  int moe_router_topk = 0;
  int moe_router_num_groups = 0;                // group-limited routing: expert groups (0 = none)
  int moe_router_group_topk = 0;                // groups each token's experts may come from
  int moe_shared_expert_intermediate_size = 0;  // total size of the shared experts, 0 = none
  int first_dense_layers = 0;                   // layers [0, first_dense_layers) use the dense MLP
  int moe_layer_freq = 1;                       // after those, every n-th layer is MoE
  // Multi-token prediction depths (Megatron --mtp-num-layers; DeepSeek-V3: 1). A training step runs
  // them after the last layer, on the last virtual pipeline stage, as layers num_layers ..
  // num_layers + mtp_num_layers - 1, each of the last layer's kind; inference steps do not.
  int mtp_num_layers = 0;

  [[nodiscard]] bool is_moe() const { return num_experts > 0; }
  // Whether layer `l` is a multi-token-prediction depth (l >= num_layers).
  [[nodiscard]] bool is_mtp_layer(int l) const { return l >= num_layers; }
  // Whether layer `l` (0-based, global) has an MoE MLP (Megatron's moe_layer_freq pattern; an MTP
  // depth has the last layer's MLP).
  [[nodiscard]] bool layer_is_moe(int l) const {
    if (l >= num_layers) l = num_layers - 1;
    return is_moe() && l >= first_dense_layers && ((l - first_dense_layers) % moe_layer_freq == 0);
  }
  // The keys a query of layer `l` attends to at most (itself included), 0 = all earlier keys (full
  // attention). An MTP depth has the last layer's attention.
  [[nodiscard]] int attention_window(int l) const {
    if (window_size <= 0) return 0;
    if (l >= num_layers) l = num_layers - 1;
    return window_attn_skip_freq > 0 && (l + 1) % window_attn_skip_freq == 0 ? 0 : window_size;
  }
  // The index that stands for the output head among a stage's units (after every layer and MTP depth
  // a training step runs).
  [[nodiscard]] int head_unit(bool training) const { return num_layers + (training ? mtp_num_layers : 0); }
  [[nodiscard]] int num_moe_layers() const;
  // Vocabulary padded as Megatron does: to a multiple of 128 * tp.
  [[nodiscard]] std::int64_t padded_vocab_size(int tp) const;

  bool operator==(const ModelSpec&) const = default;
};

struct ParallelSpec {
  int tp = 1;
  int cp = 1;
  int pp = 1;
  int vpp = 1;
  int dp = 0;   // 0 in the file means "derive from the world size"; always set after validation
  int ep = 1;
  int etp = 1;
  int edp = 0;  // derived: world / (etp * ep * pp)
  bool sequence_parallel = false;
  // Explicit split of layers over the pp * vpp virtual stages, in virtual-stage order
  // (stage-major within each model chunk as Megatron numbers them: chunk c of stage s is entry c*pp+s).
  std::vector<int> layers_per_stage;
  int first_stage_layers = 0;  // Megatron's decoder_first_pipeline_num_layers; 0 = even split
  int last_stage_layers = 0;   // Megatron's decoder_last_pipeline_num_layers; 0 = even split

  bool operator==(const ParallelSpec&) const = default;
};

struct ExpertExecution {
  ExpertExecutionKind kind = ExpertExecutionKind::grouped;
  int streams = 1;  // N of "streams:N" and "split:N"

  bool operator==(const ExpertExecution&) const = default;
};

// Execution options shared by [train] and [infer].
struct ExecOptions {
  Precision precision = Precision::bf16;
  Fp8Recipe fp8_recipe = Fp8Recipe::delayed;  // with precision = fp8
  Fp8Format fp8_format = Fp8Format::hybrid;   // with precision = fp8
  std::vector<std::string> cuda_graph_scope;  // "attn", "mlp", "moe_router", "moe_preprocess", "full_iteration"
  Dispatcher token_dispatcher = Dispatcher::alltoall;
  ExpertExecution expert_execution;
  bool sync_routing_stats = false;  // GPU->CPU read of routing statistics per MoE layer
  bool sync_after_copy = false;     // a stream sync after every host<->device copy

  [[nodiscard]] bool graph_scope(const std::string& s) const;

  bool operator==(const ExecOptions&) const = default;
};

struct TrainSpec {
  ExecOptions exec;
  int micro_batch_size = 0;
  int global_batch_size = 0;
  int seq_length = 0;
  RecomputeGranularity recompute_granularity = RecomputeGranularity::none;
  RecomputeMethod recompute_method = RecomputeMethod::uniform;
  int recompute_num_layers = 0;
  std::vector<std::string> recompute_modules;  // for selective
  bool use_distributed_optimizer = true;
  bool overlap_grad_reduce = false;
  bool overlap_param_gather = false;
  bool tp_comm_overlap = false;
  bool moe_shared_expert_overlap = false;
  // Megatron's combined 1F1B: the forward of one micro-batch and the backward of another run layer by
  // layer together, each one's dispatch/combine on the expert-parallel communication stream while the
  // other computes.
  bool overlap_moe_expert_parallel_comm = false;
  bool delay_wgrad_compute = false;  // expert weight-gradient GEMMs issued after the dispatch backward
  // Megatron-FSDP: what is sharded over the data-parallel ranks (the expert-data-parallel ranks for
  // expert parameters); with none the distributed optimizer decides.
  DataParallelSharding data_parallel_sharding_strategy = DataParallelSharding::none;
  // Precision of the parameter state (scenarios::parameter_bytes owns what each costs): gradients
  // accumulated and reduced in fp32 (Megatron's default for bf16; --grad-reduce-in-bf16 turns it
  // off), model weights kept and gathered in fp8 (--fp8-param-gather), Adam's moments.
  bool grad_reduce_in_fp32 = true;
  bool fp8_param_gather = false;
  // Megatron's first_last_layers_bf16 (on in Megatron-Bridge's fp8 current-scaling config): the first
  // num_layers_at_start_in_bf16 and the last num_layers_at_end_in_bf16 layers run their GEMMs in bf16
  // without fp8 casts; an MTP depth stays in fp8.
  bool first_last_layers_bf16 = false;
  int num_layers_at_start_in_bf16 = 1;
  int num_layers_at_end_in_bf16 = 1;
  MomentDtype exp_avg_dtype = MomentDtype::fp32;
  MomentDtype exp_avg_sq_dtype = MomentDtype::fp32;
  double routing_imbalance = 1.0;  // max / mean tokens received per EP rank (1 = balanced)
  double grad_bucket_size_params = 40e6;

  [[nodiscard]] bool recompute_module(const std::string& m) const;
  // Whether layer `l` of a model of `num_layers` runs in bf16 in an fp8 step (first_last_layers_bf16).
  [[nodiscard]] bool layer_in_bf16(int l, int num_layers) const {
    return first_last_layers_bf16 && l < num_layers &&
           (l < num_layers_at_start_in_bf16 || l >= num_layers - num_layers_at_end_in_bf16);
  }
  // What the data-parallel ranks shard (the one owner of these rules): the optimizer state with the
  // distributed optimizer or any FSDP strategy but no_shard; gradients (reduce-scattered after every
  // backward of a layer) with optim_grads and optim_grads_params; parameters (all-gathered before
  // every forward and backward of a layer) with optim_grads_params.
  [[nodiscard]] bool shards_optimizer_state() const;
  [[nodiscard]] bool shards_gradients() const;
  [[nodiscard]] bool shards_parameters() const;
  // derived
  int num_microbatches = 0;
  // Sets the step's micro-batches per data-parallel rank to m (>= 1), keeping micro_batch_size:
  // global_batch_size = m x micro_batch_size x dp, num_microbatches = m.
  void set_microbatches(int m, int dp);

  bool operator==(const TrainSpec&) const = default;
};

struct ExpertOffloadSpec {
  bool enabled = false;
  OffloadTier tier = OffloadTier::hbm;
  std::string nvme_path;
  int cache_experts_per_layer = 0;
  CachePolicy policy = CachePolicy::lru;
  Prefetch prefetch = Prefetch::none;
  ExpertSync sync = ExpertSync::barrier;
  int copy_streams = 1;

  bool operator==(const ExpertOffloadSpec&) const = default;
};

struct InferSpec {
  ExecOptions exec;
  int batch_size = 0;
  int prompt_length = 0;
  int generate_tokens = 0;
  Precision kv_cache_precision = Precision::bf16;
  double routing_skew = 0.0;      // Zipf exponent of expert popularity (0 = uniform)
  double routing_locality = 0.0;  // probability a token keeps its previous step's experts
  ExpertOffloadSpec expert_offload;

  bool operator==(const InferSpec&) const = default;
};

struct Slowdown {
  int rank = -1;
  double factor = 1.0;  // durations on that GPU (or link) multiplied by this
  SlowLink link = SlowLink::none;  // none: the GPU's compute is slow
  int from_step = 0;
  int to_step = -1;  // inclusive; -1 = until the end

  bool operator==(const Slowdown&) const = default;
};

struct ClusterSpec {
  GpuKind gpu = GpuKind::h100;
  int gpus_per_node = 0;
  int nodes = 0;
  Bytes gpu_memory;                 // default by GPU kind
  BytesPerSecond nvlink_bandwidth{450e9};  // per GPU, per direction; default by GPU kind
  Seconds nvlink_latency;
  BytesPerSecond pcie_bandwidth;    // per GPU, per direction
  Seconds pcie_latency;
  BytesPerSecond nic_bandwidth;     // one NIC per GPU, per direction
  Seconds nic_latency;
  Topology topology = Topology::rail_optimized;
  int leaf_switch_ports = 64;       // node-facing ports per leaf switch
  double oversubscription = 1.0;    // leaf down/up bandwidth ratio
  Seconds switch_latency;
  std::vector<Slowdown> slowdowns;

  [[nodiscard]] int world_size() const { return gpus_per_node * nodes; }

  bool operator==(const ClusterSpec&) const = default;
};

// run.profiler.ranks: which ranks write a phases file.
enum class RecordedRanks : std::uint8_t {
  automatic,        // "auto": every rank while the run directory stays small (run_volume.hpp), else representatives
  all,              // "all": every rank
  representatives,  // "representatives": one rank per rank class
  listed,           // an array of ranks
};

struct ProfilerSpec {
  bool enabled = true;
  int start_step = 0;
  int end_step = -1;  // inclusive; -1 = last step
  int record_every_n_steps = 10;
  int flush_every_n_steps = 10;
  RecordedRanks recorded = RecordedRanks::automatic;
  std::vector<int> ranks;  // the ranks of RecordedRanks::listed, else empty
  Granularity granularity = Granularity::layer;

  bool operator==(const ProfilerSpec&) const = default;
};

struct RunSpec {
  Framework framework = Framework::cpp;
  int steps = 3;
  int warmup_steps = 1;
  std::uint64_t seed = 1234;
  // CUDA_DEVICE_MAX_CONNECTIONS of the process: the GPU's hardware work queues its streams map onto
  // (1..32, CUDA's default 8). The simulator's executor has this many queues; threewalls run and the
  // reference runner set the variable before they create the CUDA context.
  int cuda_device_max_connections = 8;
  ProfilerSpec profiler;

  bool operator==(const RunSpec&) const = default;
};

struct Scenario {
  int schema_version = 0;
  std::string name;
  std::string description;
  ModelSpec model;
  ParallelSpec parallel;
  std::optional<TrainSpec> train;
  std::optional<InferSpec> infer;
  ClusterSpec cluster;
  std::string calibration_profile = "auto";  // "auto" = the shipped profile of cluster.gpu
  RunSpec run;

  // Provenance, set by the loader.
  std::string source_path;
  std::string content_hash;  // hex FNV-1a 64 of the file bytes

  [[nodiscard]] const ExecOptions& exec() const { return train ? train->exec : infer->exec; }
  [[nodiscard]] bool is_training() const { return train.has_value(); }
  [[nodiscard]] int world_size() const { return cluster.world_size(); }

  bool operator==(const Scenario&) const = default;
};

const char* to_string(AttentionKind v);
const char* to_string(AttentionImpl v);
const char* to_string(Precision v);
const char* to_string(Fp8Recipe v);
const char* to_string(Fp8Format v);
const char* to_string(Dispatcher v);
const char* to_string(RecomputeGranularity v);
const char* to_string(DataParallelSharding v);
const char* to_string(Framework v);
const char* to_string(OffloadTier v);
std::string to_string(const ExpertExecution& v);

}  // namespace threewalls::scenarios

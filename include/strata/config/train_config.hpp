// SPDX-License-Identifier: Apache-2.0
#pragma once

// The training configuration: the seed article's table (batch_size_per_gpu,
// gradient_accumulation_steps, world_size, communication_backend, mixed_precision_dtype,
// checkpoint_interval, lr_schedule) plus what the trainer, loader, parallel policies and tuner
// read. One table of key descriptors (`visit_keys`) drives the TOML reader, the command-line
// overrides, range checks, the printer and the documentation test, so a key is declared once.

#include <array>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>
#include <system_error>

#include "strata/core/error.hpp"

namespace strata::config {

enum class comm_backend_kind { threads, mpi, nccl };
enum class precision_dtype { float32, float16, bfloat16 };
enum class lr_schedule_kind { constant, step, cosine };
enum class optimizer_kind { sgd, adamw };
enum class pipeline_schedule_kind { gpipe, one_f_one_b, interleaved_1f1b, zero_bubble_h1 };
enum class gradient_sync_kind { all_reduce, parameter_server, hierarchical, all_gather };
enum class compression_kind { none, float16, bfloat16, topk };
enum class sampler_remainder_kind { pad, drop };
enum class bucket_launch_kind { automatic, async, blocking };
// auto: continue this run's newest checkpoint if there is one; true: demand one; false: start
// afresh (an earlier run of the same name is kept aside).
enum class resume_mode { automatic, required, never };
// Who computes the layers' matrix products (model/gemm.hpp); auto chooses by the CPU.
enum class gemm_kind { automatic, onednn, openblas, eigen };
// Whether products of bfloat16 values run in bfloat16 (model::bf16_products_mode).
enum class bf16_products_kind { automatic, on, off };
// Which collectives the ranks fingerprint before data moves (comm::fingerprint_mode).
enum class comm_fingerprint_kind { always, sampled, off };

// The spelling of each enum value in TOML and on the command line.
template <class E>
struct enum_names;
template <>
struct enum_names<comm_backend_kind> {
  static constexpr std::array<std::string_view, 3> names{"threads", "mpi", "nccl"};
};
template <>
struct enum_names<precision_dtype> {
  static constexpr std::array<std::string_view, 3> names{"float32", "float16", "bfloat16"};
};
template <>
struct enum_names<lr_schedule_kind> {
  static constexpr std::array<std::string_view, 3> names{"constant", "step", "cosine"};
};
template <>
struct enum_names<optimizer_kind> {
  static constexpr std::array<std::string_view, 2> names{"sgd", "adamw"};
};
template <>
struct enum_names<pipeline_schedule_kind> {
  static constexpr std::array<std::string_view, 4> names{"gpipe", "one_f_one_b", "interleaved_1f1b",
                                                         "zero_bubble_h1"};
};
template <>
struct enum_names<gradient_sync_kind> {
  static constexpr std::array<std::string_view, 4> names{"all_reduce", "parameter_server",
                                                         "hierarchical", "all_gather"};
};
template <>
struct enum_names<compression_kind> {
  static constexpr std::array<std::string_view, 4> names{"none", "float16", "bfloat16", "topk"};
};

template <>
struct enum_names<bucket_launch_kind> {
  static constexpr std::array<std::string_view, 3> names{"auto", "async", "blocking"};
};

template <>
struct enum_names<resume_mode> {
  static constexpr std::array<std::string_view, 3> names{"auto", "true", "false"};
};

template <>
struct enum_names<gemm_kind> {
  static constexpr std::array<std::string_view, 4> names{"auto", "onednn", "openblas", "eigen"};
};

template <>
struct enum_names<bf16_products_kind> {
  static constexpr std::array<std::string_view, 3> names{"auto", "on", "off"};
};

template <>
struct enum_names<comm_fingerprint_kind> {
  static constexpr std::array<std::string_view, 3> names{"always", "sampled", "off"};
};

template <>
struct enum_names<sampler_remainder_kind> {
  static constexpr std::array<std::string_view, 2> names{"pad", "drop"};
};

template <class E>
concept named_enum = std::is_enum_v<E> && requires {
  enum_names<E>::names;
};

template <named_enum E>
constexpr std::string_view to_string(E value) noexcept {
  const auto i = static_cast<std::size_t>(value);
  return i < enum_names<E>::names.size() ? enum_names<E>::names[i] : std::string_view("?");
}

template <named_enum E>
constexpr std::optional<E> parse_enum(std::string_view text) noexcept {
  for (std::size_t i = 0; i < enum_names<E>::names.size(); ++i) {
    if (enum_names<E>::names[i] == text) {
      return static_cast<E>(i);
    }
  }
  return std::nullopt;
}

// "threads | mpi | nccl"
template <named_enum E>
std::string allowed_values() {
  std::string out;
  for (std::size_t i = 0; i < enum_names<E>::names.size(); ++i) {
    if (i != 0) {
      out += " | ";
    }
    out += enum_names<E>::names[i];
  }
  return out;
}

// Every runtime knob of a training run. Defaults are those of the Fashion-MNIST examples.
struct train_config {
  // The seed article's table (names kept exactly).
  std::int64_t batch_size_per_gpu = 64;
  std::int64_t gradient_accumulation_steps = 1;
  std::int64_t world_size = 1;
  comm_backend_kind communication_backend = comm_backend_kind::threads;
  precision_dtype mixed_precision_dtype = precision_dtype::float32;
  std::int64_t checkpoint_interval = 1;  // epochs; 0 = only at the end of training
  lr_schedule_kind lr_schedule = lr_schedule_kind::cosine;

  // Training and optimizer.
  std::int64_t epochs = 15;
  std::int64_t seed = 42;
  optimizer_kind optimizer = optimizer_kind::sgd;
  double lr = 0.05;
  double momentum = 0.9;
  bool nesterov = true;
  double weight_decay = 5e-4;
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  double warmup_epochs = 0.0;
  std::int64_t lr_step_size = 5;  // epochs between decays of the step schedule
  double lr_gamma = 0.1;          // the step schedule's factor
  double lr_min = 0.0;            // the cosine schedule's floor

  // Data.
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::int64_t loader_workers = 2;        // 0 = augment synchronously in the training thread
  std::int64_t prefetch_depth = 4;        // ready batches kept ahead of the step
  std::int64_t blas_threads = 0;          // GEMM threads of the process; 0 = its CPUs / its ranks
  gemm_kind gemm = gemm_kind::automatic;  // GEMM provider of the layers' products
  bf16_products_kind bf16_products = bf16_products_kind::automatic;  // bfloat16 products
  bool augment = true;
  double loader_timeout = 60.0;  // seconds the step waits for one batch before failing
  sampler_remainder_kind sampler_remainder = sampler_remainder_kind::pad;
  bool drop_last = false;  // drop each rank's last partial batch of an epoch

  // Checkpoints.
  std::string checkpoint_dir = "checkpoints";
  std::int64_t checkpoint_keep = 3;
  std::string run_name{};  // checkpoints go to checkpoint_dir/<run name>; empty = run-<fingerprint>
  resume_mode resume = resume_mode::automatic;

  // Run control and reporting.
  std::int64_t max_steps = 0;          // stop (saving a checkpoint) after this many steps; 0 = none
  std::int64_t max_train_samples = 0;  // use the first N training samples; 0 = all
  std::int64_t max_eval_samples = 0;   // evaluate on the first N test samples; 0 = all
  std::string metrics_file{};          // JSONL rows per step and per epoch; empty = none
  std::int64_t log_every = 100;        // steps between log lines when not on a terminal

  // Parallel layout: world_size = data x tensor x pipeline.
  std::int64_t data_parallel_size = 0;  // 0 = world_size / (tensor x pipeline)
  std::int64_t tensor_parallel_size = 1;
  std::int64_t pipeline_parallel_size = 1;
  pipeline_schedule_kind pipeline_schedule = pipeline_schedule_kind::one_f_one_b;
  std::int64_t micro_batches = 1;
  gradient_sync_kind gradient_sync = gradient_sync_kind::all_reduce;
  std::int64_t bucket_size_mb = 25;
  std::int64_t zero_stage = 0;  // 1 = optimizer state sharded over the data-parallel ranks (zero1)
  bucket_launch_kind bucket_launch = bucket_launch_kind::automatic;
  compression_kind gradient_compression = compression_kind::none;
  double topk_ratio = 0.01;
  std::int64_t hierarchy_group_size = 0;        // gradient_sync = hierarchical; 0 = automatic
  std::int64_t parameter_servers = 0;           // gradient_sync = parameter_server; 0 = every rank
  bool dedicated_parameter_servers = false;     // the servers are the last ranks and do not train
  bool parameter_server_async = false;          // dedicated servers apply each push as it comes
  std::int64_t parameter_server_staleness = 0;  // async: steps the fastest worker may lead by

  // Memory and batch adaptation.
  std::int64_t activation_checkpoint_every = 0;  // segments of k layers recomputed; 0 = off
  std::int64_t memory_budget_mb = 0;             // 0 = 80% of the machine's (or cgroup's) memory
  bool adaptive_batch = false;
  std::int64_t adaptive_batch_min = 8;
  std::int64_t adaptive_batch_max = 512;

  // Mixed precision: the dynamic loss scaler of float16 (and of bfloat16 when given one).
  double loss_scale_initial = 65536.0;
  double loss_scale_growth_factor = 2.0;
  double loss_scale_backoff_factor = 0.5;
  std::int64_t loss_scale_growth_interval = 2000;
  std::int64_t loss_scale_hysteresis = 1;
  double loss_scale_min = 1.0;
  std::int64_t loss_scale_max_skips = 20;

  // Communication.
  double comm_timeout = 300.0;  // seconds any wait may take before it becomes a comm_error
  comm_fingerprint_kind comm_fingerprint = comm_fingerprint_kind::always;

  // Keys that policies declare for themselves (a user's policy included): the [policy] table,
  // `--policy.NAME VALUE` on the command line. Values as text (a TOML string without its quotes);
  // the policy that declares a key parses and checks it (config/policy_keys.hpp), and a trainer
  // refuses a key that none of its policies declares.
  std::map<std::string, std::string> policy{};

  bool operator==(const train_config&) const = default;
};

// ---- key descriptors ---------------------------------------------------------------------------

struct int_key {
  std::string_view name;
  std::int64_t train_config::*member;
  std::int64_t min;
  std::int64_t max;
  std::string_view doc;
};

struct real_key {
  std::string_view name;
  double train_config::*member;
  double min;
  double max;
  bool min_exclusive;  // (min, max] instead of [min, max]
  std::string_view doc;
};

struct bool_key {
  std::string_view name;
  bool train_config::*member;
  std::string_view doc;
};

struct string_key {
  std::string_view name;
  std::string train_config::*member;
  std::string_view doc;
};

template <named_enum E>
struct enum_key {
  std::string_view name;
  E train_config::*member;
  std::string_view doc;
};

inline constexpr std::int64_t int_max = std::numeric_limits<std::int64_t>::max();
inline constexpr double real_max = std::numeric_limits<double>::max();

// Calls v(descriptor) for every key, in the order of the documentation and of print_toml.
template <class Visitor>
constexpr void visit_keys(Visitor&& v) {
  using c = train_config;
  // The seed table.
  v(int_key{"batch_size_per_gpu", &c::batch_size_per_gpu, 1, 1 << 20,
            "Samples per rank in one micro-step."});
  v(int_key{"gradient_accumulation_steps", &c::gradient_accumulation_steps, 1, 1 << 16,
            "Micro-steps whose gradients are summed before one optimizer step."});
  v(int_key{"world_size", &c::world_size, 1, 1 << 16,
            "Number of ranks; must equal the launcher's (mpiexec -n, threads)."});
  v(enum_key<comm_backend_kind>{"communication_backend", &c::communication_backend,
                                "How ranks talk: threads of one process, MPI, or NCCL."});
  v(enum_key<precision_dtype>{"mixed_precision_dtype", &c::mixed_precision_dtype,
                              "Compute dtype; parameters stay float32 (master weights)."});
  v(int_key{"checkpoint_interval", &c::checkpoint_interval, 0, int_max,
            "Epochs between checkpoints; 0 = only at the end."});
  v(enum_key<lr_schedule_kind>{"lr_schedule", &c::lr_schedule, "Learning-rate schedule."});
  // Training and optimizer.
  v(int_key{"epochs", &c::epochs, 1, 1 << 20, "Epochs to train."});
  v(int_key{"seed", &c::seed, 0, int_max,
            "Seed of every random stream (init, shuffle, augmentation, dropout)."});
  v(enum_key<optimizer_kind>{"optimizer", &c::optimizer, "Optimizer."});
  v(real_key{"lr", &c::lr, 0.0, 1e3, true, "Peak learning rate (after warmup)."});
  v(real_key{"momentum", &c::momentum, 0.0, 1.0, false, "SGD momentum; 0 = none."});
  v(bool_key{"nesterov", &c::nesterov, "Nesterov momentum for SGD."});
  v(real_key{"weight_decay", &c::weight_decay, 0.0, 1.0, false,
             "Decoupled weight decay (AdamW) or L2 (SGD)."});
  v(real_key{"adam_beta1", &c::adam_beta1, 0.0, 1.0, false, "AdamW first-moment decay."});
  v(real_key{"adam_beta2", &c::adam_beta2, 0.0, 1.0, false, "AdamW second-moment decay."});
  v(real_key{"adam_eps", &c::adam_eps, 0.0, 1.0, true, "AdamW denominator epsilon."});
  v(real_key{"warmup_epochs", &c::warmup_epochs, 0.0, real_max, false,
             "Linear warmup to lr, in epochs (fractions allowed), before the schedule."});
  v(int_key{"lr_step_size", &c::lr_step_size, 1, int_max,
            "Epochs between decays of the step schedule."});
  v(real_key{"lr_gamma", &c::lr_gamma, 0.0, 1.0, true, "Factor of each step-schedule decay."});
  v(real_key{"lr_min", &c::lr_min, 0.0, real_max, false, "Floor of the cosine schedule."});
  // Data.
  v(string_key{"data_dir", &c::data_dir,
               "Directory with the IDX files (Debian: dataset-fashion-mnist)."});
  v(int_key{"loader_workers", &c::loader_workers, 0, 256,
            "Loader threads that augment ahead of the step; 0 = in the training thread."});
  v(int_key{"prefetch_depth", &c::prefetch_depth, 1, 1024,
            "Ready batches the loader keeps ahead of the step."});
  v(int_key{"blas_threads", &c::blas_threads, 0, 4096,
            "GEMM threads of the process (OpenBLAS's pool, oneDNN's OpenMP team per calling "
            "thread), set by the trainer; 0 = automatic: the CPUs "
            "the process may use divided by the ranks that run on them (comm::threads: "
            "world_size; under mpiexec 1 when bound to its cores, else the node's ranks), unless "
            "OPENBLAS_NUM_THREADS or OMP_NUM_THREADS sets them."});
  v(enum_key<gemm_kind>{
      "gemm", &c::gemm,
      "Who computes the layers' matrix products: auto = the provider measured fastest on this "
      "class of CPU (OpenBLAS on AMD's AVX2 cores, where its kernels match), else oneDNN, else "
      "an OpenBLAS whose kernels match the CPU, else Eigen's own (the log names the choice, its "
      "kernels and its GFLOP/s, and what it skipped); onednn, openblas or eigen force one."});
  v(enum_key<bf16_products_kind>{
      "bf16_products", &c::bf16_products,
      "Under mixed_precision_dtype = bfloat16, whether the products multiply in bfloat16 "
      "(oneDNN, float32 accumulation): auto = where the CPU has AMX-BF16; on = wherever oneDNN "
      "can (refused at set-up where it cannot: not on oneDNN, or a CPU without AVX-512); off = "
      "never (float32 products of the values rounded to bfloat16)."});
  v(bool_key{"augment", &c::augment, "Apply the example's augmentation chain to training data."});
  v(real_key{"loader_timeout", &c::loader_timeout, 0.0, 86400.0, true,
             "Seconds the step waits for one batch before the loader reports a stalled worker."});
  v(enum_key<sampler_remainder_kind>{
      "sampler_remainder", &c::sampler_remainder,
      "Samples beyond a multiple of the data-parallel ranks: pad by repeating, or drop."});
  v(bool_key{"drop_last", &c::drop_last, "Drop each rank's last partial batch of an epoch."});
  // Checkpoints.
  v(string_key{"checkpoint_dir", &c::checkpoint_dir,
               "Directory of the runs' checkpoint directories (<run name>/epoch-N/)."});
  v(string_key{"run_name", &c::run_name,
               "This run's directory under checkpoint_dir; empty = run-<fingerprint>, 8 hex digits "
               "of the settings that shape the training state and of the model's tensors."});
  v(int_key{"checkpoint_keep", &c::checkpoint_keep, 1, 1 << 20,
            "Newest checkpoints kept; older ones are removed."});
  v(enum_key<resume_mode>{
      "resume", &c::resume,
      "auto: continue the newest valid checkpoint of this run (same fingerprint) if there is "
      "one; true: demand one; false: start afresh, keeping an earlier run's checkpoints aside "
      "(<run name>.1, .2, ...)."});
  // Run control and reporting.
  v(int_key{"max_steps", &c::max_steps, 0, int_max,
            "Stop after this many optimizer steps in all, saving a checkpoint; 0 = no limit."});
  v(int_key{"max_train_samples", &c::max_train_samples, 0, int_max,
            "Train on the first N samples of the training set; 0 = all."});
  v(int_key{"max_eval_samples", &c::max_eval_samples, 0, int_max,
            "Evaluate on the first N samples of the test set; 0 = all."});
  v(string_key{"metrics_file", &c::metrics_file,
               "JSONL file with one row per step and per epoch; empty = none."});
  v(int_key{"log_every", &c::log_every, 1, int_max,
            "Steps between progress lines when the output is not a terminal."});
  // Parallel layout.
  v(int_key{"data_parallel_size", &c::data_parallel_size, 0, 1 << 16,
            "Data-parallel ranks; 0 = world_size / (tensor x pipeline)."});
  v(int_key{"tensor_parallel_size", &c::tensor_parallel_size, 1, 1 << 16,
            "Ranks splitting each tensor-parallel layer (parallel::tensor<...>; 1 elsewhere)."});
  v(int_key{"pipeline_parallel_size", &c::pipeline_parallel_size, 1, 1 << 16, "Pipeline stages."});
  v(enum_key<pipeline_schedule_kind>{"pipeline_schedule", &c::pipeline_schedule,
                                     "Order of forward and backward micro-batches."});
  v(int_key{"micro_batches", &c::micro_batches, 1, 1 << 16,
            "Pieces each loader batch is cut into for a pipeline (parallel::pipeline)."});
  v(enum_key<gradient_sync_kind>{"gradient_sync", &c::gradient_sync,
                                 "How data-parallel ranks combine gradients."});
  v(int_key{"bucket_size_mb", &c::bucket_size_mb, 1, 1 << 16,
            "Gradient bucket size for the reductions overlapped with backward (all-reduce, "
            "zero1, hierarchical, parameter-server push), MiB."});
  v(enum_key<bucket_launch_kind>{
      "bucket_launch", &c::bucket_launch,
      "How a gradient bucket's reduction starts once backward completes it: async (a "
      "non-blocking collective, waited for before the optimizer step), blocking (reduced on the "
      "spot; faster where non-blocking collectives progress only when polled, as Open MPI's), "
      "auto (blocking on comm::mpi, async on the others). data<hierarchical> and "
      "data<parameter_server> overlap only with async launches; with blocking ones they send "
      "the whole gradient after backward."});
  v(int_key{"zero_stage", &c::zero_stage, 0, 1,
            "Sharded optimizer state: 0 = every data-parallel rank keeps all of it; 1 = each rank "
            "keeps and updates 1/N of it (parallel::zero1: gradients reduce-scattered, "
            "parameters all-gathered after the update)."});
  v(enum_key<compression_kind>{"gradient_compression", &c::gradient_compression,
                               "Gradient compression before communication."});
  v(real_key{"topk_ratio", &c::topk_ratio, 0.0, 1.0, true,
             "Share of gradient entries top-k compression sends."});
  v(int_key{"hierarchy_group_size", &c::hierarchy_group_size, 0, 1 << 16,
            "Ranks per local group of the hierarchical all-reduce; 0 = the largest divisor of "
            "world_size not above its square root."});
  v(int_key{"parameter_servers", &c::parameter_servers, 0, 1 << 16,
            "Ranks 0 .. parameter_servers - 1 also serve a shard of the parameters and its "
            "optimizer state (gradient_sync = parameter_server); 0 = every rank."});
  v(bool_key{"dedicated_parameter_servers", &c::dedicated_parameter_servers,
             "The parameter servers are the last parameter_servers ranks and only serve; the "
             "other ranks train."});
  v(bool_key{"parameter_server_async", &c::parameter_server_async,
             "Dedicated parameter servers apply each worker's gradient as it arrives "
             "(asynchronous SGD, bounded staleness) instead of averaging every step."});
  v(int_key{"parameter_server_staleness", &c::parameter_server_staleness, 0, 1 << 20,
            "Asynchronous parameter server: how many steps the fastest worker may run ahead of "
            "the slowest."});
  // Memory and batch adaptation.
  v(int_key{"activation_checkpoint_every", &c::activation_checkpoint_every, 0, 1 << 20,
            "Activation checkpointing: keep one output per k layers, recompute the rest in "
            "backward; 0 = off."});
  v(int_key{"memory_budget_mb", &c::memory_budget_mb, 0, std::int64_t{1} << 40,
            "Memory budget per rank for batch::adaptive, MiB; 0 = 80% of the machine's (or "
            "cgroup's) memory, shared by the ranks on the machine."});
  v(bool_key{"adaptive_batch", &c::adaptive_batch,
             "Pick the micro-batch from live memory, keeping the global batch fixed."});
  v(int_key{"adaptive_batch_min", &c::adaptive_batch_min, 1, 1 << 20,
            "Smallest micro-batch the adaptive policy may use."});
  v(int_key{"adaptive_batch_max", &c::adaptive_batch_max, 1, 1 << 20,
            "Largest micro-batch the adaptive policy may use."});
  // Mixed precision.
  v(real_key{"loss_scale_initial", &c::loss_scale_initial, 1.0, 1099511627776.0, false,
             "Loss scale at the start (float16 dynamic loss scaling)."});
  v(real_key{"loss_scale_growth_factor", &c::loss_scale_growth_factor, 1.0, 1024.0, true,
             "Factor the loss scale grows by after loss_scale_growth_interval finite steps."});
  v(real_key{"loss_scale_backoff_factor", &c::loss_scale_backoff_factor, 0.0, 0.999, true,
             "Factor the loss scale shrinks by on an overflow."});
  v(int_key{"loss_scale_growth_interval", &c::loss_scale_growth_interval, 1, int_max,
            "Finite steps in a row before the loss scale grows."});
  v(int_key{"loss_scale_hysteresis", &c::loss_scale_hysteresis, 1, 1 << 20,
            "Overflows in a row before the loss scale backs off."});
  v(real_key{"loss_scale_min", &c::loss_scale_min, 1e-30, 1099511627776.0, false,
             "Smallest loss scale."});
  v(int_key{"loss_scale_max_skips", &c::loss_scale_max_skips, 1, 1 << 20,
            "Non-finite (overflowed) steps in a row that abort training, naming the steps."});
  // Communication.
  v(real_key{"comm_timeout", &c::comm_timeout, 0.0, 86400.0, true,
             "Seconds any communication wait may take before it fails on every rank."});
  v(enum_key<comm_fingerprint_kind>{
      "comm_fingerprint", &c::comm_fingerprint,
      "Collectives the ranks compare before data moves: always = every one (a mismatch is an "
      "error on every rank); sampled = the first 64, then every 256th (MPI: where MPI notices "
      "an unchecked mismatch the job ends with it, else results are wrong); off = none. The "
      "threads backend checks every call whatever this says."});
}

// The names of every key, in order.
inline constexpr std::size_t key_count = [] {
  std::size_t n = 0;
  visit_keys([&n](const auto&) { ++n; });
  return n;
}();

inline constexpr std::array<std::string_view, key_count> key_names = [] {
  std::array<std::string_view, key_count> out{};
  std::size_t i = 0;
  visit_keys([&](const auto& key) { out[i++] = key.name; });
  return out;
}();

// ---- values as text ----------------------------------------------------------------------------

namespace detail {

// Shortest text that reads back to the same double, always in TOML float form.
inline std::string format_real(double value) {
  if (std::isnan(value)) {
    return "nan";
  }
  if (std::isinf(value)) {
    return value > 0 ? "inf" : "-inf";
  }
  std::array<char, 64> buf{};
  const auto [end, ec] = std::to_chars(buf.data(), buf.data() + buf.size(), value);
  std::string out(buf.data(), ec == std::errc{} ? end : buf.data());
  if (out.find_first_of(".eE") == std::string::npos) {
    out += ".0";
  }
  return out;
}

inline std::string quote(std::string_view text) {
  std::string out = "\"";
  for (const char ch : text) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        out += ch;
    }
  }
  return out + "\"";
}

}  // namespace detail

// "1 .. 1048576", "(0, 1000]", "true | false", "threads | mpi | nccl", "any path"
template <class Key>
std::string allowed_text(const Key& key) {
  if constexpr (std::is_same_v<Key, int_key>) {
    return std::to_string(key.min) + " .. " +
           (key.max == int_max ? std::string("max") : std::to_string(key.max));
  } else if constexpr (std::is_same_v<Key, real_key>) {
    return std::string(key.min_exclusive ? "(" : "[") + detail::format_real(key.min) + ", " +
           (key.max == real_max ? std::string("inf)") : detail::format_real(key.max) + "]");
  } else if constexpr (std::is_same_v<Key, bool_key>) {
    return "true | false";
  } else if constexpr (std::is_same_v<Key, string_key>) {
    return "any string";
  } else {
    using enum_type = std::remove_cvref_t<decltype(std::declval<train_config>().*(key.member))>;
    return allowed_values<enum_type>();
  }
}

template <class Key>
constexpr std::string_view type_text(const Key&) {
  if constexpr (std::is_same_v<Key, int_key>) {
    return "integer";
  } else if constexpr (std::is_same_v<Key, real_key>) {
    return "float";
  } else if constexpr (std::is_same_v<Key, bool_key>) {
    return "boolean";
  } else if constexpr (std::is_same_v<Key, string_key>) {
    return "string";
  } else {
    return "string (one of)";
  }
}

// The value of `key` in `cfg`, as TOML.
template <class Key>
std::string value_text(const train_config& cfg, const Key& key) {
  const auto& value = cfg.*(key.member);
  if constexpr (std::is_same_v<Key, int_key>) {
    return std::to_string(value);
  } else if constexpr (std::is_same_v<Key, real_key>) {
    return detail::format_real(value);
  } else if constexpr (std::is_same_v<Key, bool_key>) {
    return value ? "true" : "false";
  } else if constexpr (std::is_same_v<Key, string_key>) {
    return detail::quote(value);
  } else {
    const std::string_view name = to_string(value);
    // resume = true / false read back as TOML booleans; "auto" and other names as strings.
    return name == "true" || name == "false" ? std::string(name) : detail::quote(name);
  }
}

// Checks that a value already stored is inside its key's range; throws config_error naming the key,
// the value and what is allowed.
template <class Key>
void check_range(const train_config& cfg, const Key& key, const config_location& where) {
  if constexpr (std::is_same_v<Key, int_key>) {
    const auto value = cfg.*(key.member);
    if (value < key.min || value > key.max) {
      throw config_error(where, "value " + std::to_string(value) +
                                    " is out of range; allowed: " + allowed_text(key));
    }
  } else if constexpr (std::is_same_v<Key, real_key>) {
    const auto value = cfg.*(key.member);
    const bool below = key.min_exclusive ? !(value > key.min) : !(value >= key.min);
    if (below || !(value <= key.max)) {
      throw config_error(where, "value " + detail::format_real(value) +
                                    " is out of range; allowed: " + allowed_text(key));
    }
  }
}

// Whether `name` may name a [policy] key: lower-case letters, digits and '_', from a letter.
constexpr bool valid_policy_key_name(std::string_view name) noexcept {
  if (name.empty() || name.size() > 64 || name.front() < 'a' || name.front() > 'z') {
    return false;
  }
  for (const char ch : name) {
    if (!((ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_')) {
      return false;
    }
  }
  return true;
}

// A [policy] value as TOML: numbers and booleans as they are, anything else a quoted string.
inline std::string policy_value_toml(std::string_view text) {
  if (text == "true" || text == "false") {
    return std::string(text);
  }
  std::int64_t i = 0;
  if (const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), i);
      ec == std::errc{} && end == text.data() + text.size() && std::to_string(i) == text) {
    return std::string(text);
  }
  double d = 0.0;
  if (const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), d);
      ec == std::errc{} && end == text.data() + text.size() && std::isfinite(d) &&
      detail::format_real(d) == text) {
    return std::string(text);
  }
  return detail::quote(text);
}

// The whole configuration as TOML that reads back to an equal train_config.
inline std::string print_toml(const train_config& cfg) {
  std::string out = "# strata training configuration\n";
  visit_keys([&](const auto& key) {
    std::string line = std::string(key.name) + " = " + value_text(cfg, key);
    if (line.size() < 44) {
      line.resize(44, ' ');
    } else {
      line += ' ';
    }
    out += line + "# " + std::string(key.doc) + "\n";
  });
  if (!cfg.policy.empty()) {
    out += "\n[policy]\n";
    for (const auto& [name, value] : cfg.policy) {
      out += name + " = " + policy_value_toml(value) + "\n";
    }
  }
  return out;
}

inline std::ostream& operator<<(std::ostream& os, const train_config& cfg) {
  return os << print_toml(cfg);
}

}  // namespace strata::config

// Fitting a run to the machine: the memory-saving choices a recipe can make, each planned exactly,
// against budgets for host memory, device memory and swap space, and the fastest one that fits.
//
// A row is the recipe with overrides for five settings: the layout of the world's ranks
// (distributed.tensor_parallel T x pipeline_parallel P x D data-parallel ranks, every layout the
// model splits into; CPU runs), distributed.zero_stage (0-3), offload (none; the optimizer state to
// nvme; at stage 3 the parameters too; on a GPU run also to cpu, ZeRO-Offload),
// activation_checkpointing.policy (none, selective, full) and the micro-batch (the recipe's and its
// halvings down to 1, the global batch kept by gradient accumulation). Each row is loaded through
// load_recipe with those overrides appended to the command line's, and planned by compile_step
// (every pipeline stage's plan): the numbers are what `engine plan` says of that recipe, and what
// `engine train` checks. A GPU run's rows also carry the device memory plan (trainer/device.h).
//
// The cost model ranks rows that fit (docs/offload.md, "Fitting a run to the machine"):
//   seconds per step = FLOPs per step of the busiest rank (recompute included) / flops_per_second
//                      x (M + P - 1) / M with P pipeline stages over M micro-batches (the bubble)
//                    + bytes the busiest rank sends per step / interconnect_bytes_per_second
//                    + swap bytes read and written per step / swap_bytes_per_second
//   and on a GPU run that is staged through the host (trainer/device.h device_resident):
//                    + bytes between host and device per step / link_bytes_per_second
//                    + the host's update, optimizer bytes read and written / host_update_bytes_per_second
// Ties go to the row with fewer changes from the recipe, then the one with less host memory.
//
//   std::vector<FitRow> rows = fit_rows(path, options, loaded, {});
//   const FitRow* best = fastest_fit(rows, budgets);
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "core/memory_limit.h"
#include "recipe/load.h"
#include "trainer/session.h"

namespace engine {

// What `engine train` needs in host memory: `ranks` ranks of this plan, each with its checkpoint
// snapshot (check_memory_available refuses a run when this exceeds the memory limit); `streamed`:
// the same run with checkpoint.async false, whose checkpoints hold no snapshot.
int64_t host_bytes_needed(const MemoryPlan& memory, int ranks, bool streamed = false);

struct FitBudgets {
  int64_t host = kUnlimitedBytes;  // for all the ranks on this machine
  std::string host_source;         // "--host-memory", "ulimit -v (RLIMIT_AS)", ...
  int64_t nvme = kUnlimitedBytes;  // free space for the swap files of all the ranks
  std::string nvme_source;
  int64_t device = kUnlimitedBytes;  // per GPU (rows of a GPU run)
  std::string device_source;
};

struct CostModel {
  double flops_per_second = 50e9;               // a few cores of a CPU, fp32
  double swap_bytes_per_second = 1e9;           // one NVMe drive through direct I/O, reads and writes together
  double link_bytes_per_second = 25e9;          // host <-> GPU copies through page-locked memory (PCIe)
  double host_update_bytes_per_second = 20e9;   // the host's reductions and optimizer, memory-bound
  double interconnect_bytes_per_second = 10e9;  // collectives between the ranks (one machine's shared memory)
  // A GPU's default rate: an H100-class card's achieved matmul rate in the compute type.
  static double device_flops_per_second(DType compute) { return compute == DType::f32 ? 40e12 : 400e12; }
  static constexpr double device_interconnect_bytes_per_second = 200e9;  // NCCL between the GPUs of a machine
};

struct FitRow {
  int tensor = 1, pipeline = 1, data = 1;  // the layout: T x P x D ranks
  int stage = 0;
  OffloadTier optimizer = OffloadTier::none, parameters = OffloadTier::none;
  recipe::CheckpointPolicy policy = recipe::CheckpointPolicy::none;
  int64_t micro = 1, accumulation = 1;
  // The overrides that make the recipe this row (only keys whose value changes).
  std::vector<std::string> overrides;
  bool is_recipe = false;  // the recipe as given

  int64_t host = 0;                  // MemoryPlan::total() per rank
  int64_t host_needed = 0;           // host_bytes_needed for the world's ranks (checkpoint snapshot included)
  int64_t host_needed_streamed = 0;  // the same with checkpoint.async false (no snapshot held)
  int64_t swap = 0;                  // per rank
  int64_t swap_needed = 0;           // all ranks
  int64_t swap_moved = 0;            // bytes read and written per step, per rank
  int64_t device = 0;                // a GPU run's device memory per rank (plan_device_memory), else 0
  int64_t device_needed = 0;         // per GPU: device x the ranks that share one (local ranks over GPUs)
  int64_t link_moved = 0;            // a staged GPU run's bytes between host and device per step and rank
  int64_t sent = 0;                  // bytes the busiest rank sends per step (gradients, parameters, activations)
  double flops = 0;                  // per step, of the busiest rank, recompute included
  double extra_flops = 0;            // of which recompute
  double seconds = 0;                // the cost model's step time

  bool fits_host(const FitBudgets& b) const { return host_needed <= b.host; }
  bool fits_nvme(const FitBudgets& b) const { return swap_needed <= b.nvme; }
  bool fits_device(const FitBudgets& b) const { return device_needed <= b.device; }
  bool fits(const FitBudgets& b) const { return fits_host(b) && fits_nvme(b) && fits_device(b); }
  // Over the host budget with its snapshot, and needing less without: a proposal of the row adds
  // checkpoint.async=false, whose checkpoints are written straight from the state
  // (docs/checkpoints.md); fits_when_streamed: the row fits as it would be proposed.
  bool proposes_streamed_checkpoints(const FitBudgets& b) const {
    return !fits_host(b) && host_needed_streamed < host_needed;
  }
  int64_t host_proposed(const FitBudgets& b) const {  // host_needed as the row would be proposed
    return proposes_streamed_checkpoints(b) ? host_needed_streamed : host_needed;
  }
  bool fits_when_streamed(const FitBudgets& b) const {
    return host_proposed(b) <= b.host && fits_nvme(b) && fits_device(b);
  }
  // How far over the budgets the row is: the larger of need / budget (<= 1: it fits).
  double overshoot(const FitBudgets& b) const;
  std::string offload_name() const;  // "none", "optimizer nvme", "optimizer+parameters cpu", ...
  std::string layout_name() const;   // "2 x 1 x 4"
};

struct FitSearch {
  std::vector<FitRow> rows;
  std::filesystem::path nvme_path;  // where the nvme rows put their swap files
  bool nvme_path_given = false;     // the recipe's offload.nvme_path (else the temporary directory)
  std::vector<std::string> notes;   // rows that could not be planned, and why
  bool device = false;              // rows of a GPU run (run.device cuda, or auto with a GPU here)
  int world = 1;                    // the ranks the recipe trains on (one machine)
  int ranks_per_device = 1;         // the world's ranks over this machine's GPUs (one when it has none)
  bool layouts = false;             // rows of more than one T x P x D layout
};

// Every (T, P) whose T x P divides `ranks` and that the recipe's model splits into: T dividing its
// heads, key/value heads, MLP width and vocabulary, and a block per stage at least.
std::vector<std::pair<int, int>> model_layouts(const recipe::Recipe& r, int ranks);

// Every row for `recipe` loaded with `options` (`loaded` is that recipe, already loaded), costed
// with `cost` (its flops_per_second the rate of the device the rows run on).
FitSearch fit_rows(const std::filesystem::path& recipe, const recipe::LoadOptions& options,
                   const recipe::LoadedRecipe& loaded, const CostModel& cost);

// The row with the least predicted time that fits both budgets; nullptr when none does.
// The recipe's spelling of an activation checkpointing policy (full, every_k, selective, none).
const char* policy_name(recipe::CheckpointPolicy p);

const FitRow* fastest_fit(const std::vector<FitRow>& rows, const FitBudgets& budgets);
// The row that misses the budgets by the least (smallest overshoot).
const FitRow* closest_fit(const std::vector<FitRow>& rows, const FitBudgets& budgets);

}  // namespace engine

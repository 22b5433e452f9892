#include "trainer/offload_report.h"

#include <string>

#include "trainer/progress_line.h"

namespace engine {

namespace {

std::string tier_name(OffloadTier t) {
  return std::string(offload_tier_name(t)) + (t == OffloadTier::cpu ? " (host memory)" : "");
}

}  // namespace

void describe_offload(std::ostream& out, const Session& session, const TrafficPlan& traffic) {
  const OffloadSpec& o = session.offload;
  out << "offload: optimizer state" << (session.store.masters_offloaded() ? " and fp32 masters" : "") << " -> "
      << tier_name(o.optimizer);
  if (session.store.sharding().stage == 3) out << "; parameter shard -> " << tier_name(o.parameters);
  out << "\n";
  for (const SwapFile* f : session.offloaded->swap_files())
    out << "  swap file " << f->path().string() << ": " << format_bytes(f->bytes())
        << (f->direct() ? ", direct I/O" : ", through the page cache (no O_DIRECT here)") << "\n";
  if (traffic.swap_read || traffic.swap_written)
    out << "  each step reads " << format_bytes(traffic.swap_read) << " and writes "
        << format_bytes(traffic.swap_written) << " of swap (queue depth " << o.queue_depth << ", "
        << format_bytes(o.block_size) << " requests, chunks of " << o.chunk_size << " parameters)\n";
  if (o.optimizer == OffloadTier::nvme && session.recipe.checkpoint.async)
    out << "  checkpoints stream the offloaded state from its swap file and are written synchronously (an "
           "asynchronous write would need a snapshot of it in memory)\n";
}

SwapWindow::SwapWindow(const OffloadedState* state, int64_t step) : step_(step) {
  if (!state) return;
  read_ = state->bytes_read();
  written_ = state->bytes_written();
  wait_ = state->wait_seconds();
  chunks_ = state->chunks_updated();
  fetched_ = state->parameter_bytes_fetched();
}

void SwapWindow::log(const OffloadedState& state, int64_t step, nlohmann::json& line) {
  const auto steps = double(std::max<int64_t>(1, step - step_));
  line["swap_read_per_step"] = double(state.bytes_read() - read_) / steps;
  line["swap_written_per_step"] = double(state.bytes_written() - written_) / steps;
  line["swap_wait_s_per_step"] = (state.wait_seconds() - wait_) / steps;
  line["offload_chunks_per_step"] = double(state.chunks_updated() - chunks_) / steps;
  if (state.params())
    line["offload_parameter_bytes_per_step"] = double(state.parameter_bytes_fetched() - fetched_) / steps;
  *this = SwapWindow(&state, step);
}

}  // namespace engine

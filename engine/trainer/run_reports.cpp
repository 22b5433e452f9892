#include "trainer/run_reports.h"

#include "trainer/device.h"
#include "trainer/offload_report.h"
#include "trainer/progress_line.h"

namespace engine {

void report_start(std::ostream& out, const Session& session, const Communicator& comm, const TrafficPlan& traffic) {
  out << "device: " << describe_device(session.device) << "\n";
  if (!session.device_note.empty()) out << session.device_note << "\n";
  out << "model: " << session.model.graph.param_count() << " parameters in " << session.model.graph.units().size()
      << " wrap units; data: " << session.data->describe() << "\n";
  if (auto floor = session.data->loss_floor()) out << "loss floor (exact entropy of the data): " << *floor << " nats\n";
  const MemoryPlan memory = session.memory();
  if (comm.size() > 1)
    out << "ranks: " << comm.size() << " (" << comm.backend() << "), ZeRO stage "
        << session.recipe.distributed.zero_stage << "; each rank sends " << format_bytes(traffic.total())
        << " per step\n";
  out << "memory plan" << (comm.size() > 1 ? " per rank: " : ": ") << format_bytes(memory.total())
      << (memory.on_device ? " of host memory" : "") << " (activations " << format_bytes(memory.activations)
      << (memory.on_device ? " on the GPU" : "") << "; + " << format_bytes(memory.checkpoint_snapshot)
      << " while a checkpoint is written)\n";
  if (session.offloaded) describe_offload(out, session, traffic);
}

void report_device(std::ostream& out, const Session& session, int64_t trained, double train_seconds) {
  if (session.device.kind != Device::Kind::cuda) return;
  const DeviceMemory memory = session.executor.device_memory();
  out << "device memory peak " << format_bytes(memory.device_peak) << " (the allocator's high-water mark; "
      << "planned " << format_bytes(session.memory().activations + session.memory().scratch) << " of activations "
      << "and casts + the parameters and gradients; cudaMemGetInfo: " << format_bytes(memory.device_used) << " of "
      << format_bytes(memory.device_total) << " in use)\n";
  const DeviceTimes times = session.executor.device_times();
  if (times.runs == 0 || trained <= 0) return;
  out << "host time per step on " << describe_device(session.device) << ": "
      << format_fixed(1e3 * times.enqueue_seconds / double(trained), 1) << " ms enqueuing kernels, "
      << format_fixed(1e3 * times.wait_seconds / double(trained), 1) << " ms waiting for them, "
      << format_fixed(1e3 * session.device_update_seconds / double(trained), 1)
      << " ms in the update (norm, clipping, optimizer), of " << format_fixed(1e3 * train_seconds / double(trained), 1)
      << " ms; inputs copied ahead of " << times.staged_ahead << " of " << times.runs << " runs";
  if (times.parameter_uploads > 0) out << "; parameters uploaded by " << times.parameter_uploads;
  out << "\n";
}

}  // namespace engine

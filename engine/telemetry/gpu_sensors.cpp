// GpuSensors (telemetry/gpu_sensors.h): NVML's C entry points looked up by name. The few types they
// take are declared here as nvml.h declares them (NVML's ABI is stable across drivers; the toolkit
// ships no nvml.h everywhere, and the driver's library is all a run needs).
#include "telemetry/gpu_sensors.h"

#include <dlfcn.h>

namespace engine {

namespace nvml {
using Return = int;  // nvmlReturn_t: 0 is NVML_SUCCESS
using Device = struct Opaque*;
struct Utilization {
  unsigned int gpu, memory;
};
struct Memory {
  unsigned long long total, free, used;
};
constexpr int kTemperatureGpu = 0;  // NVML_TEMPERATURE_GPU
}  // namespace nvml

struct GpuSensors::Library {
  void* handle = nullptr;
  nvml::Device device = nullptr;
  nvml::Return (*shutdown)() = nullptr;
  nvml::Return (*utilization)(nvml::Device, nvml::Utilization*) = nullptr;
  nvml::Return (*memory)(nvml::Device, nvml::Memory*) = nullptr;
  nvml::Return (*temperature)(nvml::Device, int, unsigned int*) = nullptr;
  nvml::Return (*power)(nvml::Device, unsigned int*) = nullptr;  // milliwatts
  ~Library() {
    if (shutdown) shutdown();
    if (handle) dlclose(handle);
  }
};

namespace {
template <class F>
bool find(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(handle, name));
  return out != nullptr;
}
}  // namespace

std::unique_ptr<GpuSensors> GpuSensors::open(const std::string& pci_bus_id, std::string* why_not,
                                             const std::string& library) {
  auto fail = [&](const std::string& why) -> std::unique_ptr<GpuSensors> {
    if (why_not) *why_not = why;
    return nullptr;
  };
  if (pci_bus_id.empty()) return fail("no CUDA device to read");
  auto lib = std::make_unique<Library>();
  lib->handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib->handle) return fail(library + " is not installed (it comes with the NVIDIA driver)");
  nvml::Return (*init)() = nullptr;
  nvml::Return (*by_bus_id)(const char*, nvml::Device*) = nullptr;
  if (!find(lib->handle, "nvmlInit_v2", init) || !find(lib->handle, "nvmlDeviceGetHandleByPciBusId_v2", by_bus_id) ||
      !find(lib->handle, "nvmlShutdown", lib->shutdown) ||
      !find(lib->handle, "nvmlDeviceGetUtilizationRates", lib->utilization) ||
      !find(lib->handle, "nvmlDeviceGetMemoryInfo", lib->memory) ||
      !find(lib->handle, "nvmlDeviceGetTemperature", lib->temperature) ||
      !find(lib->handle, "nvmlDeviceGetPowerUsage", lib->power)) {
    lib->shutdown = nullptr;
    return fail(library + " lacks an NVML entry point the engine reads");
  }
  if (const nvml::Return status = init(); status != 0) {
    lib->shutdown = nullptr;
    return fail("nvmlInit failed (NVML error " + std::to_string(status) + ")");
  }
  if (const nvml::Return status = by_bus_id(pci_bus_id.c_str(), &lib->device); status != 0)
    return fail("NVML has no device at PCI " + pci_bus_id + " (NVML error " + std::to_string(status) + ")");
  return std::unique_ptr<GpuSensors>(new GpuSensors(std::move(lib)));
}

GpuSensors::GpuSensors(std::unique_ptr<Library> library) : library_(std::move(library)) {}
GpuSensors::~GpuSensors() = default;

GpuReading GpuSensors::read() const {
  GpuReading r;
  nvml::Utilization utilization{};
  if (library_->utilization(library_->device, &utilization) == 0) r.utilization_percent = utilization.gpu;
  nvml::Memory memory{};
  if (library_->memory(library_->device, &memory) == 0) {
    r.memory_used_bytes = int64_t(memory.used);
    r.memory_total_bytes = int64_t(memory.total);
  }
  unsigned int celsius = 0, milliwatts = 0;
  if (library_->temperature(library_->device, nvml::kTemperatureGpu, &celsius) == 0) r.temperature_c = celsius;
  if (library_->power(library_->device, &milliwatts) == 0) r.power_w = milliwatts / 1000.0;
  return r;
}

}  // namespace engine

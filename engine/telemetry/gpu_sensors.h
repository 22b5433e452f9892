// GpuSensors: what a GPU's own sensors say while it trains (utilisation, memory in use, temperature,
// power), read through NVML, the driver's management library. The library is opened at run time
// (dlopen of libnvidia-ml.so.1, which the NVIDIA driver installs), never linked: the same binary
// starts on machines without a driver, where open() says why there are no readings.
//
//   std::string why_not;
//   auto sensors = GpuSensors::open(cuda_device_pci_bus_id(0), &why_not);   // null: see why_not
//   GpuReading now = sensors->read();   // -1 where a sensor gave nothing
//
// The device is named by its PCI bus id (CUDA's and NVML's device orders may differ).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace engine {

struct GpuReading {
  double utilization_percent = -1;  // the share of the last sample period a kernel ran
  int64_t memory_used_bytes = -1;   // by every process on the device
  int64_t memory_total_bytes = -1;
  double temperature_c = -1;
  double power_w = -1;
};

class GpuSensors {
 public:
  // `library`: the NVML library to open (tests name one that does not exist).
  static std::unique_ptr<GpuSensors> open(const std::string& pci_bus_id, std::string* why_not,
                                          const std::string& library = "libnvidia-ml.so.1");
  ~GpuSensors();
  GpuSensors(const GpuSensors&) = delete;
  GpuSensors& operator=(const GpuSensors&) = delete;

  GpuReading read() const;

 private:
  struct Library;
  explicit GpuSensors(std::unique_ptr<Library> library);
  std::unique_ptr<Library> library_;
};

}  // namespace engine

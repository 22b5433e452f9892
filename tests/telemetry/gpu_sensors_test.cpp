// The GPU's sensors (telemetry/gpu_sensors.h) through a stand-in NVML library with fixed readings
// (fake_nvml.cpp): every reading arrives with its unit converted, in the monitor's samples too;
// a device NVML does not know and a machine without the library each give a reason, not a crash.
#include "telemetry/gpu_sensors.h"

#include <gtest/gtest.h>

#include "telemetry/hardware_monitor.h"

namespace engine {
namespace {

TEST(GpuSensors, ReadEveryReadingThroughNvml) {
  std::string why_not;
  const auto sensors = GpuSensors::open("0000:19:00.0", &why_not, FAKE_NVML_LIBRARY);
  ASSERT_TRUE(sensors) << why_not;
  const GpuReading r = sensors->read();
  EXPECT_EQ(r.utilization_percent, 87);
  EXPECT_EQ(r.memory_used_bytes, 20000000000);
  EXPECT_EQ(r.memory_total_bytes, 150000000000);
  EXPECT_EQ(r.temperature_c, 54);
  EXPECT_EQ(r.power_w, 412.5);
}

TEST(GpuSensors, TheMonitorSamplesThem) {
  HardwareMonitor monitor(60.0, "", GpuSensors::open("0000:19:00.0", nullptr, FAKE_NVML_LIBRARY));
  const HardwareSample sample = monitor.latest();  // the constructor's baseline sample
  EXPECT_EQ(sample.gpu.utilization_percent, 87);
  EXPECT_EQ(sample.gpu.power_w, 412.5);
  HardwareMonitor without(60.0);
  EXPECT_EQ(without.latest().gpu.utilization_percent, -1);
}

TEST(GpuSensors, SayWhyThereAreNone) {
  std::string why_not;
  EXPECT_FALSE(GpuSensors::open("0000:3b:00.0", &why_not, FAKE_NVML_LIBRARY));
  EXPECT_NE(why_not.find("no device at PCI 0000:3b:00.0"), std::string::npos) << why_not;
  EXPECT_FALSE(GpuSensors::open("0000:19:00.0", &why_not, "libnvidia-ml-absent.so.1"));
  EXPECT_NE(why_not.find("libnvidia-ml-absent.so.1 is not installed"), std::string::npos) << why_not;
  EXPECT_FALSE(GpuSensors::open("", &why_not, FAKE_NVML_LIBRARY));
  EXPECT_EQ(why_not, "no CUDA device to read");
}

}  // namespace
}  // namespace engine

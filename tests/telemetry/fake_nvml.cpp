// A stand-in for the NVIDIA driver's NVML library with fixed readings, for the GPU sensors' test
// (gpu_sensors_test.cpp): the entry points GpuSensors looks up, one device at PCI 0000:19:00.0.
#include <cstring>

extern "C" {
int nvmlInit_v2() { return 0; }
int nvmlShutdown() { return 0; }
int nvmlDeviceGetHandleByPciBusId_v2(const char* bus_id, void** device) {
  if (std::strcmp(bus_id, "0000:19:00.0") != 0) return 6;  // NVML_ERROR_NOT_FOUND
  *device = reinterpret_cast<void*>(0x19);
  return 0;
}
int nvmlDeviceGetUtilizationRates(void*, unsigned int* rates) {
  rates[0] = 87;  // gpu
  rates[1] = 41;  // memory
  return 0;
}
int nvmlDeviceGetMemoryInfo(void*, unsigned long long* memory) {
  memory[0] = 150000000000ull;  // total
  memory[1] = 130000000000ull;  // free
  memory[2] = 20000000000ull;   // used
  return 0;
}
int nvmlDeviceGetTemperature(void*, int sensor, unsigned int* celsius) {
  if (sensor != 0) return 2;  // NVML_ERROR_INVALID_ARGUMENT
  *celsius = 54;
  return 0;
}
int nvmlDeviceGetPowerUsage(void*, unsigned int* milliwatts) {
  *milliwatts = 412500;
  return 0;
}
}

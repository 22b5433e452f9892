#include "telemetry/tensorboard_writer.h"

#include <unistd.h>

#include <spdlog/spdlog.h>
#include <algorithm>
#include <boost/crc.hpp>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "core/error.h"
#include "core/whole_file.h"
#include "telemetry/tensorboard.pb.h"

namespace engine {

namespace tfrecord {

namespace {

// Castagnoli polynomial, reflected in and out, initial and final XOR all ones: CRC-32C.
using Crc32c = boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true>;

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>((value >> (8 * i)) & 0xff));
}

uint64_t read_le(std::string_view bytes) {
  uint64_t value = 0;
  for (size_t i = 0; i < bytes.size(); ++i) value |= uint64_t{static_cast<unsigned char>(bytes[i])} << (8 * i);
  return value;
}

}  // namespace

uint32_t crc32c(std::string_view bytes) {
  Crc32c crc;
  crc.process_bytes(bytes.data(), bytes.size());
  return crc.checksum();
}

uint32_t masked_crc32c(std::string_view bytes) {
  const uint32_t crc = crc32c(bytes);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;  // unsigned: wraps modulo 2^32
}

std::string frame(std::string_view data) {
  std::string record;
  record.reserve(data.size() + 16);
  append_le(record, data.size(), 8);
  append_le(record, masked_crc32c(record), 4);
  record.append(data);
  append_le(record, masked_crc32c(data), 4);
  return record;
}

std::vector<std::string> read_records(const std::filesystem::path& path) {
  const std::optional<std::string> bytes_read = read_whole_file(path);
  if (!bytes_read) throw UserError("cannot read event file " + path.string());
  const std::string& bytes = *bytes_read;
  const std::string_view all(bytes);
  std::vector<std::string> records;
  size_t offset = 0;
  while (offset < all.size()) {
    const auto bad = [&](const std::string& why) {
      return UserError(path.string() + ": record " + std::to_string(records.size()) + " at byte " +
                       std::to_string(offset) + ": " + why);
    };
    if (all.size() - offset < 12) throw bad("truncated header");
    const std::string_view header = all.substr(offset, 8);
    if (read_le(all.substr(offset + 8, 4)) != masked_crc32c(header)) throw bad("length CRC mismatch");
    const uint64_t length = read_le(header);
    if (length > all.size() - offset - 12 || all.size() - offset - 12 - length < 4) throw bad("truncated data");
    const std::string_view data = all.substr(offset + 12, length);
    if (read_le(all.substr(offset + 12 + length, 4)) != masked_crc32c(data)) throw bad("data CRC mismatch");
    records.emplace_back(data);
    offset += 16 + length;
  }
  return records;
}

}  // namespace tfrecord

namespace {

std::string hostname() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0) return "localhost";
  return name;
}

tensorboard::Event event_at(int64_t step, double wall_time) {
  tensorboard::Event event;
  event.set_wall_time(wall_time);
  event.set_step(step);
  return event;
}

}  // namespace

double TensorBoardWriter::now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TensorBoardWriter::TensorBoardWriter(const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw UserError("cannot create the TensorBoard directory " + dir.string() + ": " + error.message());
  const auto seconds =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
  path_ = dir / ("events.out.tfevents." + std::to_string(seconds) + "." + hostname() + "." +
                 std::to_string(::getpid()) + ".engine");
  file_ = std::fopen(path_.c_str(), "wb");
  if (file_ == nullptr) fail("cannot create");
  tensorboard::Event version = event_at(0, now());
  version.set_file_version("brain.Event:2");
  try {
    write_event(version);
  } catch (...) {
    std::fclose(file_);  // the destructor does not run for a constructor that throws
    throw;
  }
}

TensorBoardWriter::~TensorBoardWriter() {
  if (file_ == nullptr) return;
  // A destructor cannot throw, and losing the tail of a metrics file must not end a run that is
  // already unwinding: say so instead.
  if (std::fflush(file_) != 0)
    spdlog::warn("TensorBoard event file {}: cannot write: {}", path_.string(), std::strerror(errno));
  std::fclose(file_);
}

void TensorBoardWriter::fail(const std::string& what) const {
  throw UserError(what + " TensorBoard event file " + path_.string() + ": " + std::strerror(errno));
}

void TensorBoardWriter::write_event(const tensorboard::Event& event) {
  std::string data;
  if (!event.SerializeToString(&data)) throw InternalError("cannot serialize a TensorBoard event");
  const std::string record = tfrecord::frame(data);
  if (std::fwrite(record.data(), 1, record.size(), file_) != record.size()) fail("cannot write");
}

void TensorBoardWriter::flush() {
  if (std::fflush(file_) != 0) fail("cannot write");
}

void TensorBoardWriter::scalar(const std::string& tag, double value, int64_t step, double wall_time) {
  tensorboard::Event event = event_at(step, wall_time);
  tensorboard::Summary::Value* entry = event.mutable_summary()->add_value();
  entry->set_tag(tag);
  entry->set_simple_value(static_cast<float>(value));
  write_event(event);
}

void TensorBoardWriter::text(const std::string& tag, const std::string& markdown, int64_t step, double wall_time) {
  tensorboard::Event event = event_at(step, wall_time);
  tensorboard::Summary::Value* entry = event.mutable_summary()->add_value();
  entry->set_tag(tag);
  // The text plugin's content is a TextPluginData of version 0, which serializes to no bytes.
  entry->mutable_metadata()->mutable_plugin_data()->set_plugin_name("text");
  tensorboard::TensorProto* tensor = entry->mutable_tensor();
  tensor->set_dtype(tensorboard::DT_STRING);
  tensor->mutable_tensor_shape();  // present and without dims: shape []
  tensor->add_string_val(markdown);
  write_event(event);
}

void TensorBoardWriter::histogram(const std::string& tag, std::span<const double> values, int64_t step,
                                  double wall_time) {
  std::vector<double> finite;
  finite.reserve(values.size());
  std::copy_if(values.begin(), values.end(), std::back_inserter(finite), [](double v) { return std::isfinite(v); });

  tensorboard::Event event = event_at(step, wall_time);
  tensorboard::Summary::Value* entry = event.mutable_summary()->add_value();
  entry->set_tag(tag);
  tensorboard::HistogramProto* histo = entry->mutable_histo();
  if (!finite.empty()) {
    const auto [lo, hi] = std::minmax_element(finite.begin(), finite.end());
    const double min = *lo, max = *hi;
    double sum = 0, sum_squares = 0;
    for (double v : finite) {
      sum += v;
      sum_squares += v * v;
    }
    histo->set_min(min);
    histo->set_max(max);
    histo->set_num(static_cast<double>(finite.size()));
    histo->set_sum(sum);
    histo->set_sum_squares(sum_squares);

    // Limits first, then each value into the bucket whose range [previous limit, limit) holds it,
    // so the counts agree with the limits a reader sees. Halves keep max - min finite for any
    // pair of doubles. The last limit is max itself, and max counts in the last bucket.
    std::vector<double> limits;
    if (min == max) {
      limits.push_back(max);
    } else {
      const double width = (max / 2 - min / 2) / kHistogramBuckets * 2;
      for (int i = 1; i < kHistogramBuckets; ++i) limits.push_back(min + width * i);
      limits.push_back(max);
    }
    std::vector<double> counts(limits.size(), 0.0);
    for (double v : finite) {
      const size_t index = std::upper_bound(limits.begin(), limits.end(), v) - limits.begin();
      counts[std::min(index, limits.size() - 1)] += 1;
    }
    for (size_t i = 0; i < limits.size(); ++i) {
      histo->add_bucket_limit(limits[i]);
      histo->add_bucket(counts[i]);
    }
  }
  write_event(event);
}

}  // namespace engine

// TensorBoardWriter: a run's metrics as a TensorBoard event file, which `tensorboard --logdir`
// and TensorBoard's Python readers open with no TensorFlow installed.
//
// An event file is a sequence of TFRecords, each one serialized tensorboard.Event
// (engine/telemetry/tensorboard.proto, TensorBoard's own field numbers). The first record names
// the format ("brain.Event:2"); every later one holds one summary value at a step:
//   - scalar:    Summary.Value.simple_value, a float32 (the double is rounded to nearest; TensorBoard
//                stores and draws float32, so the rounding happens here once, where it is visible);
//   - text:      a DT_STRING scalar tensor for the "text" plugin, rendered as Markdown;
//   - histogram: a HistogramProto with 30 equal-width buckets between the values' min and max
//                (TensorBoard's own summary.histogram default), so every bucket a reader draws
//                holds data rather than the ~1500 exponential buckets of TensorFlow's C++ writer.
//
// A TFRecord is: uint64 length (little-endian), uint32 masked CRC32C of those 8 bytes, the data,
// uint32 masked CRC32C of the data. The mask, ((crc >> 15) | (crc << 17)) + 0xa282ead8, keeps a
// CRC of bytes that themselves contain CRCs from being trivially zero.
//
//   TensorBoardWriter tb(run_dir / "tensorboard");
//   tb.scalar("train/loss", loss, step);
//   if (step % log_every == 0) tb.flush();
//
// Writes go through a stdio buffer: flush() at log steps makes every record written so far
// readable by TensorBoard (fflush, no fsync: a crash of the machine may lose the tail, which the
// reader drops as a truncated record). The destructor flushes. A failure to create the directory
// or to write (a full disk) throws UserError naming the file. Not thread-safe: one thread writes.
#pragma once

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tensorboard {
class Event;
}

namespace engine {

class TensorBoardWriter {
 public:
  // Creates `dir` (and its parents) and <dir>/events.out.tfevents.<unix seconds>.<hostname>.<pid>.engine,
  // whose first record is the file_version event "brain.Event:2".
  explicit TensorBoardWriter(const std::filesystem::path& dir);
  ~TensorBoardWriter();
  TensorBoardWriter(const TensorBoardWriter&) = delete;
  TensorBoardWriter& operator=(const TensorBoardWriter&) = delete;

  // Seconds since the Unix epoch, as TensorBoard's wall_time.
  static double now();

  // `value` is written as float32 (simple_value): 1e20 stays finite, beyond ~3.4e38 it becomes inf.
  void scalar(const std::string& tag, double value, int64_t step, double wall_time = now());
  // `markdown` as the text plugin's DT_STRING tensor of shape [].
  void text(const std::string& tag, const std::string& markdown, int64_t step, double wall_time = now());
  // min, max, num, sum, sum_squares of the finite values and kHistogramBuckets equal-width buckets;
  // NaN and infinities are left out (they have no bucket; the scalar of a loss shows them).
  // Empty input writes num 0 and no buckets; equal values, one bucket ending at that value.
  void histogram(const std::string& tag, std::span<const double> values, int64_t step, double wall_time = now());

  // Hands the buffered records to the operating system, so a reader sees them.
  void flush();
  const std::filesystem::path& path() const { return path_; }

  static constexpr int kHistogramBuckets = 30;

 private:
  void write_event(const tensorboard::Event& event);
  [[noreturn]] void fail(const std::string& what) const;

  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

// The TFRecord framing, exposed for tests and for tools that check an event file.
namespace tfrecord {

// CRC-32C (Castagnoli), as RFC 3720 and TFRecord define it.
uint32_t crc32c(std::string_view bytes);
// ((crc >> 15) | (crc << 17)) + 0xa282ead8, modulo 2^32.
uint32_t masked_crc32c(std::string_view bytes);
// length, masked CRC of the length, data, masked CRC of the data.
std::string frame(std::string_view data);
// Every record's data in `path`, checking both CRCs of each; a mismatch or a truncated record is
// a UserError naming the file, the record's index and its byte offset.
std::vector<std::string> read_records(const std::filesystem::path& path);

}  // namespace tfrecord

}  // namespace engine

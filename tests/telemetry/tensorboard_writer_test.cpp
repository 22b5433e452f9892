// TensorBoardWriter against TensorBoard's own reader: every scalar (as float32), the text and the
// histogram come back as written; a corrupted byte is noticed by TensorBoard's reader and by
// tfrecord::read_records; the CRC32C and the record framing match known vectors; directory and
// write failures are UserErrors naming the file.
#include "telemetry/tensorboard_writer.h"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <boost/crc.hpp>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "core/error.h"
#include "read_events.h"
#include "temp_dir.h"

namespace {

using engine::TensorBoardWriter;
using engine::testing::read_with_tensorboard;
using engine::testing::TempDir;
namespace tfrecord = engine::tfrecord;
using json = nlohmann::json;

std::string read_file(const std::filesystem::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::filesystem::path& file, const std::string& bytes) {
  std::ofstream(file, std::ios::binary | std::ios::trunc) << bytes;
}

// The test's own CRC32C and mask, from Boost's generic CRC and the TFRecord definition.
uint32_t boost_masked_crc(const std::string& bytes) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(bytes.data(), bytes.size());
  const uint32_t c = crc.checksum();
  return static_cast<uint32_t>(((c >> 15) | (c << 17)) + 0xa282ead8ull);
}

std::string le(uint64_t value, int bytes) {
  std::string out;
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i)));
  return out;
}

TEST(Crc32c, MatchesRfc3720Vectors) {
  EXPECT_EQ(tfrecord::crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(tfrecord::crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending.push_back(static_cast<char>(i));
  EXPECT_EQ(tfrecord::crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(tfrecord::crc32c("123456789"), 0xE3069283u);
}

TEST(Crc32c, MaskedValuesMatchTensorBoards) {
  // From tensorboard.compat.tensorflow_stub.pywrap_tensorflow.masked_crc32c.
  EXPECT_EQ(tfrecord::masked_crc32c(std::string(32, '\0')), 0x0FD7FFFAu);
  EXPECT_EQ(tfrecord::masked_crc32c("123456789"), 0xC78AB0E5u);
  EXPECT_EQ(tfrecord::masked_crc32c("abc"), 0x21F1576Eu);
  EXPECT_EQ(tfrecord::masked_crc32c(le(3, 8)), 0x0E4999B0u);
}

TEST(RecordFraming, LengthCrcDataCrc) {
  EXPECT_EQ(tfrecord::frame("abc"), le(3, 8) + le(0x0E4999B0u, 4) + "abc" + le(0x21F1576Eu, 4));
  EXPECT_EQ(tfrecord::frame(""), le(0, 8) + le(boost_masked_crc(le(0, 8)), 4) + le(boost_masked_crc(""), 4));
  std::string payload;
  for (int i = 0; i < 70000; ++i) payload.push_back(static_cast<char>((i * 131) ^ (i >> 8)));
  const std::string length = le(payload.size(), 8);
  EXPECT_EQ(tfrecord::frame(payload),
            length + le(boost_masked_crc(length), 4) + payload + le(boost_masked_crc(payload), 4));
}

TEST(RecordFraming, ReadRecordsRoundTripsAndChecksBothCrcs) {
  TempDir dir("tfrecord");
  const std::vector<std::string> records = {"first", "", std::string(1000, 'x')};
  std::string bytes;
  for (const auto& r : records) bytes += tfrecord::frame(r);
  write_file(dir / "ok", bytes);
  EXPECT_EQ(tfrecord::read_records(dir / "ok"), records);

  const size_t third = 2 * 16 + 5;  // records 0 and 1 take 16 + their length each
  std::string data_flip = bytes;
  data_flip[third + 12 + 500] ^= 0x01;
  write_file(dir / "data", data_flip);
  EXPECT_THROW(
      try { tfrecord::read_records(dir / "data"); } catch (const engine::UserError& e) {
        EXPECT_NE(std::string(e.what()).find("record 2 at byte 37: data CRC mismatch"), std::string::npos) << e.what();
        throw;
      },
      engine::UserError);

  std::string length_flip = bytes;
  length_flip[third + 1] ^= 0x01;
  write_file(dir / "length", length_flip);
  EXPECT_THROW(
      try { tfrecord::read_records(dir / "length"); } catch (const engine::UserError& e) {
        EXPECT_NE(std::string(e.what()).find("record 2 at byte 37: length CRC mismatch"), std::string::npos)
            << e.what();
        throw;
      },
      engine::UserError);

  write_file(dir / "short", bytes.substr(0, bytes.size() - 3));
  EXPECT_THROW(tfrecord::read_records(dir / "short"), engine::UserError);
}

TEST(TensorBoardWriter, NamesTheFileAsTensorBoardExpects) {
  TempDir dir("tensorboard");
  TensorBoardWriter writer(dir / "nested" / "run");
  const std::string name = writer.path().filename().string();
  EXPECT_EQ(writer.path().parent_path(), dir / "nested" / "run");
  char host[256] = {};
  ::gethostname(host, sizeof host - 1);
  EXPECT_TRUE(std::regex_match(name, std::regex("events\\.out\\.tfevents\\.[0-9]{10}\\." + std::string(host) + "\\." +
                                                std::to_string(::getpid()) + "\\.engine")))
      << name;
}

// The values a run writes, awkward ones included: tiny, negative, zero, 1e20, steps up to 1e6.
struct Point {
  int64_t step;
  double value;
  double wall_time;
};
const std::vector<Point> kLoss = {{0, 3.14159265, 1.7e9},   {1, 1e-8, 1.7e9 + 0.25}, {2, -2.5, 1.7e9 + 0.5},
                                  {10, 0.0, 1.7e9 + 1.125}, {1000, 1e20, 1.7e9 + 2}, {1000000, 0.1, 1.7e9 + 3}};

std::vector<double> histogram_values() {
  std::vector<double> values;
  for (int i = 0; i <= 30; ++i) values.push_back(i);
  values.insert(values.end(), {2.5, 2.5, 29.9, std::nan(""), std::numeric_limits<double>::infinity()});
  return values;
}

TEST(TensorBoardWriter, TensorBoardReadsBackEveryValue) {
  TempDir dir("tensorboard");
  std::filesystem::path file;
  {
    TensorBoardWriter writer(dir.path());
    file = writer.path();
    for (const Point& p : kLoss) writer.scalar("train/loss", p.value, p.step, p.wall_time);
    writer.scalar("train/lr", 6e-4, 7);
    writer.text("run/recipe", "# Recipe\n\n| key | value |\n|---|---|\n| lr | 6e-4 |\n\nünïcode ✓", 3);
    writer.histogram("weights/w0", histogram_values(), 5);
    writer.histogram("weights/empty", {}, 5);
    const std::vector<double> same = {4.0, 4.0, 4.0};
    writer.histogram("weights/constant", same, 5);
  }  // the destructor flushes

  const json read = read_with_tensorboard(file);
  ASSERT_FALSE(read.is_null());
  EXPECT_EQ(read["file_version"], "brain.Event:2");
  EXPECT_EQ(read["records"], 1 + kLoss.size() + 1 + 1 + 3);
  EXPECT_TRUE(read["record_error"].is_null());
  // The server's path (EventFileLoader) migrates simple_value to the scalars plugin.
  EXPECT_EQ(read["plugins"]["scalars"], kLoss.size() + 1);
  EXPECT_EQ(read["plugins"]["text"], 1);
  EXPECT_EQ(read["plugins"]["histograms"], 3);

  const json& loss = read["scalars"]["train/loss"];
  ASSERT_EQ(loss.size(), kLoss.size());
  for (size_t i = 0; i < kLoss.size(); ++i) {
    EXPECT_EQ(loss[i]["step"].get<int64_t>(), kLoss[i].step);
    EXPECT_EQ(loss[i]["wall_time"].get<double>(), kLoss[i].wall_time);
    // Exactly the float32 nearest the written double.
    EXPECT_EQ(loss[i]["value"].get<double>(), static_cast<double>(static_cast<float>(kLoss[i].value))) << i;
  }
  const json& lr = read["scalars"]["train/lr"];
  ASSERT_EQ(lr.size(), 1u);
  EXPECT_EQ(lr[0]["value"].get<double>(), static_cast<double>(6e-4f));
  EXPECT_NEAR(lr[0]["wall_time"].get<double>(), TensorBoardWriter::now(), 600.0);  // the default is the clock

  const json& text = read["texts"]["run/recipe"];
  ASSERT_EQ(text.size(), 1u);
  EXPECT_EQ(text[0]["step"], 3);
  EXPECT_EQ(text[0]["plugin"], "text");
  EXPECT_EQ(text[0]["dtype"], 7);  // DT_STRING
  EXPECT_EQ(text[0]["rank"], 0);
  EXPECT_EQ(text[0]["text"], json::array({"# Recipe\n\n| key | value |\n|---|---|\n| lr | 6e-4 |\n\nünïcode ✓"}));

  // 0..30, 2.5 twice and 29.9 (NaN and inf left out): width 1, limits 1..30; bucket k holds
  // [k, k+1), and the last also the maximum 30.
  std::vector<double> finite;
  for (double v : histogram_values())
    if (std::isfinite(v)) finite.push_back(v);
  double sum = 0, sum_squares = 0;
  for (double v : finite) sum += v, sum_squares += v * v;
  std::vector<double> limits, counts(30, 1.0);
  for (int i = 1; i <= 30; ++i) limits.push_back(i);
  counts[2] = 3;
  counts[29] = 3;
  const json& histo = read["histograms"]["weights/w0"];
  ASSERT_EQ(histo.size(), 1u);
  EXPECT_EQ(histo[0]["step"], 5);
  EXPECT_EQ(histo[0]["min"].get<double>(), 0.0);
  EXPECT_EQ(histo[0]["max"].get<double>(), 30.0);
  EXPECT_EQ(histo[0]["num"].get<double>(), 34.0);
  EXPECT_EQ(histo[0]["sum"].get<double>(), sum);
  EXPECT_EQ(histo[0]["sum_squares"].get<double>(), sum_squares);
  EXPECT_EQ(histo[0]["bucket_limit"].get<std::vector<double>>(), limits);
  EXPECT_EQ(histo[0]["bucket"].get<std::vector<double>>(), counts);

  const json& empty = read["histograms"]["weights/empty"][0];
  EXPECT_EQ(empty["num"].get<double>(), 0.0);
  EXPECT_TRUE(empty["bucket"].empty());
  const json& constant = read["histograms"]["weights/constant"][0];
  EXPECT_EQ(constant["num"].get<double>(), 3.0);
  EXPECT_EQ(constant["bucket_limit"], json::array({4.0}));
  EXPECT_EQ(constant["bucket"], json::array({3.0}));
}

TEST(TensorBoardWriter, FlushMakesRecordsReadableWhileOpen) {
  TempDir dir("tensorboard");
  TensorBoardWriter writer(dir.path());
  writer.scalar("a", 1.5, 1, 10.0);
  writer.scalar("a", 2.5, 2, 11.0);
  writer.flush();
  const json read = read_with_tensorboard(writer.path());
  ASSERT_FALSE(read.is_null());
  EXPECT_EQ(read["records"], 3);
  ASSERT_EQ(read["scalars"]["a"].size(), 2u);
  EXPECT_EQ(read["scalars"]["a"][1]["value"].get<double>(), 2.5);
}

// A flipped byte in the third scalar's data (record 3) or in its length: TensorBoard's record
// reader raises DataLossError there, and its loader stops before the record (it treats a bad
// record as the truncated end of a file still being written); read_records names the record.
TEST(TensorBoardWriter, CorruptedByteIsNoticed) {
  struct Case {
    std::string name;
    size_t offset_in_record;  // 0..7 length, 12.. data
    std::string tensorboard_error;
    std::string our_error;
  };
  for (const Case& c : {Case{"data", 14, "failed event crc32 check", "record 3 at byte"},
                        Case{"length", 1, "failed header crc32 check", "record 3 at byte"}}) {
    SCOPED_TRACE(c.name);
    TempDir dir("tensorboard");
    std::filesystem::path file;
    {
      TensorBoardWriter writer(dir.path());
      file = writer.path();
      for (int step = 0; step < 5; ++step) writer.scalar("loss", 1.0 / (step + 1), step, 100.0 + step);
    }
    std::string bytes = read_file(file);
    const std::vector<std::string> records = tfrecord::read_records(file);
    ASSERT_EQ(records.size(), 6u);
    size_t offset = 0;
    for (int i = 0; i < 3; ++i) offset += 16 + records[i].size();
    bytes[offset + c.offset_in_record] ^= 0x20;
    write_file(file, bytes);

    const json read = read_with_tensorboard(file);
    ASSERT_FALSE(read.is_null());
    EXPECT_EQ(read["records"], 3);
    ASSERT_TRUE(read["record_error"].is_string());
    EXPECT_NE(read["record_error"].get<std::string>().find(c.tensorboard_error), std::string::npos)
        << read["record_error"];
    EXPECT_EQ(read["scalars"]["loss"].size(), 2u);

    try {
      tfrecord::read_records(file);
      ADD_FAILURE() << "read_records accepted a corrupted file";
    } catch (const engine::UserError& e) {
      const std::string message = e.what();
      EXPECT_NE(message.find(file.string()), std::string::npos) << message;
      EXPECT_NE(message.find(c.our_error + " " + std::to_string(offset)), std::string::npos) << message;
    }
  }
}

TEST(TensorBoardWriter, DirectoryThatCannotBeCreatedIsAUserError) {
  TempDir dir("tensorboard");
  write_file(dir / "plain-file", "not a directory");
  try {
    TensorBoardWriter writer(dir / "plain-file" / "tb");
    FAIL() << "created a writer under a regular file";
  } catch (const engine::UserError& e) {
    EXPECT_NE(
        std::string(e.what()).find("cannot create the TensorBoard directory " + (dir / "plain-file" / "tb").string()),
        std::string::npos)
        << e.what();
  }
}

// A write that fails (here the file-size limit, EFBIG, standing in for a full disk: both fail the
// write(2) under the stdio buffer) is a UserError naming the file. In a child process, so the
// limit does not outlive the test.
// Writes under a file-size limit until a write fails; exits 0 after printing the UserError.
[[noreturn]] void write_past_file_size_limit(const std::filesystem::path& dir) {
  std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit then fails with EFBIG
  const rlimit limit{8192, 8192};
  ::setrlimit(RLIMIT_FSIZE, &limit);
  try {
    TensorBoardWriter writer(dir);
    for (int step = 0; step < 10000; ++step) writer.scalar("loss", step, step);
    writer.flush();
  } catch (const engine::UserError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    std::_Exit(0);
  }
  std::_Exit(1);
}

TEST(TensorBoardWriterDeathTest, FailedWriteIsAUserErrorNamingTheFile) {
  TempDir dir("tensorboard");
  EXPECT_EXIT(write_past_file_size_limit(dir.path()), ::testing::ExitedWithCode(0),
              "cannot write TensorBoard event file .*events\\.out\\.tfevents\\..*: File too large");
}

}  // namespace

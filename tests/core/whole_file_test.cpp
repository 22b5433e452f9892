// read_whole_file: every byte of a file (NUL and CR included), an empty file as empty, and nothing
// for a missing path, a directory, a file whose reads fail or a file it may not open.
#include "core/whole_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>

#include "temp_dir.h"

namespace engine {
namespace {

using testing::TempDir;

TEST(WholeFile, EveryByteComesBack) {
  TempDir dir("whole_file");
  std::string bytes("a\0b\r\n\xff", 6);
  for (int i = 0; i < 100000; ++i) bytes.push_back(char(i * 7));  // past any one buffer
  std::ofstream(dir.path() / "data", std::ios::binary) << bytes;
  EXPECT_EQ(read_whole_file(dir.path() / "data"), bytes);
  std::ofstream(dir.path() / "empty");
  EXPECT_EQ(read_whole_file(dir.path() / "empty"), std::string());
}

TEST(WholeFile, WhatCannotBeReadIsNothing) {
  TempDir dir("whole_file");
  EXPECT_EQ(read_whole_file(dir.path() / "missing"), std::nullopt);
  EXPECT_EQ(read_whole_file(dir.path()), std::nullopt);
  EXPECT_EQ(read_whole_file("/proc/self/mem"), std::nullopt);  // opens, and its first read fails (EIO)
  std::ofstream(dir.path() / "locked") << "secret";
  std::filesystem::permissions(dir.path() / "locked", std::filesystem::perms::none);
  if (geteuid() != 0) {  // root reads it anyway
    EXPECT_EQ(read_whole_file(dir.path() / "locked"), std::nullopt);
  }
}

}  // namespace
}  // namespace engine

// REQUIRE_CUDA_DEVICE(): the first line of a test that needs a GPU. Without a CUDA device it skips
// the test, saying so (gtest names the test). A macro: GTEST_SKIP returns from the function it is
// written in, which must be the test body.
#pragma once

#include <gtest/gtest.h>

#include "core/device_info.h"

#define REQUIRE_CUDA_DEVICE() \
  if (::engine::cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device here: this test runs on a GPU machine"

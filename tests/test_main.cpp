// The main() of every test program that has no main of its own: gtest's, after the one start-up
// step of the engine's own main() that decides how fast a test runs beside other work. Idle OpenMP
// threads spin the engine's count, not libgomp's default (core/openmp_wait.h): in-process trainings
// run two at a time under ctest, and with the default their spinning threads took each other's
// cores: the 19 offload equivalence cases took 120 s of test time in a Release ctest on two cores,
// 14 s with this main. Like the engine, the program may execute itself again here, once, with the
// variable set.
//
// Not copied from the engine's main(): its flush-to-zero mode, which would change the numbers the
// tests compute against their double-precision references.
#include <gtest/gtest.h>

#include "core/openmp_wait.h"

int main(int argc, char** argv) {
  engine::limit_openmp_spinning(argv);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

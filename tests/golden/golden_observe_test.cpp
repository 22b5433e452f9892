// `engine golden observe`: a trajectory run on another machine (its kernels no cap here can force)
// joins a golden's band, which never narrows; one of another version of the recipe, or of the
// recording's own environment, or missing, is refused and leaves the golden file as it was; and
// `engine golden update` keeps the observed runs while the trajectory is unchanged, dropping them
// (and saying so) once it changed.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "../shell.h"
#include "../temp_dir.h"
#include "core/whole_file.h"
#include "golden/golden.h"

namespace engine {
namespace {

namespace fs = std::filesystem;
using testing::run_shell;
using testing::ShellResult;

const fs::path kGoldens = fs::path(ENGINE_SOURCE_DIR) / "recipes/golden";

ShellResult engine(const std::string& args, const fs::path& dir) {
  return run_shell("OMP_NUM_THREADS=1 '" ENGINE_BINARY "' " + args, dir);
}

nlohmann::json read_json(const fs::path& path) { return nlohmann::json::parse(std::ifstream(path)); }

void write_json(const fs::path& path, const nlohmann::json& j) { std::ofstream(path) << j.dump(1); }

TEST(GoldenObserve, ATrajectoryFromElsewhereWidensTheBandAndUpdateKeepsItWhileTheTrajectoryStands) {
  const testing::TempDir dir("observe");
  fs::copy_file(kGoldens / "gpt_markov.yaml", dir / "gpt_markov.yaml");
  // Recorded here first, with its band from this machine's variants, so that the update below
  // reproduces the recording bit for bit on any machine.
  ShellResult r = engine("golden record gpt_markov.yaml", dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  const fs::path golden_file = dir / "gpt_markov.golden.json";
  const GoldenFile recorded = read_golden(golden_file);

  // "Another machine": this one's trajectory, in an environment marked as another CPU's, with the
  // loss moved by 1e-3 (relative) from step 10 on.
  fs::create_directories(dir / "elsewhere");
  r = engine("golden trajectory gpt_markov.yaml --out elsewhere/gpt_markov.json", dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  nlohmann::json elsewhere = read_json(dir / "elsewhere/gpt_markov.json");
  elsewhere["environment"]["cpu_isa"] = "avx512_core_amx (test)";
  for (size_t i = 9; i < elsewhere["steps"].size(); ++i)
    elsewhere["steps"][i]["loss"] = elsewhere["steps"][i]["loss"].get<double>() * (1 + 1e-3);
  write_json(dir / "elsewhere/gpt_markov.json", elsewhere);

  r = engine("golden observe --from elsewhere gpt_markov.yaml", dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("observed avx512_core_amx (test)"), std::string::npos) << r.output;
  GoldenFile observed = read_golden(golden_file);
  ASSERT_EQ(observed.observed.size(), 1u);
  ASSERT_EQ(observed.band.steps.size(), recorded.trajectory.steps.size());
  // The band's rule: 5 x the running spread, from a lookahead of 2 steps before the move; before
  // that the band is the variants' as it was, and it never narrows.
  for (size_t i = 0; i < 7; ++i) EXPECT_EQ(observed.band.steps[i].loss, recorded.band.steps[i].loss) << i;
  for (size_t i = 0; i < observed.band.steps.size(); ++i) {
    EXPECT_GE(observed.band.steps[i].loss, recorded.band.steps[i].loss) << i;
    EXPECT_GE(observed.band.steps[i].grad_norm, recorded.band.steps[i].grad_norm) << i;
  }
  ASSERT_LT(recorded.band.steps[24].loss, 1e-3) << "the variants alone leave room for the observed move";
  EXPECT_NEAR(observed.band.steps[7].loss, 5e-3, 1e-6);
  EXPECT_NEAR(observed.band.steps[24].loss, 5e-3, 1e-6);
  EXPECT_EQ(observed.trajectory.weights_digest, recorded.trajectory.weights_digest);

  // Checked as from that machine, the observed run is within the band (it was outside a band
  // without it: the floor).
  Trajectory moved = observed.trajectory;
  for (size_t i = 9; i < moved.steps.size(); ++i) moved.steps[i].loss *= 1 + 1e-3;
  moved.weights_digest = "elsewhere";
  EXPECT_TRUE(compare(observed, moved, observed.observed[0].environment).ok);

  // The same observation again replaces the first rather than adding a second.
  r = engine("golden observe --from elsewhere gpt_markov.yaml", dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(read_golden(golden_file).observed.size(), 1u);

  // An update that reproduces the trajectory keeps the observed run and its share of the band.
  r = engine("golden update gpt_markov.yaml", dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  GoldenFile updated = read_golden(golden_file);
  ASSERT_EQ(updated.observed.size(), 1u) << r.output;
  EXPECT_NEAR(updated.band.steps[24].loss, 5e-3, 1e-6);

  // A changed recipe changes the trajectory: the observed run is stale and goes, with a note.
  std::string recipe_text = *read_whole_file(dir / "gpt_markov.yaml");
  recipe_text.replace(recipe_text.find("lr: 0.01,"), 9, "lr: 0.02,");
  std::ofstream(dir / "gpt_markov.yaml") << recipe_text;
  r = engine("golden update --no-band gpt_markov.yaml", dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_NE(r.output.find("1 observed run(s) dropped"), std::string::npos) << r.output;
  EXPECT_TRUE(read_golden(golden_file).observed.empty());
}

TEST(GoldenObserve, ObservationsThatCannotWidenTheBandAreRefusedAndChangeNothing) {
  const testing::TempDir dir("observe");
  fs::copy_file(kGoldens / "gpt_markov.yaml", dir / "gpt_markov.yaml");
  fs::copy_file(kGoldens / "gpt_markov.golden.json", dir / "gpt_markov.golden.json");
  fs::create_directories(dir / "elsewhere");
  const std::string before = *read_whole_file(dir / "gpt_markov.golden.json");

  ShellResult r = engine("golden observe --from elsewhere gpt_markov.yaml", dir.path());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("elsewhere/gpt_markov.json: no trajectory for gpt_markov.yaml"), std::string::npos)
      << r.output;

  r = engine("golden trajectory gpt_markov.yaml --out elsewhere/gpt_markov.json", dir.path());
  ASSERT_EQ(r.status, 0) << r.output;
  const nlohmann::json original = read_json(dir / "elsewhere/gpt_markov.json");
  nlohmann::json trajectory = original;
  const nlohmann::json golden = read_json(dir / "gpt_markov.golden.json");

  // The recording's own environment: a check there is bitwise, so the band cannot use it.
  trajectory["environment"] = golden["environment"];
  write_json(dir / "elsewhere/gpt_markov.json", trajectory);
  r = engine("golden observe --from elsewhere gpt_markov.yaml", dir.path());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("ran in the recording's own environment"), std::string::npos) << r.output;

  // Another version of the recipe.
  trajectory["environment"]["cpu_isa"] = "avx512_core_amx (test)";
  trajectory["recipe_hash"] = "0123456789abcdef";
  write_json(dir / "elsewhere/gpt_markov.json", trajectory);
  r = engine("golden observe --from elsewhere gpt_markov.yaml", dir.path());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("ran another version of gpt_markov.yaml (hash 0123456789abcdef"), std::string::npos)
      << r.output;

  // Another engine build: its kernels may differ from the ones this build checks with.
  trajectory = original;
  trajectory["environment"]["cpu_isa"] = "avx512_core_amx (test)";
  trajectory["engine_commit"] = "0000000";
  write_json(dir / "elsewhere/gpt_markov.json", trajectory);
  r = engine("golden observe --from elsewhere gpt_markov.yaml", dir.path());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_NE(r.output.find("was run by engine 0000000"), std::string::npos) << r.output;

  EXPECT_EQ(*read_whole_file(dir / "gpt_markov.golden.json"), before);
}

}  // namespace
}  // namespace engine

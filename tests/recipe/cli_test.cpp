// The engine binary as a user runs it: exit codes, one-line summaries, all errors at once,
// resolved config, schema, help, and hostile files under a memory limit.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "../shell.h"
#include "../temp_dir.h"

namespace {

namespace fs = std::filesystem;
const fs::path kSource = ENGINE_SOURCE_DIR;

using Result = engine::testing::ShellResult;

// Runs a shell command in the source directory.
Result run_shell(const std::string& shell_command) { return engine::testing::run_shell(shell_command, kSource); }

Result run(const std::string& args) { return run_shell("'" ENGINE_BINARY "' " + args); }

bool contains(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

TEST(Cli, ValidatePrintsOneLineAndExitsZero) {
  Result r = run("validate recipes/quickstart.yaml");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "recipes/quickstart.yaml: ok: gpt")) << r.output;
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
}

// The quick start's warmup (30 steps) is cut to a shorter run: the summary says so.
TEST(Cli, TheSummaryNotesAWarmupClampedToTheRun) {
  Result r = run("validate recipes/quickstart.yaml train.steps=20");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "recipes/quickstart.yaml: note: scheduler.warmup_steps 30 clamped to train.steps 20"))
      << r.output;
  r = run("validate recipes/quickstart.yaml train.steps=30");
  EXPECT_FALSE(contains(r.output, "note:")) << r.output;
}

TEST(Cli, ValidateWithOverrides) {
  Result r = run("validate recipes/quickstart.yaml train.steps=70 train.global_batch_size=64 --world-size 2");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "70 steps of 64 samples (micro-batch 16 x 2 accumulation x 2 ranks)")) << r.output;
}

// Mistakes a user makes, each answered by one clear error (exit 2), the last line of stdout (stderr
// elsewhere, as in a log file) saying the command failed rather than the "ok" it printed before, and
// nothing left behind: no temporary file, no weights of a run that did not train.
TEST(Cli, MistakesGetOneClearErrorAndLeaveNothingBehind) {
  const engine::testing::TempDir dir("mistakes");
  ASSERT_EQ(run("train recipes/quickstart.yaml train.steps=2 run.output_dir=" + dir.path().string()).status, 0);
  // A .safetensors destination names a file (any other is a model directory: engine export
  // writes model.safetensors and config.json into it), so a directory by that name is a mistake.
  const fs::path finished = dir / "quickstart", some_dir = dir / "some_dir.safetensors";
  fs::create_directories(some_dir);
  std::ofstream(dir / "bad.safetensors") << "not a safetensors file";
  struct Mistake {
    std::string args, says;
    std::vector<fs::path> absent;
  };
  const std::vector<Mistake> mistakes = {
      {"export " + finished.string() + " " + some_dir.string(),
       "is a directory: name the file to write",
       {dir / "some_dir.safetensors.tmp", some_dir / ".tmp"}},
      {"train recipes/quickstart.yaml model.init_from=" + (dir / "bad.safetensors").string() +
           " run.output_dir=" + (dir / "b").string(),
       "bad.safetensors",
       {dir / "b" / "quickstart" / "model.safetensors"}},
  };
  for (const Mistake& m : mistakes) {
    const Result both = run(m.args);
    EXPECT_EQ(both.status, 2) << m.args << "\n" << both.output;
    EXPECT_TRUE(contains(both.output, m.says)) << m.args << "\n" << both.output;
    const Result out = run_shell("('" ENGINE_BINARY "' " + m.args + " 2>/dev/null)");
    const std::string last = out.output.substr(out.output.rfind('\n', out.output.size() - 2) + 1);
    EXPECT_EQ(last.rfind("failed (exit 2): ", 0), 0u) << m.args << ": stdout ends with " << last;
    for (const fs::path& path : m.absent) EXPECT_FALSE(fs::exists(path)) << m.args << " left " << path;
  }
}

// A check that needs no built model is validation's: validate refuses what plan and train would.
TEST(Cli, ValidateRefusesACommunicationTypeOtherThanTheAccumulationType) {
  const std::string recipe = "recipes/quickstart.yaml precision.mode=bf16 precision.communication_dtype=bf16";
  Result r = run("validate " + recipe + " --world-size 2");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "precision.communication_dtype")) << r.output;
  EXPECT_TRUE(contains(r.output, "differs from accumulation_dtype at world_size 2")) << r.output;
  EXPECT_TRUE(contains(r.output, "world_size 2 comes from --world-size")) << r.output;
  EXPECT_EQ(run("validate " + recipe).status, 0);  // one process reduces nothing
}

TEST(Cli, WorldSizeComesFromMpirunEnvironment) {
  Result r = run(
      "validate recipes/quickstart.yaml train.global_batch_size=40 >/dev/null; OMPI_COMM_WORLD_SIZE=3 '" ENGINE_BINARY
      "' validate recipes/quickstart.yaml train.gradient_accumulation_steps=1 train.global_batch_size=40");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "world_size 3 comes from the environment (OMPI_COMM_WORLD_SIZE=3)")) << r.output;
}

// A world size that the process's launcher does not provide is refused (train), commands that run
// steps in one process refuse to run as N independent copies, and the golden runner, which starts
// its own ranks, refuses to be started as one.
TEST(Cli, CommandsThatRunStepsRefuseAWorldSizeOtherThanOne) {
  const ::engine::testing::TempDir scratch("cli_world");
  const std::string out = scratch.path().string();
  const std::string quick = "recipes/quickstart.yaml train.steps=1 scheduler.warmup_steps=0 run.output_dir=" + out;
  Result r = run("train " + quick + " --world-size 2");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "world size 2 (from --world-size on the command line) but this process is one of 1"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "mpirun -n 2 engine train")) << r.output;
  // This one starts MPI (as a singleton): under the sanitizer build, Open MPI's unfreed start-up
  // allocations would otherwise turn the exit status into LeakSanitizer's.
  r = run_shell("ASAN_OPTIONS=detect_leaks=0 OMPI_COMM_WORLD_SIZE=2 '" ENGINE_BINARY "' train " + quick);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "world size 2 (from the environment (OMPI_COMM_WORLD_SIZE=2))")) << r.output;
  r = run_shell("PMI_SIZE=4 '" ENGINE_BINARY "' golden check recipes/golden/gpt_markov.yaml");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "engine golden record, check and update start their own ranks (world size 4"))
      << r.output;
  // A golden recorded at world size 2 launches its ranks with mpirun: without one, say what to install.
  r = run_shell("PATH=/nonexistent '" ENGINE_BINARY "' golden check recipes/golden/gpt_zero0_world2.yaml");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "mpirun, which is not on PATH")) << r.output;
  EXPECT_TRUE(contains(r.output, "apt-get install openmpi-bin")) << r.output;
  r = run_shell("OMPI_COMM_WORLD_SIZE=2 '" ENGINE_BINARY "' generate " + out);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "engine generate runs in a single process")) << r.output;
  // Planning for several ranks, and training with an explicit world size of one, still work.
  EXPECT_EQ(run("plan recipes/quickstart.yaml --world-size 2").status, 0);
  r = run("train " + quick + " --world-size 1");
  EXPECT_EQ(r.status, 0) << r.output;
}

// A second --dump-gradients-at for the same step would replace the first file: refused before any
// training, naming both files.
// engine eval: the validation loss of a run's final weights, without training, is the loss the run
// itself logged for them at its last step (the same batches of the validation split); without
// weights, or under mpirun, one clear error.
TEST(Cli, EvalGivesTheValidationLossTheRunLoggedForItsWeights) {
  const engine::testing::TempDir dir("eval");
  const std::string recipe = "recipes/quickstart.yaml train.steps=20 train.eval_every=20 train.eval_batches=3 ";
  ASSERT_EQ(run("train " + recipe + "run.name=run run.output_dir=" + dir.path().string()).status, 0);
  double logged = -1;
  std::ifstream metrics(dir / "run" / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    if (contains(line, "\"val_loss\"") && contains(line, "\"step\":20"))
      logged = std::stod(line.substr(line.find("\"val_loss\":") + 11));
  ASSERT_GT(logged, 0) << "no val_loss at step 20";
  Result r = run("eval " + recipe + "--weights " + (dir / "run").string());
  ASSERT_EQ(r.status, 0) << r.output;
  const size_t at = r.output.find("eval: loss ");
  ASSERT_NE(at, std::string::npos) << r.output;
  EXPECT_NEAR(std::stod(r.output.substr(at + 11)), logged, 1e-6) << r.output;
  EXPECT_TRUE(contains(r.output, "over 3 validation batches of 16 x 64")) << r.output;
  r = run("eval " + recipe);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "engine eval needs weights")) << r.output;
  r = run_shell("ASAN_OPTIONS=detect_leaks=0 OMPI_COMM_WORLD_SIZE=2 '" ENGINE_BINARY "' eval " + recipe + "--weights " +
                (dir / "run").string());
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "engine eval runs in a single process")) << r.output;
}

// A model trained on packed documents (data.document_end) stops generating at the end token, as
// Hugging Face's generate stops at eos: here every document is "abc", so greedy decoding from "a"
// gives "bc" and then the end; without the stop it would go on to "\nabc\nabc...".
TEST(Cli, GenerateStopsAtTheDocumentEnd) {
  const engine::testing::TempDir dir("generate_end");
  {
    std::ofstream text(dir / "docs.txt");
    for (int i = 0; i < 4000; ++i) text << "abc\n";
  }
  const std::string recipe =
      "recipes/quickstart.yaml data.source=text ~data.order data.path=" + (dir / "docs.txt").string() +
      " model.vocab_size=256 train.steps=60 run.device=cpu ";
  Result r = run("train " + recipe + "data.document_end=10 run.name=run run.output_dir=" + dir.path().string());
  ASSERT_EQ(r.status, 0) << r.output;
  r = run("generate " + (dir / "run").string() + " --prompt a --tokens 40 --temperature 0");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_EQ(r.output, "abc\n");
  // Trained without the end token, the same text keeps going past it.
  r = run("train " + recipe + "run.name=plain run.output_dir=" + dir.path().string());
  ASSERT_EQ(r.status, 0) << r.output;
  r = run("generate " + (dir / "plain").string() + " --prompt a --tokens 40 --temperature 0");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "abc\nabc")) << r.output;
}

// data.loss_mask: a mask of ones trains the bits of no mask (the step's normalisation is exactly 1);
// a mask that leaves tokens out trains something else; a mask of the wrong size, or a byte other than
// 0 and 1, is refused naming the file.
TEST(Cli, ALossMaskOfOnesTrainsTheBitsOfNoMask) {
  const engine::testing::TempDir dir("loss_mask");
  const int64_t count = 6000;
  std::string tokens(size_t(count) * 2, '\0'), ones(size_t(count), '\1'), half(size_t(count), '\1');
  for (int64_t i = 0, x = 1; i < count; ++i) {
    x = (x * 1103515245 + 12345) % 2147483648;
    const uint16_t t = uint16_t((x >> 16) % 64);
    std::memcpy(tokens.data() + 2 * i, &t, 2);
    if ((i / 7) % 2 == 0) half[size_t(i)] = '\0';
  }
  std::ofstream(dir / "tokens.bin", std::ios::binary) << tokens;
  std::ofstream(dir / "ones.mask", std::ios::binary) << ones;
  std::ofstream(dir / "half.mask", std::ios::binary) << half;
  std::ofstream(dir / "short.mask", std::ios::binary) << ones.substr(1);
  std::ofstream(dir / "two.mask", std::ios::binary) << std::string(size_t(count), '\2');
  const auto train = [&](const std::string& name, const std::string& mask) {
    return run("train recipes/quickstart.yaml data.source=tokens ~data.order data.format=raw_uint16 data.path=" +
               (dir / "tokens.bin").string() + (mask.empty() ? "" : " data.loss_mask=" + (dir / mask).string()) +
               " train.steps=3 train.gradient_accumulation_steps=2 train.eval_every=3 train.log_every=1 run.name=" +
               name + " run.output_dir=" + dir.path().string());
  };
  const auto read = [&](const fs::path& path) {
    std::ifstream in(path, std::ios::binary);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  const auto losses = [&](const std::string& name) {
    std::vector<double> out;
    std::ifstream metrics(dir / name / "metrics.jsonl");
    for (std::string line; std::getline(metrics, line);)
      if (contains(line, "\"loss\":")) out.push_back(std::stod(line.substr(line.find("\"loss\":") + 7)));
    return out;
  };
  ASSERT_EQ(train("plain", "").status, 0);
  Result r = train("ones", "ones.mask");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "6000 trained tokens")) << r.output;
  EXPECT_EQ(read(dir / "ones" / "model.safetensors"), read(dir / "plain" / "model.safetensors"));
  EXPECT_EQ(losses("ones"), losses("plain"));
  ASSERT_EQ(train("half", "half.mask").status, 0);
  EXPECT_NE(read(dir / "half" / "model.safetensors"), read(dir / "plain" / "model.safetensors"));
  ASSERT_FALSE(losses("half").empty());
  EXPECT_TRUE(std::isfinite(losses("half")[0]));
  r = train("short", "short.mask");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "a loss mask of 5999 bytes for 6000 tokens")) << r.output;
  r = train("two", "two.mask");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "byte 2 at offset 0 (a loss mask holds 0 and 1)")) << r.output;
}

TEST(Cli, DumpGradientsAtRefusesARepeatedStep) {
  const ::engine::testing::TempDir scratch("cli_dump");
  const std::string a = (scratch / "a.safetensors").string(), b = (scratch / "b.safetensors").string();
  Result r = run("train recipes/quickstart.yaml train.steps=4 scheduler.warmup_steps=0 run.output_dir=" +
                 (scratch / "runs").string() + " --dump-gradients-at 4 " + a + " --dump-gradients-at 4 " + b);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "--dump-gradients-at 4 is given twice (" + a + " and " + b + ")")) << r.output;
  EXPECT_FALSE(fs::exists(a) || fs::exists(b) || fs::exists(scratch / "runs")) << r.output;
}

// The fortunes example reads a corpus that a Debian package installs: without it, the error says
// how to get it.
TEST(Cli, AMissingSystemCorpusTellsTheUserToRunSetup) {
  Result r = run("validate recipes/examples/gpt-fortunes.yaml data.path=/usr/share/games/fortunes/not-installed");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "data.path: file not found: /usr/share/games/fortunes/not-installed")) << r.output;
  EXPECT_TRUE(contains(r.output, "run scripts/setup")) << r.output;
  // Other files under /usr/share are not something scripts/setup installs: no such hint.
  r = run("validate recipes/examples/gpt-fortunes.yaml data.path=/usr/share/dict/not-installed");
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_TRUE(contains(r.output, "data.path: file not found: /usr/share/dict/not-installed")) << r.output;
  EXPECT_FALSE(contains(r.output, "scripts/setup")) << r.output;
}

TEST(Cli, AllErrorsAndExitTwo) {
  const ::engine::testing::TempDir scratch("cli");
  fs::path path = scratch / "bad.yaml";
  std::ofstream(path) << "model:\n  arch: gpt\n  n_lyer: 2\ndata:\n  source: synthetic_markov\ntrain:\n  steps: -1\n"
                         "  micro_batch_size: 4\noptimizer:\n  type: adam\n";
  Result r = run("validate " + path.string());
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, path.string() + ":3:3: error: model.n_lyer: unknown key")) << r.output;
  EXPECT_TRUE(contains(r.output, path.string() + ":7:10: error: train.steps: expected an integer >= 1, found '-1'"))
      << r.output;
  EXPECT_TRUE(contains(
      r.output,
      path.string() + ":10:9: error: optimizer.type: expected one of adamw, sgd, found 'adam'; did you mean 'adamw'?"))
      << r.output;
  EXPECT_TRUE(contains(r.output, "3 errors")) << r.output;
}

TEST(Cli, MissingFileIsAUserError) {
  Result r = run("validate does/not/exist.yaml");
  EXPECT_EQ(r.status, 2);
  EXPECT_TRUE(contains(r.output, "error: does/not/exist.yaml: no such file")) << r.output;
}

TEST(Cli, BadCommandLineIsAUserError) {
  EXPECT_EQ(run("validate").status, 2);
  EXPECT_EQ(run("frobnicate").status, 2);
  EXPECT_EQ(run("validate recipes/quickstart.yaml --world-size 0").status, 2);
}

TEST(Cli, ConfigPrintsTheResolvedRecipe) {
  Result r = run("config recipes/quickstart.yaml");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "gradient_accumulation_steps: auto  # resolved: 1")) << r.output;
  EXPECT_TRUE(contains(r.output, "betas: [0.9, 0.999]")) << r.output;  // a default
  EXPECT_FALSE(contains(r.output, "momentum")) << "sgd-only keys do not apply to adamw";
}

TEST(Cli, ConfigDiffShowsOnlyChangedKeys) {
  Result r = run("config recipes/quickstart.yaml --diff train.log_every=10 optimizer.lr=0.01");
  EXPECT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "lr: 0.01")) << r.output;
  EXPECT_TRUE(contains(r.output, "steps: 300")) << r.output;
  EXPECT_FALSE(contains(r.output, "log_every")) << "equal to the default: " << r.output;
  EXPECT_FALSE(contains(r.output, "betas")) << r.output;
}

TEST(Cli, SchemaIsJsonSchema2020) {
  Result r = run("schema");
  EXPECT_EQ(r.status, 0);
  EXPECT_TRUE(contains(r.output, "\"$schema\": \"https://json-schema.org/draft/2020-12/schema\"")) << r.output;
}

TEST(Cli, VersionAndHelp) {
  Result version = run("--version");
  EXPECT_EQ(version.status, 0);
  EXPECT_TRUE(contains(version.output, "engine 0.")) << version.output;
  Result key = run("help train.micro_batch_size");
  EXPECT_EQ(key.status, 0);
  EXPECT_TRUE(contains(key.output, "any two determine the third")) << key.output;
  Result codes = run("help exit-codes");
  EXPECT_TRUE(contains(codes.output, "2  user error")) << codes.output;
  Result unknown = run("help optimiser");
  EXPECT_EQ(unknown.status, 2);
  EXPECT_TRUE(contains(unknown.output, "did you mean 'optimizer'?")) << unknown.output;
}

TEST(Cli, HostileFilesUnderAMemoryLimit) {
#ifdef ENGINE_SANITIZED
  GTEST_SKIP() << "ASan reserves more address space than the limit this test sets";
#endif
  for (const char* file : {"billion_laughs.yaml", "cyclic_alias.yaml", "garbage.bin", "empty.yaml"}) {
    // 1 GiB of address space is far more than a recipe needs and far less than an alias bomb.
    Result r = run_shell("sh -c \"ulimit -v 1048576; exec '" ENGINE_BINARY "' validate tests/recipe/hostile/" +
                         std::string(file) + "\"");
    EXPECT_EQ(r.status, 2) << file << ": " << r.output;
    EXPECT_TRUE(contains(r.output, file)) << r.output;
  }
}

}  // namespace

namespace {

// `engine plan --world-size N` sizes every ZeRO stage for one rank: model states shrink stage by
// stage (stage 3 to 16 bytes per parameter over N), and stage 3 sends half as much again as 0-2.
TEST(Cli, PlanSizesEveryZeroStagePerRank) {
  Result r = run("plan recipes/quickstart.yaml --world-size 4 distributed.zero_stage=2");
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_TRUE(contains(r.output, "ZeRO stages per rank at world size 4")) << r.output;
  EXPECT_TRUE(contains(r.output, "ZeRO stage 2, world size 4")) << r.output;
  EXPECT_TRUE(contains(r.output, "communication per rank and optimizer step")) << r.output;
  for (const char* row : {"\n   0 ", "\n   1 ", "\n  *2 ", "\n   3 "}) EXPECT_TRUE(contains(r.output, row)) << row;
}

// On a GPU plan the arena is the device's: the stage table's host columns hold no negative bytes
// (they once showed the f32 scratch subtracted from no host activations).
TEST(Cli, AGpuPlansStageTableCountsNoNegativeBytes) {
  Result r = run("plan recipes/quickstart.yaml run.device=cuda precision.mode=bf16");  // with f32 scratch
  ASSERT_EQ(r.status, 0) << r.output;
  const size_t table = r.output.find("ZeRO stages per rank");
  ASSERT_NE(table, std::string::npos) << r.output;
  const std::string rows = r.output.substr(table, r.output.find("(* the recipe's stage", table) - table);
  EXPECT_FALSE(contains(rows, " -")) << rows;
  EXPECT_TRUE(contains(r.output, "activations, total: the host's")) << r.output;
}

}  // namespace

namespace {

// 16-bit values go through kernels one way per shape of work: element-wise ops a chunk at a time,
// row ops a row at a time, each widened in cache (ops/elementwise/widened.h). Whole tensors are
// widened into f32 copies only for the one op of a model's step that is neither, the embedding's
// scatter-add; a new op without a 16-bit path joins this list and fails here. (The matmuls are
// widened too on a CPU without oneDNN's 16-bit matmul, AVX2 only: the plan says so, and they are
// not counted.)
TEST(Cli, ABf16StepWidensWholeTensorsOnlyForTheEmbeddingScatter) {
  for (const char* recipe : {"recipes/quickstart.yaml model.dropout=0.1", "recipes/golden/llama_markov.yaml"}) {
    SCOPED_TRACE(recipe);
    Result r = run(std::string("plan ") + recipe + " precision.mode=bf16");
    ASSERT_EQ(r.status, 0) << r.output;
    std::istringstream lines(r.output);
    std::set<std::string> widened_copies;
    for (std::string line; std::getline(lines, line);)
      if (contains(line, "on widened bf16 copies") && !contains(line, "(not on this CPU: ")) {
        std::istringstream words(line);
        std::string op;
        words >> op;
        widened_copies.insert(op);
      }
    EXPECT_EQ(widened_copies, std::set<std::string>{"embedding_backward"}) << r.output;
    EXPECT_TRUE(contains(r.output, "chunks widened in cache")) << r.output;
    EXPECT_TRUE(contains(r.output, "rows widened in cache")) << r.output;
  }
}

}  // namespace

#include "golden/variants.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "golden/golden.h"

extern char** environ;

namespace engine {

namespace fs = std::filesystem;

std::string VariantSpec::label() const {
  return (max_cpu_isa.empty() ? std::string("machine ISA") : "ONEDNN_MAX_CPU_ISA=" + max_cpu_isa) +
         " OMP_NUM_THREADS=" + std::to_string(threads);
}

std::vector<VariantSpec> default_variants(int recording_threads) {
  std::vector<VariantSpec> specs;
  for (const char* isa : {"", "AVX512_CORE", "AVX2"})
    for (int threads : {1, 2, 3, 4})
      if (*isa || threads != recording_threads) specs.push_back({isa, threads});
  return specs;
}

namespace {

// The parent's environment with the variant's two variables replaced.
std::vector<std::string> child_environment(const VariantSpec& spec) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    if (entry.rfind("ONEDNN_MAX_CPU_ISA=", 0) == 0 || entry.rfind("OMP_NUM_THREADS=", 0) == 0) continue;
    env.push_back(entry);
  }
  if (!spec.max_cpu_isa.empty()) env.push_back("ONEDNN_MAX_CPU_ISA=" + spec.max_cpu_isa);
  env.push_back("OMP_NUM_THREADS=" + std::to_string(spec.threads));
  return env;
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  for (std::string& s : strings) out.push_back(s.data());
  out.push_back(nullptr);
  return out;
}

// A private directory for the child's output, removed on every path out.
struct TemporaryDirectory {
  fs::path path;
  TemporaryDirectory() {
    std::string pattern = (fs::temp_directory_path() / "engine-golden-XXXXXX").string();
    if (!mkdtemp(pattern.data()))
      throw UserError("cannot create a temporary directory: " + std::string(strerror(errno)));
    path = pattern;
  }
  ~TemporaryDirectory() {
    std::error_code ignored;
    fs::remove_all(path, ignored);
  }
};

}  // namespace

VariantRun run_variant(const fs::path& engine_binary, const fs::path& recipe, const VariantSpec& spec) {
  TemporaryDirectory dir;
  const fs::path out = dir.path / "trajectory.golden.json";
  std::vector<std::string> args = {engine_binary.string(), "golden", "trajectory",
                                   recipe.string(),        "--out",  out.string()};
  std::vector<std::string> env = child_environment(spec);
  auto argv = pointers(args), envp = pointers(env);
  pid_t pid = 0;
  if (int error = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data()); error != 0)
    throw UserError("cannot run " + args[0] + ": " + std::strerror(error));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw UserError(std::string("waiting for a variant run: ") + std::strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw UserError("the rerun of " + recipe.string() + " under " + spec.label() + " failed (status " +
                    std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  GoldenFile run = read_golden(out);
  return {spec.label(), run.environment, run.trajectory.steps};
}

}  // namespace engine

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
         " OMP_NUM_THREADS=" + std::to_string(threads) + (gradient_noise ? " with one-ulp gradient noise" : "");
}

std::vector<VariantSpec> default_variants(int recording_threads) {
  std::vector<VariantSpec> specs;
  for (const char* isa : {"", "AVX512_CORE", "AVX2"})
    for (int threads : {1, 2, 3, 4})
      if (*isa || threads != recording_threads) specs.push_back({isa, threads});
  specs.push_back({"", recording_threads, true});
  return specs;
}

namespace {

// The parent's environment with the variant's two variables replaced (none without a variant), and
// under mpirun what lets it run as root in a container (mpirun's ranks inherit the rest).
std::vector<std::string> child_environment(const VariantSpec* spec, int world) {
  std::vector<std::string> replaced;
  if (spec) replaced = {"ONEDNN_MAX_CPU_ISA=", "OMP_NUM_THREADS="};
  if (world > 1) replaced.insert(replaced.end(), {"OMPI_ALLOW_RUN_AS_ROOT=", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="});
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    std::string entry = *e;
    bool keep = true;
    for (const std::string& name : replaced) keep = keep && entry.rfind(name, 0) != 0;
    if (keep) env.push_back(entry);
  }
  if (spec && !spec->max_cpu_isa.empty()) env.push_back("ONEDNN_MAX_CPU_ISA=" + spec->max_cpu_isa);
  if (spec) env.push_back("OMP_NUM_THREADS=" + std::to_string(spec->threads));
  if (world > 1) env.insert(env.end(), {"OMPI_ALLOW_RUN_AS_ROOT=1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1"});
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

fs::path find_mpirun(const char* path_list) {
  const std::string paths = path_list ? path_list : "";
  for (size_t begin = 0; begin <= paths.size();) {
    size_t end = paths.find(':', begin);
    if (end == std::string::npos) end = paths.size();
    const fs::path candidate =
        fs::path(paths.substr(begin, end - begin).empty() ? "." : paths.substr(begin, end - begin)) / "mpirun";
    if (access(candidate.c_str(), X_OK) == 0 && !fs::is_directory(candidate)) return candidate;
    begin = end + 1;
  }
  throw UserError(
      "a golden recipe at world size above 1 runs its ranks with mpirun, which is not on PATH; install OpenMPI "
      "(Debian and Ubuntu: apt-get install openmpi-bin)");
}

GoldenFile run_trajectory_processes(const fs::path& engine_binary, const fs::path& recipe, int world,
                                    const VariantSpec* spec) {
  TemporaryDirectory dir;
  const fs::path out = dir.path / "trajectory.golden.json";
  std::vector<std::string> args;
  if (world > 1) args = {find_mpirun(std::getenv("PATH")).string(), "-n", std::to_string(world), "--oversubscribe"};
  args.insert(args.end(), {engine_binary.string(), "golden", "trajectory", recipe.string(), "--out", out.string()});
  if (spec && spec->gradient_noise) args.push_back("--gradient-noise");
  std::vector<std::string> env = child_environment(spec, world);
  auto argv = pointers(args), envp = pointers(env);
  pid_t pid = 0;
  if (int error = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), envp.data()); error != 0)
    throw UserError("cannot run " + args[0] + ": " + std::strerror(error));
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) throw UserError(std::string("waiting for a variant run: ") + std::strerror(errno));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw UserError(
        (spec ? "the rerun of " + recipe.string() + " under " + spec->label() : "the run of " + recipe.string()) +
        (world > 1 ? " at world size " + std::to_string(world) : std::string()) + " failed (status " +
        std::to_string(WIFEXITED(status) ? WEXITSTATUS(status) : -1) + ")");
  GoldenFile run = read_golden(out);
  if (run.world_size != world)
    throw UserError("the run of " + recipe.string() + " under mpirun -n " + std::to_string(world) + " trained on " +
                    std::to_string(run.world_size) + " ranks");
  return run;
}

VariantRun run_variant(const fs::path& engine_binary, const fs::path& recipe, const VariantSpec& spec, int world) {
  GoldenFile run = run_trajectory_processes(engine_binary, recipe, world, &spec);
  return {spec.label(), run.environment, run.trajectory.steps, run.trajectory.weights};
}

}  // namespace engine

#include "checkpoint/checkpointer.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <ctime>

#include "checkpoint/durable_io.h"
#include "checkpoint/sharded_state.h"
#include "core/error.h"

namespace engine {

namespace fs = std::filesystem;

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string utc_now() {
  const std::time_t t = std::time(nullptr);
  char text[32];
  std::strftime(text, sizeof text, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return text;
}

}  // namespace

std::optional<int64_t> checkpoint_step_in_name(const std::string& name, const std::string& prefix) {
  if (name.rfind(prefix, 0) != 0 || name.size() == prefix.size() || name.size() > prefix.size() + 18)
    return std::nullopt;
  int64_t step = 0;
  for (char c : name.substr(prefix.size())) {
    if (c < '0' || c > '9') return std::nullopt;
    step = step * 10 + (c - '0');
  }
  return step;
}

fs::path checkpoint_directory(const recipe::Recipe& r) {
  if (!r.checkpoint.dir.empty()) return r.checkpoint.dir;
  return fs::path(r.run.output_dir) / r.run.name / "checkpoints";
}

std::vector<fs::path> committed_checkpoints(const fs::path& dir) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    const auto step = checkpoint_step_in_name(entry.path().filename().string());
    if (step && entry.is_directory() && fs::exists(entry.path() / kManifestName))
      found.emplace_back(*step, entry.path());
  }
  std::sort(found.begin(), found.end());
  std::vector<fs::path> out;
  for (auto& [step, path] : found) out.push_back(std::move(path));
  return out;
}

Checkpointer::Checkpointer(const recipe::CheckpointSection& config, fs::path dir, Communicator& comm)
    : config_(config), dir_(std::move(dir)), comm_(comm) {
  if (comm_.rank() != 0) return;
  // Writes that a crash or a kill interrupted: never committed, never trusted, removed now.
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir_, error))
    if (const std::string name = entry.path().filename().string();
        name.rfind(".tmp-", 0) == 0 || name.rfind(".replaced-step-", 0) == 0)
      fs::remove_all(entry.path(), error);
}

Checkpointer::~Checkpointer() {
  if (writer_.joinable()) writer_.join();
}

void Checkpointer::begin(Manifest manifest) {
  while (in_flight()) settle(true);
  manifest_ = std::move(manifest);
  tmp_ = dir_ / (".tmp-step-" + std::to_string(manifest_.step));
  started_ = now_seconds();
  status_ = 0;
  error_.clear();
  file_bytes_ = 0;
  pending_ = true;
}

void Checkpointer::start_streamed(Manifest manifest, const std::function<void(const Sink&)>& produce) {
  begin(std::move(manifest));
  produce_ = produce;
  write_rank_file(trace::Lane::compute);
  produce_ = nullptr;
}

void Checkpointer::start(Manifest manifest, const std::function<void(std::vector<std::byte>&)>& snapshot) {
  begin(std::move(manifest));
  if (!config_.async) {
    {
      trace::Scope event("checkpoint", "checkpoint snapshot");
      snapshot(image_);
    }
    return write_rank_file(trace::Lane::compute);
  }
  trace::Scope event("checkpoint", "checkpoint snapshot, writer started");
  snapshot(image_);
  writer_ = std::thread([this] { write_rank_file(trace::Lane::checkpoint); });
}

void Checkpointer::write_rank_file(trace::Lane lane) {
  trace::Scope event("checkpoint", "checkpoint write", lane);
  const double begin = now_seconds();
  try {
    std::error_code error;
    fs::create_directories(tmp_, error);  // every rank: whoever comes first creates it
    if (error) throw CheckpointIoError(tmp_.string() + ": cannot create the checkpoint directory: " + error.message());
    DurableWriter file(tmp_ / rank_file_name(comm_.rank()));
    if (produce_)
      produce_([&](const std::byte* data, size_t size) { file.append(data, size); });
    else
      file.append(image_.data(), image_.size());
    checksum_ = file.finish();
    file_bytes_ = file.bytes();
    if (event.active()) event.set_work(-1, double(file_bytes_));
    sync_directory(tmp_);
    write_seconds_ = now_seconds() - begin;
    status_ = 1;
  } catch (const std::exception& e) {
    error_ = e.what();
    status_ = -1;
  }
}

std::optional<Checkpointer::Committed> Checkpointer::settle(bool wait) {
  if (!pending_) return std::nullopt;
  if (wait && writer_.joinable()) writer_.join();
  const int status = status_.load();
  // Every rank's [status, checksum high and low 32 bits, write seconds, file bytes], in rank order
  // (pipeline stages hold different weights, so their files differ in size).
  std::vector<double> mine{double(status), 0, 0, 0, 0};
  if (status == 1)
    mine = {1, double(checksum_ >> 32), double(checksum_ & 0xffffffffu), write_seconds_, double(file_bytes_)};
  const std::vector<double> all = gather_values(comm_, mine, "checkpoint write status");
  std::vector<int> failed;
  bool writing = false;
  for (int r = 0; r < comm_.size(); ++r) {
    const double s = all[size_t(r) * 5];
    if (s < 0) failed.push_back(r);
    if (s == 0) writing = true;
  }
  if (failed.empty() && writing) return std::nullopt;  // not every rank's file is durable yet
  if (writer_.joinable()) writer_.join();
  pending_ = false;
  if (!failed.empty()) {
    if (status < 0) spdlog::error("checkpoint at step {}: {}", manifest_.step, error_);
    std::string ranks;
    for (int r : failed) ranks += (ranks.empty() ? "" : ", ") + std::to_string(r);
    std::error_code ignored;
    if (comm_.rank() == 0) fs::remove_all(tmp_, ignored);
    const std::vector<fs::path> kept = committed_checkpoints(dir_);
    const std::string message = "checkpoint at step " + std::to_string(manifest_.step) +
                                " could not be written (rank " + ranks + ": " +
                                (status < 0 ? error_ : std::string("see that rank's log")) + "); " +
                                (kept.empty() ? "no earlier checkpoint exists"
                                              : "the previous checkpoint " + kept.back().string() + " is intact");
    if (config_.on_error == recipe::CheckpointErrorAction::stop) throw CheckpointIoError(message);
    spdlog::warn("{}; training continues (checkpoint.on_error: continue)", message);
    return std::nullopt;
  }
  Committed done;
  done.step = manifest_.step;
  done.path = dir_ / ("step-" + std::to_string(manifest_.step));
  manifest_.files.clear();
  for (int r = 0; r < comm_.size(); ++r) {
    const uint64_t sum = (uint64_t(all[size_t(r) * 5 + 1]) << 32) | uint64_t(all[size_t(r) * 5 + 2]);
    const auto file_bytes = int64_t(all[size_t(r) * 5 + 4]);
    manifest_.files.push_back({rank_file_name(r), file_bytes, checksum_hex(sum)});
    done.write_seconds = std::max(done.write_seconds, all[size_t(r) * 5 + 3]);
    done.bytes += file_bytes;
  }
  // Rank 0 commits; every rank learns whether it could (its disk may be the full one).
  std::string commit_error;
  if (comm_.rank() == 0) {
    try {
      commit(done);
    } catch (const std::exception& e) {
      commit_error = e.what();
      std::error_code ignored;
      fs::remove_all(tmp_, ignored);
    }
  }
  const bool committed = gather_values(comm_, {commit_error.empty() ? 1.0 : 0.0}, "checkpoint commit status")[0] != 0;
  if (!committed) {
    const std::string message = "checkpoint at step " + std::to_string(manifest_.step) + " could not be committed" +
                                (commit_error.empty() ? " (see rank 0's log)" : ": " + commit_error);
    if (config_.on_error == recipe::CheckpointErrorAction::stop) throw CheckpointIoError(message);
    spdlog::warn("{}; training continues (checkpoint.on_error: continue)", message);
    return std::nullopt;
  }
  done.seconds = now_seconds() - started_;
  last_write_seconds_ = done.seconds;
  return done;
}

void Checkpointer::commit(Committed& done) {
  manifest_.created = utc_now();
  const std::string text = manifest_to_json(manifest_).dump(1) + "\n";
  write_durably(tmp_ / kManifestName, text.data(), text.size());
  sync_directory(tmp_);
  // A checkpoint of the same step from an abandoned attempt is replaced, never merged.
  std::error_code error;
  const fs::path aside = dir_ / (".replaced-step-" + std::to_string(done.step));
  if (fs::exists(done.path)) {
    fs::remove_all(aside, error);
    fs::rename(done.path, aside, error);
    if (error) throw CheckpointIoError(done.path.string() + ": cannot replace it: " + error.message());
  }
  fs::rename(tmp_, done.path, error);
  if (error)
    throw CheckpointIoError(tmp_.string() + ": cannot commit it as " + done.path.string() + ": " + error.message());
  sync_directory(dir_);
  fs::remove_all(aside, error);
  prune();
}

void Checkpointer::prune() {
  if (config_.keep_last <= 0) return;
  std::vector<fs::path> all = committed_checkpoints(dir_);
  std::error_code error;
  for (size_t i = 0; i + size_t(config_.keep_last) < all.size(); ++i) {
    // Uncommitted by one rename first: a crash mid-removal leaves a .tmp- directory, which nothing
    // trusts and the next run removes.
    const fs::path doomed = dir_ / (".tmp-pruned-" + all[i].filename().string());
    fs::rename(all[i], doomed, error);
    if (!error) fs::remove_all(doomed, error);
  }
}

}  // namespace engine

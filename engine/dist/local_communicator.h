// LocalCommunicator: the group of one rank, what a plain single-process run uses.
//
// Every collective over one rank is a copy or nothing: reduce_scatter copies (or, with
// Reduction::accumulate, adds) send into recv, all_gather copies unless in place, all_reduce,
// broadcast and barrier do nothing. Each returns an already completed Work, and nothing is sent,
// so the single-process path costs a memcpy at most.
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.h"

namespace engine {

class LocalCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  int local_rank() const override { return 0; }
  int local_size() const override { return 1; }
  std::string backend() const override { return "local"; }

  Work reduce_scatter(const void* send, void* recv, int64_t count, DType dtype, Reduction reduction, std::string what,
                      Stream stream = {}) override;
  Work all_gather(const void* send, void* recv, int64_t bytes, std::string what, Stream stream = {}) override;
  Work all_reduce(void* data, int64_t count, DType dtype, std::string what, Stream stream = {}) override;
  Work broadcast(void* data, int64_t bytes, int root, std::string what, Stream stream = {}) override;
  Work barrier(std::string what) override;

  int64_t bytes_sent() const override { return 0; }
  // A group of one: another local communicator.
  std::unique_ptr<Communicator> split(int, int, const std::string&) override {
    return std::make_unique<LocalCommunicator>();
  }
  [[noreturn]] void abort_job(int exit_code) override;
};

}  // namespace engine

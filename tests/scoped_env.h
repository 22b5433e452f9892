// ScopedEnv: sets an environment variable for the life of the object, then puts back what was
// there (the old value, or nothing), also when a failed ASSERT leaves the test early. A test that
// points XDG_CACHE_HOME at a TempDir holds one, so the tests after it in the same process read
// the caller's variable again, not a deleted directory.
#pragma once

#include <stdlib.h>

#include <optional>
#include <string>

namespace engine::testing {

class ScopedEnv {
 public:
  ScopedEnv(std::string name, const std::string& value) : name_(std::move(name)) {
    if (const char* old = ::getenv(name_.c_str())) old_ = old;
    ::setenv(name_.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_.c_str(), old_->c_str(), 1);
    else
      ::unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_;
  std::optional<std::string> old_;
};

}  // namespace engine::testing

#include "tp/watchdog.h"

#include <fmt/format.h>

namespace lockstep {

CollectiveWatchdog::CollectiveWatchdog(std::chrono::milliseconds timeout,
                                       std::function<std::optional<std::string>()> poll,
                                       std::function<void(const std::string&)> fail, std::chrono::milliseconds period)
    : timeout_(timeout), period_(period), poll_(std::move(poll)), fail_(std::move(fail)) {
  thread_ = std::thread([this] { loop(); });
}

CollectiveWatchdog::~CollectiveWatchdog() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  stop_cv_.notify_all();
  thread_.join();
}

void CollectiveWatchdog::wait_begins(const std::string& what, std::optional<std::chrono::milliseconds> timeout) {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  current_timeout_ = timeout.value_or(timeout_);
  what_ = what;
  since_ = std::chrono::steady_clock::now();
}

void CollectiveWatchdog::wait_ends() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
}

void CollectiveWatchdog::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stop_cv_.wait_for(lock, period_, [this] { return stop_; })) {
    std::string failure;
    lock.unlock();
    if (std::optional<std::string> error = poll_()) failure = *error;
    lock.lock();
    if (failure.empty() && armed_ && std::chrono::steady_clock::now() - since_ > current_timeout_)
      failure = fmt::format("{} did not complete within the collective timeout of {:.1f} s", what_,
                            std::chrono::duration<double>(current_timeout_).count());
    if (!failure.empty()) {
      lock.unlock();
      fail_(failure);
      return;
    }
  }
}

}  // namespace lockstep

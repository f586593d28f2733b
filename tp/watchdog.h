// Ends the job when a collective cannot complete: a background thread polls
// the transport's asynchronous error and the deadline of the host's current
// wait on work that contains collectives. Collectives themselves stay
// stream-ordered with no events around them; the deadline covers the one host
// wait per step (for the sampled ids or logits).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

namespace lockstep {

class CollectiveWatchdog {
 public:
  // poll() returns a description of an asynchronous transport error, if any.
  // fail(message) must end the process (it is called at most once).
  CollectiveWatchdog(std::chrono::milliseconds timeout, std::function<std::optional<std::string>()> poll,
                     std::function<void(const std::string&)> fail,
                     std::chrono::milliseconds period = std::chrono::milliseconds(100));
  ~CollectiveWatchdog();
  CollectiveWatchdog(const CollectiveWatchdog&) = delete;
  CollectiveWatchdog& operator=(const CollectiveWatchdog&) = delete;

  // The host starts / stops waiting for work that includes collectives.
  // `timeout` overrides the default deadline for this wait (start-up
  // collectives wait for the slowest rank's loading, so they get longer).
  void wait_begins(const std::string& what, std::optional<std::chrono::milliseconds> timeout = std::nullopt);
  void wait_ends();

 private:
  void loop();

  std::chrono::milliseconds timeout_;
  std::chrono::milliseconds period_;
  std::function<std::optional<std::string>()> poll_;
  std::function<void(const std::string&)> fail_;
  std::mutex mutex_;
  std::condition_variable stop_cv_;
  bool stop_ = false;
  bool armed_ = false;
  std::string what_;
  std::chrono::steady_clock::time_point since_;
  std::chrono::milliseconds current_timeout_{0};
  std::thread thread_;
};

}  // namespace lockstep

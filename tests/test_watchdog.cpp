#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "tp/watchdog.h"

namespace lockstep {
namespace {

using namespace std::chrono_literals;

struct Recorder {
  std::atomic<bool> failed{false};
  std::string message;
  std::function<void(const std::string&)> fail() {
    return [this](const std::string& m) {
      message = m;
      failed = true;
    };
  }
};

TEST(Watchdog, AnArmedWaitPastItsDeadlineFailsNamingIt) {
  Recorder r;
  CollectiveWatchdog w(150ms, [] { return std::optional<std::string>(); }, r.fail(), 10ms);
  w.wait_begins("all-reduce of layer 3");
  for (int i = 0; i < 100 && !r.failed; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(r.failed);
  EXPECT_NE(r.message.find("all-reduce of layer 3"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("did not complete within the collective timeout"), std::string::npos) << r.message;
}

TEST(Watchdog, WaitsThatEndInTimeNeverFail) {
  Recorder r;
  CollectiveWatchdog w(200ms, [] { return std::optional<std::string>(); }, r.fail(), 5ms);
  for (int i = 0; i < 20; ++i) {
    w.wait_begins("step");
    std::this_thread::sleep_for(20ms);
    w.wait_ends();
  }
  std::this_thread::sleep_for(300ms);  // disarmed: no deadline runs
  EXPECT_FALSE(r.failed);
}

TEST(Watchdog, ATransportErrorFailsEvenWhenIdle) {
  Recorder r;
  std::atomic<bool> broken{false};
  CollectiveWatchdog w(10s, [&] { return broken ? std::optional<std::string>("peer gone") : std::nullopt; }, r.fail(),
                       5ms);
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(r.failed);
  broken = true;
  for (int i = 0; i < 100 && !r.failed; ++i) std::this_thread::sleep_for(10ms);
  ASSERT_TRUE(r.failed);
  EXPECT_EQ(r.message, "peer gone");
}

TEST(Watchdog, APerWaitTimeoutOverridesTheDefault) {
  Recorder r;
  CollectiveWatchdog w(50ms, [] { return std::optional<std::string>(); }, r.fail(), 5ms);
  w.wait_begins("loading", 10s);
  std::this_thread::sleep_for(200ms);
  EXPECT_FALSE(r.failed);
  w.wait_ends();
}

}  // namespace
}  // namespace lockstep

// The stop flag behind SIGINT/SIGTERM (train/signals.h): the first signal only requests a stop, a second one
// exits at once with 128+N.
#include "train/signals.h"

#include <gtest/gtest.h>
#include <signal.h>

namespace primus {
namespace {

class SignalsTest : public ::testing::Test {
 protected:
  void SetUp() override { clear_stop_request(); }
  void TearDown() override { clear_stop_request(); }
};

TEST_F(SignalsTest, FirstSignalSetsTheFlag) {
  install_stop_handlers();
  EXPECT_FALSE(stop_requested());
  EXPECT_EQ(stop_signal(), 0);
  ASSERT_EQ(raise(SIGTERM), 0);
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop_signal(), SIGTERM);
  clear_stop_request();
  ASSERT_EQ(raise(SIGINT), 0);
  EXPECT_EQ(stop_signal(), SIGINT);
}

TEST_F(SignalsTest, RequestStopKeepsTheFirstReason) {
  request_stop(SIGINT);
  request_stop(SIGTERM);
  EXPECT_TRUE(stop_requested());
  EXPECT_EQ(stop_signal(), SIGINT);
  clear_stop_request();
  EXPECT_FALSE(stop_requested());
}

TEST_F(SignalsTest, SecondSignalExitsAtOnceWith128PlusN) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        install_stop_handlers();
        raise(SIGINT);
        raise(SIGTERM);
      },
      ::testing::ExitedWithCode(128 + SIGTERM), "second stop signal");
  EXPECT_EXIT(
      {
        install_stop_handlers();
        request_stop(SIGTERM);
        raise(SIGINT);
      },
      ::testing::ExitedWithCode(128 + SIGINT), "");
}

}  // namespace
}  // namespace primus

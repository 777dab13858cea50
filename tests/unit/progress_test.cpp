// Progress bars (observe/progress.h) driven by a string stream and a fake clock: the line format (rates,
// ETA, bytes, a second counter), redraws on a terminal at most 10 times a second, plain lines at a bounded
// rate elsewhere, finishing and erasing, one bar on screen at a time, and log lines that erase the bar.
#include "observe/progress.h"

#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>
#include <spdlog/spdlog.h>

#include <sstream>

namespace primus {
namespace {

// A clock the test moves by hand.
struct FakeClock {
  double now = 100.0;
  std::function<double()> fn() {
    return [this] { return now; };
  }
};

ProgressOutput output_to(std::ostringstream& stream, FakeClock& clock, bool tty, int columns = 0) {
  return ProgressOutput{&stream, tty, columns, clock.fn()};
}

// What erasing a bar of `width` characters writes. (Built by appending: GCC 12 misreads "\r" + std::string(n, ' ')
// under -Wrestrict.)
std::string erased(size_t width) {
  std::string text(1, '\r');
  text.append(width, ' ');
  text.push_back('\r');
  return text;
}

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + what.size())) ++n;
  return n;
}

TEST(ProgressLine, CountsWithRateAndEta) {
  ProgressSpec spec{.label = "train", .total = 1000, .start = 100, .count_name = "steps"};
  // 200 steps in 40 s since the bar began (at step 100): 5 steps/s, 700 to go: 140 s.
  ProgressState state{.done = 300, .elapsed_s = 40.0};
  EXPECT_EQ(format_progress_line(spec, state, false), "train:  30.0% | 300/1000 steps | 5.00 steps/s | ETA 0:02:20");
  EXPECT_EQ(format_progress_line(spec, state, true),
            "train [######..............]  30.0% | 300/1000 steps | 5.00 steps/s | ETA 0:02:20");
  state.finished = true;
  state.done = 1000;
  state.elapsed_s = 3725.0;
  EXPECT_EQ(format_progress_line(spec, state, false), "train: 100.0% | 1000/1000 steps | 0.242 steps/s | in 1:02:05");
}

TEST(ProgressLine, BytesSecondCounterAndUnknownTotals) {
  ProgressSpec spec{
      .label = "preprocess", .total = 200'000'000, .unit = ProgressUnit::kBytes, .secondary_name = "docs"};
  ProgressState state{.done = 50'000'000, .secondary = 1000, .elapsed_s = 10.0};
  EXPECT_EQ(format_progress_line(spec, state, false),
            "preprocess:  25.0% | 50.0/200.0 MB | 5.0 MB/s | 1000 docs | 100 docs/s | ETA 0:00:30");
  spec.total = 3'000'000'000;
  state.done = 1'500'000'000;
  EXPECT_NE(format_progress_line(spec, state, false).find("1.50/3.00 GB | 150.0 MB/s"), std::string::npos);
  // Nothing done yet: no rate, so no ETA.
  EXPECT_NE(format_progress_line(spec, ProgressState{.done = 0, .elapsed_s = 1.0}, false).find("ETA --:--:--"),
            std::string::npos);
  // Unknown total: no percentage, bar or ETA.
  ProgressSpec open{.label = "read", .count_name = "files"};
  EXPECT_EQ(format_progress_line(open, ProgressState{.done = 12, .elapsed_s = 4.0}, true),
            "read 12 files | 3.00 files/s");
  EXPECT_EQ(format_duration(59.6), "0:01:00");
  EXPECT_EQ(format_duration(-1.0), "--:--:--");
  EXPECT_EQ(format_duration(1e9), "--:--:--");
}

TEST(ProgressBar, TerminalRedrawsInPlaceAtMostTenTimesASecond) {
  std::ostringstream out;
  FakeClock clock;
  {
    ProgressBar bar({.label = "work", .total = 10000, .count_name = "items"}, output_to(out, clock, true));
    for (int i = 1; i <= 10000; ++i) {  // 10,000 updates over 2 s
      clock.now += 0.0002;
      bar.update(i);
    }
    const std::string drawn = out.str();
    EXPECT_EQ(drawn.find('\n'), std::string::npos) << "a terminal bar stays on one line";
    EXPECT_GE(count(drawn, "\rwork ["), 19u);
    EXPECT_LE(count(drawn, "\rwork ["), 21u);  // the first draw at once, then every 0.1 s
    bar.finish();
  }
  const std::string all = out.str();
  EXPECT_EQ(count(all, "\n"), 1u);  // kept: the finished bar ends its line
  const std::string last = all.substr(all.rfind('\r') + 1);
  EXPECT_EQ(last, "work [####################] 100.0% | 10000/10000 items | 5000 items/s | in 0:00:02\n");
}

TEST(ProgressBar, TransientBarIsErasedAndCutToTheTerminalWidth) {
  std::ostringstream out;
  FakeClock clock;
  ProgressBar bar({.label = "checkpoint save", .total = 100, .unit = ProgressUnit::kBytes, .keep = false},
                  output_to(out, clock, true, 30));
  clock.now += 1.0;
  bar.update(40);
  EXPECT_EQ(out.str(), "\rcheckpoint save [########....");  // 29 characters: one less than the width
  bar.finish();
  EXPECT_EQ(out.str().substr(30), erased(29));
  bar.update(50);  // after finish: nothing
  EXPECT_EQ(out.str().size(), 30u + 31u);
}

TEST(ProgressBar, NotATerminalWritesWholeLinesAtABoundedRate) {
  std::ostringstream out;
  FakeClock clock;
  {
    ProgressBar bar({.label = "preprocess", .total = 96, .count_name = "batches", .line_interval_s = 5.0},
                    output_to(out, clock, false));
    for (int i = 1; i <= 96; ++i) {  // 12 s in steps of 1/8 s (exact in binary)
      clock.now += 0.125;
      bar.update(i);
    }
    bar.finish();
  }
  const std::string text = out.str();
  EXPECT_EQ(text.find('\r'), std::string::npos);
  EXPECT_EQ(count(text, "\n"), 3u) << text;  // at 5 s, at 10 s, and the closing line
  EXPECT_NE(text.find("preprocess:  41.7% | 40/96 batches | 8.00 batches/s | ETA 0:00:07\n"), std::string::npos)
      << text;
  EXPECT_NE(text.find("preprocess: 100.0% | 96/96 batches | 8.00 batches/s | in 0:00:12\n"), std::string::npos) << text;
}

TEST(ProgressBar, ReachingTheTotalLeavesTheLastLineToFinish) {
  std::ostringstream out;
  FakeClock clock;
  ProgressBar bar({.label = "checkpoint copy", .total = 30, .line_interval_s = 5.0, .keep = false},
                  output_to(out, clock, false));
  clock.now += 6.0;
  bar.update(10);  // due: a line
  clock.now += 6.0;
  bar.update(30);  // due, but complete: no "100.0% ... ETA 0:00:00" line before the closing one
  bar.finish();
  EXPECT_EQ(count(out.str(), "\n"), 2u) << out.str();
  EXPECT_EQ(out.str().find("ETA 0:00:00"), std::string::npos) << out.str();
  EXPECT_NE(out.str().find("checkpoint copy: 100.0% | 30/30 items | 2.50 items/s | in 0:00:12\n"), std::string::npos)
      << out.str();
}

TEST(ProgressBar, QuickTransientWorkStaysQuiet) {
  std::ostringstream out;
  FakeClock clock;
  for (bool tty : {false, true}) {
    ProgressBar bar({.label = "checkpoint load", .total = 10, .show_after_s = 0.5, .keep = false},
                    output_to(out, clock, tty));
    clock.now += 0.2;
    bar.update(5);
    clock.now += 0.2;
    bar.update(10);
    bar.finish();
  }
  EXPECT_EQ(out.str(), "");
  // Long work that wrote lines gets a closing line even when transient.
  ProgressBar slow({.label = "slow", .total = 10, .line_interval_s = 1.0, .keep = false}, output_to(out, clock, false));
  clock.now += 2.0;
  slow.update(5);
  clock.now += 0.5;
  slow.update(10);
  slow.finish();
  EXPECT_EQ(count(out.str(), "\n"), 2u) << out.str();
  EXPECT_NE(out.str().find("slow: 100.0%"), std::string::npos);
  // line_interval_s < 0: never a line (the trainer's bar, whose plain form is the log).
  std::ostringstream none;
  ProgressBar quiet({.label = "train", .total = 10, .line_interval_s = -1.0}, output_to(none, clock, false));
  clock.now += 100.0;
  quiet.update(5);
  quiet.finish();
  EXPECT_EQ(none.str(), "");
}

TEST(ProgressBar, ClearErasesAndTheNextUpdateRedrawsAtOnce) {
  std::ostringstream out;
  FakeClock clock;
  ProgressBar bar({.label = "x", .total = 4}, output_to(out, clock, true));
  bar.update(1);
  const size_t drawn = out.str().size();
  bar.clear();
  const std::string erase = out.str().substr(drawn);
  EXPECT_EQ(erase, erased(drawn - 1));
  clock.now += 0.01;  // well inside the redraw interval
  bar.update(2);
  EXPECT_NE(out.str().substr(drawn + erase.size()).find("\rx [##########..........]  50.0%"), std::string::npos);
}

TEST(ProgressBar, OneBarOnScreenAtATime) {
  std::ostringstream out;
  FakeClock clock;
  ProgressBar outer({.label = "train", .total = 10, .count_name = "steps"}, output_to(out, clock, true));
  outer.update(3);
  const size_t outer_width = out.str().size() - 1;
  {
    ProgressBar inner({.label = "checkpoint save", .total = 8, .unit = ProgressUnit::kBytes, .keep = false},
                      output_to(out, clock, true));
    inner.update(4);  // erases the training bar first
    const std::string text = out.str();
    const std::string erase = erased(outer_width);
    EXPECT_NE(text.find(erase + "\rcheckpoint save ["), std::string::npos) << text;
    inner.finish();
  }
  clock.now += 0.01;
  const size_t before = out.str().size();
  outer.update(4);  // back at once although the redraw interval has not passed
  EXPECT_NE(out.str().substr(before).find("\rtrain ["), std::string::npos);
}

TEST(ProgressBar, LogLinesEraseTheBarFirst) {
  std::ostringstream out;
  FakeClock clock;
  auto log_sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(out);
  log_sink->set_pattern("[%l] %v");
  spdlog::logger logger("progress-test", {make_progress_log_guard(), log_sink});
  ProgressBar bar({.label = "train", .total = 100, .count_name = "steps"}, output_to(out, clock, true));
  clock.now += 1.0;
  bar.update(10);
  const size_t width = out.str().size() - 1;
  logger.info("iteration 10 | loss 3.2");
  clock.now += 0.01;
  bar.update(11);
  const std::string text = out.str();
  const std::string erase = erased(width);
  EXPECT_NE(text.find(erase + "[info] iteration 10 | loss 3.2\n\rtrain ["), std::string::npos) << text;
  // Without a bar on screen the guard writes nothing.
  bar.clear();
  const size_t cleared = out.str().size();
  logger.info("plain");
  EXPECT_EQ(out.str().substr(cleared), "[info] plain\n");
}

TEST(ProgressBar, NoStreamNoOutputAndStandardErrorCanBeTurnedOff) {
  ProgressBar bar({.label = "x", .total = 3}, ProgressOutput{});
  bar.update(1);
  bar.finish();
  EXPECT_TRUE(bar.finished());
  ::setenv("PRIMUS_PROGRESS", "0", 1);
  EXPECT_EQ(ProgressOutput::standard_error().stream, nullptr);
  ::unsetenv("PRIMUS_PROGRESS");
  EXPECT_NE(ProgressOutput::standard_error().stream, nullptr);
}

}  // namespace
}  // namespace primus

// Progress bars with rate and ETA for long command-line work (preprocessing, checkpoint save and load,
// benchmarks, training between log lines).
//
// On a terminal the bar is one line redrawn in place with a carriage return, at most `redraw_interval_s`
// apart (10 times a second by default). Elsewhere (a pipe, a file, a Slurm log) it writes whole lines, at
// most one per `line_interval_s`, or none. The stream, the terminal flag and the clock are injected
// (ProgressOutput), so tests drive the bar with a string stream and a fake clock.
//
// Log lines and a bar share the terminal: a bar on screen must be erased before any other text is written
// to it, or the text lands on the bar's line. The spdlog sink from make_progress_log_guard(), placed before
// the console sink, does that for every log line; the bar comes back at its next update. One bar is on
// screen at a time: a bar that draws erases the one drawn before (a checkpoint bar inside the training bar).
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <memory>
#include <string>

namespace spdlog::sinks {
class sink;
}

namespace primus {

// Where progress goes. The default writes nothing.
struct ProgressOutput {
  std::ostream* stream = nullptr;   // null: no output at all
  bool tty = false;                 // a terminal: redraw one line in place; else whole lines
  int columns = 0;                  // terminal width; lines are cut to columns - 1 (0: unknown, no cut)
  std::function<double()> now_s{};  // monotonic seconds; empty: std::chrono::steady_clock

  // Standard error, which is a terminal when isatty(2) (then its width from TIOCGWINSZ). The environment
  // variable PRIMUS_PROGRESS=0 turns progress output off.
  static ProgressOutput standard_error();
};

enum class ProgressUnit { kCount, kBytes };

struct ProgressSpec {
  std::string label{};  // "checkpoint save", "train", "preprocess"
  int64_t total = 0;    // units of work; 0: unknown (no percentage, bar or ETA)
  int64_t start = 0;    // units done before this bar began (a resumed run): left out of the rate
  ProgressUnit unit = ProgressUnit::kCount;
  std::string count_name = "items";  // kCount: "12/100 steps | 3.10 steps/s"
  std::string secondary_name{};      // an optional second counter, e.g. "docs": "1000 docs | 100 docs/s"
  double redraw_interval_s = 0.1;    // terminal: least time between two redraws
  double line_interval_s = 5.0;      // not a terminal: least time between two lines; < 0: no lines at all
  double show_after_s = 0.0;         // draw nothing before this much time has passed (quick work stays quiet)
  // finish(): true leaves the finished bar on the terminal (or always writes a closing line elsewhere); false
  // erases it from the terminal and writes a closing line elsewhere only when earlier lines were written.
  bool keep = true;
};

// What one progress line shows.
struct ProgressState {
  int64_t done = 0;
  int64_t secondary = 0;
  double elapsed_s = 0.0;
  bool finished = false;  // the closing line: "in 0:01:02" instead of an ETA
};

// The line for `state`: with the bar on a terminal ("label [####....]  25.0% | ..."), else "label:  25.0% | ...".
// Rates are averages since the bar began; ETA = remaining units / rate.
std::string format_progress_line(const ProgressSpec& spec, const ProgressState& state, bool tty);
// h:mm:ss, or --:--:-- for a negative, infinite or absurd (> 99 h) time.
std::string format_duration(double seconds);

class ProgressBar {
 public:
  ProgressBar(ProgressSpec spec, ProgressOutput output);
  // Erases a bar still on the terminal (work abandoned by an exception); writes no closing line.
  ~ProgressBar();
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  void set_total(int64_t total);
  // Records progress and draws when due: at once after the bar was erased for other text, else rate-limited.
  // Reaching the total draws nothing: finish() draws the closing line.
  void update(int64_t done, int64_t secondary = 0);
  // The closing draw (see ProgressSpec::keep). Later updates and finishes do nothing.
  void finish();
  // Erases the bar from the terminal until the next update, so other text can be written.
  void clear();

  double elapsed_s() const;
  bool finished() const { return finished_; }

 private:
  friend void clear_progress_line();
  double now() const;
  void draw_locked(bool finishing);
  void erase_locked();
  void write_line_locked(const std::string& line);

  ProgressSpec spec_;
  ProgressOutput output_;
  double start_s_ = 0.0;
  double last_draw_s_ = 0.0;
  int64_t done_ = 0;
  int64_t secondary_ = 0;
  bool on_screen_ = false;     // terminal: the bar's line is drawn and not erased
  size_t drawn_width_ = 0;     // characters of the drawn line (to blank them when erasing)
  int64_t lines_written_ = 0;  // not a terminal: progress lines written
  bool finished_ = false;
};

// A spdlog sink that erases the progress bar on screen before each log line; put it first in the logger's
// sinks (before the console sink). It writes nothing itself.
std::shared_ptr<spdlog::sinks::sink> make_progress_log_guard();

// Erases whichever progress bar is on the terminal (what the log guard does), before writing other text.
void clear_progress_line();

}  // namespace primus

// Progress bars (see progress.h): line formatting, rate limiting, the one-bar-on-screen registry and the
// spdlog sink that erases the bar before log lines.
#include "observe/progress.h"

#include <fmt/format.h>
#include <spdlog/details/null_mutex.h>
#include <spdlog/sinks/base_sink.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <iostream>
#include <mutex>
#include <vector>

namespace primus {

namespace {

constexpr int kBarWidth = 20;

// Guards every write of every bar and the record of which bar is on screen: a log line from another thread
// erases the bar under the same lock the bar draws under.
std::mutex g_mutex;
ProgressBar* g_on_screen = nullptr;

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string amount_text(const ProgressSpec& spec, int64_t done) {
  if (spec.unit == ProgressUnit::kBytes) {
    const bool giga = std::max(done, spec.total) >= 1'000'000'000;
    const double scale = giga ? 1e9 : 1e6;
    const char* unit = giga ? "GB" : "MB";
    const int digits = giga ? 2 : 1;
    if (spec.total > 0) {
      return fmt::format("{:.{}f}/{:.{}f} {}", static_cast<double>(done) / scale, digits,
                         static_cast<double>(spec.total) / scale, digits, unit);
    }
    return fmt::format("{:.{}f} {}", static_cast<double>(done) / scale, digits, unit);
  }
  if (spec.total > 0) return fmt::format("{}/{} {}", done, spec.total, spec.count_name);
  return fmt::format("{} {}", done, spec.count_name);
}

std::string rate_text(const ProgressSpec& spec, double per_s) {
  if (spec.unit == ProgressUnit::kBytes) return fmt::format("{:.1f} MB/s", per_s / 1e6);
  const int digits = per_s >= 100.0 ? 0 : per_s >= 1.0 ? 2 : 3;
  return fmt::format("{:.{}f} {}/s", per_s, digits, spec.count_name);
}

}  // namespace

ProgressOutput ProgressOutput::standard_error() {
  ProgressOutput out;
  if (const char* env = std::getenv("PRIMUS_PROGRESS"); env != nullptr && std::string(env) == "0") return out;
  out.stream = &std::cerr;
  out.tty = ::isatty(STDERR_FILENO) == 1;
  if (out.tty) {
    winsize size{};
    if (::ioctl(STDERR_FILENO, TIOCGWINSZ, &size) == 0 && size.ws_col > 0) out.columns = size.ws_col;
  }
  return out;
}

std::string format_duration(double seconds) {
  if (!(seconds >= 0.0) || seconds > 359999.0) return "--:--:--";
  const int64_t s = static_cast<int64_t>(seconds + 0.5);
  return fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
}

std::string format_progress_line(const ProgressSpec& spec, const ProgressState& state, bool tty) {
  const double elapsed = std::max(state.elapsed_s, 1e-9);
  const bool known = spec.total > 0;
  const double fraction =
      known ? std::clamp(static_cast<double>(state.done) / static_cast<double>(spec.total), 0.0, 1.0) : 0.0;
  const double per_s = std::max(0.0, static_cast<double>(state.done - spec.start) / elapsed);
  std::vector<std::string> parts;
  if (known) parts.push_back(fmt::format("{:5.1f}%", 100.0 * fraction));
  parts.push_back(amount_text(spec, state.done));
  parts.push_back(rate_text(spec, per_s));
  if (!spec.secondary_name.empty()) {
    parts.push_back(fmt::format("{} {}", state.secondary, spec.secondary_name));
    parts.push_back(fmt::format("{:.0f} {}/s", static_cast<double>(state.secondary) / elapsed, spec.secondary_name));
  }
  if (state.finished) {
    parts.push_back("in " + format_duration(state.elapsed_s));
  } else if (known) {
    const double eta = per_s > 0.0 ? static_cast<double>(spec.total - state.done) / per_s : -1.0;
    parts.push_back("ETA " + format_duration(eta));
  }
  const std::string stats = fmt::format("{}", fmt::join(parts, " | "));
  if (!tty) return fmt::format("{}: {}", spec.label, stats);
  if (!known) return fmt::format("{} {}", spec.label, stats);
  const int filled = static_cast<int>(fraction * kBarWidth);
  return fmt::format("{} [{}{}] {}", spec.label, std::string(static_cast<size_t>(filled), '#'),
                     std::string(static_cast<size_t>(kBarWidth - filled), '.'), stats);
}

ProgressBar::ProgressBar(ProgressSpec spec, ProgressOutput output)
    : spec_(std::move(spec)), output_(std::move(output)), done_(spec_.start) {
  start_s_ = now();
  last_draw_s_ = start_s_;
}

ProgressBar::~ProgressBar() {
  std::lock_guard<std::mutex> lock(g_mutex);
  erase_locked();
  if (g_on_screen == this) g_on_screen = nullptr;
}

double ProgressBar::now() const { return output_.now_s ? output_.now_s() : steady_seconds(); }

double ProgressBar::elapsed_s() const { return now() - start_s_; }

void ProgressBar::set_total(int64_t total) {
  std::lock_guard<std::mutex> lock(g_mutex);
  spec_.total = total;
}

void ProgressBar::update(int64_t done, int64_t secondary) {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (finished_) return;
  done_ = done;
  secondary_ = secondary;
  if (output_.stream == nullptr) return;
  // Complete work is drawn by finish() (a closing line rather than a last progress line just before it).
  if (spec_.total > 0 && done >= spec_.total) return;
  const double t = now();
  if (t - start_s_ < spec_.show_after_s) return;
  if (output_.tty) {
    if (!on_screen_ || t - last_draw_s_ >= spec_.redraw_interval_s) draw_locked(false);
  } else if (spec_.line_interval_s >= 0.0 && t - last_draw_s_ >= spec_.line_interval_s) {
    draw_locked(false);
  }
}

void ProgressBar::finish() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (finished_) return;
  finished_ = true;
  if (output_.stream == nullptr) return;
  if (output_.tty) {
    if (!spec_.keep) {
      erase_locked();
      return;
    }
    draw_locked(true);
    *output_.stream << '\n';
    output_.stream->flush();
    on_screen_ = false;
    if (g_on_screen == this) g_on_screen = nullptr;
  } else if (spec_.line_interval_s >= 0.0 && (spec_.keep || lines_written_ > 0)) {
    draw_locked(true);
  }
}

void ProgressBar::clear() {
  std::lock_guard<std::mutex> lock(g_mutex);
  erase_locked();
}

void ProgressBar::draw_locked(bool finishing) {
  const double t = now();
  std::string line =
      format_progress_line(spec_, ProgressState{done_, secondary_, t - start_s_, finishing}, output_.tty);
  last_draw_s_ = t;
  if (!output_.tty) {
    *output_.stream << line << '\n';
    output_.stream->flush();
    ++lines_written_;
    return;
  }
  if (g_on_screen != nullptr && g_on_screen != this) g_on_screen->erase_locked();
  if (output_.columns > 1 && line.size() > static_cast<size_t>(output_.columns - 1)) {
    line.resize(static_cast<size_t>(output_.columns - 1));
  }
  // Blank what is left of a longer earlier line.
  const size_t pad = on_screen_ && drawn_width_ > line.size() ? drawn_width_ - line.size() : 0;
  *output_.stream << '\r' << line << std::string(pad, ' ');
  output_.stream->flush();
  drawn_width_ = line.size() + pad;
  on_screen_ = true;
  g_on_screen = this;
}

void ProgressBar::erase_locked() {
  if (!on_screen_) return;
  *output_.stream << '\r' << std::string(drawn_width_, ' ') << '\r';
  output_.stream->flush();
  on_screen_ = false;
  drawn_width_ = 0;
  if (g_on_screen == this) g_on_screen = nullptr;
}

void clear_progress_line() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_on_screen != nullptr) g_on_screen->erase_locked();
}

namespace {

class ProgressLogGuard : public spdlog::sinks::base_sink<spdlog::details::null_mutex> {
 protected:
  void sink_it_(const spdlog::details::log_msg&) override { clear_progress_line(); }
  void flush_() override {}
};

}  // namespace

std::shared_ptr<spdlog::sinks::sink> make_progress_log_guard() { return std::make_shared<ProgressLogGuard>(); }

}  // namespace primus

// Training jobs of the built primus-cli on CPU ranks over Gloo, for the end-to-end parallel tests: N processes
// started with torchrun's environment (as `primus-cli direct --nproc-per-node N` starts them) on one tiny Llama
// experiment (mock tokens, 20 steps, a metrics record every step, an evaluation at steps 10 and 20, a checkpoint at
// the end), and the comparison of a run with one rank's at the same global batch: losses, gradient norms and
// evaluation losses within relative 1e-5, and every parameter tensor after the run within 1e-5 (relative norm).
#pragma once

#include <map>
#include <string>
#include <utility>
#include <vector>

namespace primus::testing {

// A job: its workspace (the experiment is written there), overrides of the experiment, and its ranks.
struct Job {
  std::string workspace;
  std::vector<std::string> overrides;
  int ranks = 1;
};

// Writes the experiment into `dir` (dir/dp.yaml, its workspace dir) and returns its path.
std::string write_config(const std::string& dir);

// Starts `ranks` primus-cli processes and waits for all (at most two minutes); a failed rank fails the test with
// its output.
void run_job(const Job& job);

struct RunResult {
  std::vector<double> losses;
  std::vector<double> grad_norms;
  std::vector<double> eval_losses;
  // MoE models: each record's tokens per expert (then its dropped entries, with a capacity), layer after layer
  std::vector<std::vector<double>> moe_tokens;
  std::map<std::string, std::vector<float>> weights;
};

// The run of a workspace: its metrics and (through `checkpoint convert`) its final weights.
RunResult read_run(const std::string& workspace);

// `many` (a layout of several ranks) against `one` (one rank): see the top of this file. MoE models also route the
// same number of tokens to each expert in every step.
void expect_same_run(const RunResult& one, const RunResult& many, const std::string& layout);

// The largest ||a − b|| / ||a|| over the parameter tensors of two runs, and in `name` that tensor's name.
double largest_parameter_difference(const RunResult& one, const RunResult& many, std::string* name);

// a then b.
std::vector<std::string> with(std::vector<std::string> a, const std::vector<std::string>& b);

// One job on `ranks` ranks in a fresh workspace named after `label`, its run read back (empty after a fatal failure).
RunResult train(const std::string& label, int ranks, const std::vector<std::string>& overrides);

// A run of 10 steps of `shape` in `layout` on `ranks` ranks, then the same run directory resumed to 20 in each of
// `resumes` (ranks, layout; a copy per resume), each against the uninterrupted 20-step run of `shape` on one rank.
void expect_resumes(const std::string& label, const std::vector<std::string>& shape, int ranks,
                    const std::vector<std::string>& layout,
                    const std::vector<std::pair<int, std::vector<std::string>>>& resumes);

}  // namespace primus::testing

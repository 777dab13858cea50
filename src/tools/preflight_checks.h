// The check families of preflight.h, one file each: host and network (preflight_host.cpp), GPU inventory and
// the device's GEMM and copy (preflight_device.cpp). preflight.cpp runs them, gathers and reports.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "tools/preflight.h"

namespace primus::preflight {

using Checks = std::vector<PreflightCheck>;

// Runs body, which appends to `out`; an exception becomes one failed check "<group>/<name>" naming it.
void guarded(Checks& out, const std::string& group, const std::string& name, const std::function<void()>& body);
PreflightCheck make_check(const std::string& group, const std::string& name, CheckStatus status, std::string value,
                          std::string detail = "");

// CPU, memory, NUMA, kernel, limits, free disk under options.workspace.
void add_host_checks(const PreflightOptions& options, Checks& out);
// NCCL_SOCKET_IFNAME against the interfaces that exist, NCCL_IB_HCA against /sys/class/infiniband.
void add_network_checks(Checks& out);
// Visible GPUs (count against options.expected_gpus), each one's model, free memory and processes, and the
// driver, runtime, NCCL and cuDNN versions; "no GPU" as info (or a failure when GPUs were expected).
void add_gpu_inventory_checks(const PreflightOptions& options, Checks& out);
// The GEMM and copy of `device` against the thresholds (options, else the detected GPU's).
void add_device_perf_checks(const PreflightOptions& options, Device device, Checks& out);

// Lines of text of a file ("" when unreadable); the value after "key:" in such lines.
std::string read_file_text(const std::string& path);
std::string format_gib(double bytes);

}  // namespace primus::preflight

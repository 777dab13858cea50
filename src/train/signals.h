// Cooperative stop on SIGINT/SIGTERM. The first signal only sets a flag that the training loop polls between
// steps (it then saves a checkpoint and returns 128+N); a second signal exits at once with 128+N, for a user
// who does not want to wait for the checkpoint.
#pragma once

namespace primus {

// Installs the SIGINT and SIGTERM handlers. Idempotent; call once before training starts.
void install_stop_handlers();

// True once a stop was requested (by a signal or request_stop). Async-signal-safe, cheap enough to poll per step.
bool stop_requested();

// The signal number that requested the stop (SIGINT, SIGTERM, or the value given to request_stop); 0 when none.
int stop_signal();

// Requests a stop as if `signal_number` had arrived once (time budgets, tests). A later real signal then exits.
void request_stop(int signal_number);

// Forgets a pending stop request (tests, or a caller that handled it and keeps running).
void clear_stop_request();

}  // namespace primus

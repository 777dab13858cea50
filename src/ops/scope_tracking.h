// Whether ProfileScope keeps the names of the scopes open on each thread (ops::open_scopes in profile.h). Off by
// default, so a step's thousands of scopes cost no string copies; the memory-peak trace turns it on, once, before
// any scope opens, and it stays on.
#pragma once

namespace primus::ops {

void track_open_scopes();

}  // namespace primus::ops

// Progress bars for checkpoint saves and loads: the checkpoint layer reports bytes (checkpoint.h's
// CheckpointProgress), this draws them with observe/progress.h, one bar per phase ("checkpoint copy",
// "checkpoint save", "checkpoint verify", "checkpoint load"). The bars wait half a second before they appear and leave
// the terminal when done, so small checkpoints stay quiet; elsewhere a line every 5 s while one takes long.
#pragma once

#include "checkpoint/checkpoint.h"
#include "observe/progress.h"

namespace primus {

// A callback for save_checkpoint / load_checkpoint that draws on `output` (nothing when it has no stream).
CheckpointProgressFn checkpoint_progress_bars(ProgressOutput output);

}  // namespace primus

// Compiled as if it were a file of src/ops (with primus_ops's include roots): src/ops may not use src/train, so
// this include must fail to compile (tests/CMakeLists.txt: LayeringWrongIncludeFailsToCompile).
#include "train/pretrain.h"

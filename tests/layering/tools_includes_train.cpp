// Compiled as if it were a file of src/tools (models, parallel, backend and what they use): src/train is not among
// them, so this include must fail to compile (tests/CMakeLists.txt: LayeringWrongIncludeFailsToCompile).
#include "parallel/comm_benchmark.h"
#include "train/benchmark.h"

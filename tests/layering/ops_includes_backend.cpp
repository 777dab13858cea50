// Compiled as if it were a file of src/ops: the headers of the layers src/ops may use (its own, backend, core) are
// there (tests/CMakeLists.txt: LayeringAllowedIncludesCompile), the control for LayeringWrongIncludeFailsToCompile.
#include "backend/backend.h"
#include "core/tensor.h"
#include "ops/ops.h"

// The NCCL communicator: the Communicator seam (ops/communicator.h) for ranks on CUDA devices, one
// device per rank. RCCL on AMD has the same API, so a HIP build swaps the header only.
//
// Collectives are enqueued on the stream given (the null handle: the CUDA backend's compute stream) and
// return without waiting for the GPU. A buffer used on any other stream is declared to the caching allocator
// (Backend::record_stream), so freeing it early cannot hand its memory to compute work while the
// collective still reads or writes it.
//
// Timeouts. The communicator is created non-blocking (NCCL's blocking = 0): NCCL then never blocks the
// calling thread, and every host wait here polls with a deadline of `timeout`: the rendezvous on the store,
// the creation (every rank must join), split, a call that NCCL finishes in the background (connection setup
// on first use) and barrier(). A wait that passes its deadline aborts the communicator (ncclCommAbort) and
// throws RuntimeError naming the call and the rank; later calls throw at once. A collective enqueued on a
// stream whose peers never arrive is not watched (no watchdog thread yet): the host notices at its next wait
// on that stream, and barrier() is the wait with a deadline.
//
// NVLink multicast (NVLS) is turned off (NCCL_NVLS_ENABLE=0) unless the user set the variable: it must stay
// off on our machines.
#pragma once

#include <memory>

#include "core/dtype.h"
#include "ops/communicator.h"
#include "parallel/store.h"

namespace primus {

// Rank `rank` of `size` on CUDA device `device` (its backend is started if need be). Rank 0 creates NCCL's
// unique id and sets it in `store`; the others wait for it (at most `timeout`, failing with the key's name).
// Every rank of the job calls it, in the same order relative to its other calls.
std::unique_ptr<Communicator> make_nccl_communicator(int rank, int size, Store& store, Device device,
                                                     DistributedTimeout timeout);

}  // namespace primus

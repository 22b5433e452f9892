// NcclCommunicator: the Communicator over NCCL, for buffers in device memory, one GPU per rank.
//
// It is bootstrapped over a host communicator (MPI): rank 0 makes NCCL's unique id and the others
// receive it through the host communicator's broadcast (nccl_unique_id). Its collectives run on a
// stream of its own: each waits for an event recorded on the caller's stream (Stream; none: the
// data is ready now) and records one when it is done, so communication overlaps the caller's
// kernels. Work::wait blocks the host until then; Work::wait_on orders a stream after it instead.
//
//   auto mpi = make_communicator(options);                       // the ranks, over MPI
//   auto nccl = make_nccl_communicator(*mpi, mpi->local_rank(), options);
//   Work w = nccl->reduce_scatter(grads, shard, count, DType::bf16, Reduction::overwrite,
//                                 "reduce-scatter of unit h.3's gradients", Stream{compute_stream});
//   w.wait_on(Stream{compute_stream});   // the update's kernels run after it, the host goes on
//
// Reductions keep the Communicator's promise, the same bits at every world size: reduce_scatter
// is an all-to-all (every rank's chunk r to rank r, grouped sends and receives) followed by a sum
// in rank order on the device, each addition rounded to the type (optim/device_update.h's
// accumulate_gradients, the host add_into's arithmetic). It moves what a ring reduce-scatter moves,
// (world - 1) / world of the buffer per rank, in one step instead of world - 1.
//
// Failure: an operation not complete within the timeout, or one NCCL reports failed (its
// asynchronous error query), aborts the NCCL communicator and throws CommunicationError naming
// this rank and the operation. The NCCL communicator is non-blocking (config.blocking = 0), so
// that its initialisation and a collective's connection to its peers, which NCCL makes on first
// use, never hold the host past the timeout either. Unlike the MPI communicator's, the message
// cannot name the peers that did not arrive (NCCL does not say which): it says a peer did not.
//
// A build without NCCL links a stub whose every entry point throws UserError saying why.
#pragma once

#include <memory>
#include <string>

#include "dist/communicator.h"

namespace engine {

// NCCL's unique id (128 opaque bytes), made by rank 0 and broadcast over `bootstrap`: every rank
// returns the same bytes. Needs no GPU.
std::string nccl_unique_id(Communicator& bootstrap);

// The NCCL communicator of `bootstrap`'s ranks, on CUDA device `device` (a collective: every rank
// calls it). UserError without NCCL in the build or without that device.
std::unique_ptr<Communicator> make_nccl_communicator(Communicator& bootstrap, int device,
                                                     const CommunicatorOptions& options);

}  // namespace engine

// The MPI communicator: the ranks an MPI launcher (mpirun, srun) started, over host memory.
//
// Every MPI call of the job's collectives runs on one communication thread that takes operations
// from a FIFO in submission order, so the caller's compute overlaps the transfers; wait() only
// waits for that thread. Collectives are built from point-to-point messages (never MPI_SUM, whose
// order depends on the algorithm MPI picks): reduce_scatter gathers every rank's chunk and adds
// them in rank order with add_into, all_reduce is reduce_scatter then all_gather. The thread polls
// with MPI_Test and a growing sleep (20 us to 1 ms), so a waiting rank leaves its core to compute.
//
// Timeout: an operation not complete within CommunicatorOptions::timeout_seconds of its start
// asks every peer, on a separate control communicator, which operation it has reached. Peers
// answer from their communication threads at once; those that stay silent for a short grace
// period (5% of the timeout, 3 s at most) are stopped, hung or dead. wait() then throws
// CommunicationError naming them, and the communicator refuses every later operation. The top
// level ends the job with abort_job() (MPI_Abort). A communicator destroyed after a failure skips
// MPI_Finalize, which would wait for the missing peers; the launcher then ends the job itself.
//
// Process groups (split): MPI_Comm_split of both communicators, run on the communication thread;
// each group has its own thread, FIFO and timeout, so MPI must offer MPI_THREAD_MULTIPLE. A group's
// messages name its peers by world rank and say which group. Destroy the groups before the world
// communicator (it finalises MPI).
#pragma once

#include <memory>

#include "dist/communicator.h"

namespace engine {

// Initialises MPI (MPI_THREAD_MULTIPLE; SERIALIZED at least) unless it already is, and finalises
// it when the communicator goes, if it initialised it.
std::unique_ptr<Communicator> make_mpi_communicator(const CommunicatorOptions& options);

}  // namespace engine

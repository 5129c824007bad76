// The in-process Communicator (communicator.h): n ranks that are threads of one process and
// exchange host memory through a shared group object. What tensor-parallel code runs on the CPU
// backends (tests, CI) and what an NCCL communicator is checked against.
//
// Each collective is two group barriers (mutex + condition variable, no spinning): ranks post
// their buffers and meet; each rank then reduces (all_reduce_sum: its 1/n of the elements, in rank
// order, into a group scratch buffer) or copies (all_gather); they meet again, and all_reduce_sum
// copies the reduced elements back. The last rank to reach the first barrier checks that all ranks
// called the same collective with the same count and dtype, and aborts naming the calls if not.
// A rank that waits longer than `wait_limit` at a barrier aborts with a message naming the
// collective, its sequence number and how many ranks arrived (a hang is worse than a crash).
#pragma once
#include <chrono>
#include <memory>
#include <vector>

#include "parallel/communicator.h"

namespace g4 {

// n >= 1 communicators of one group; element r has rank r. Each is used by one thread at a time
// (its rank's); the group lives until the last of them is destroyed.
std::vector<std::unique_ptr<Communicator>> make_inproc_group(
    int n, std::chrono::milliseconds wait_limit = std::chrono::seconds(60));

}  // namespace g4

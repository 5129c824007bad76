// Observers of the CUDA backend's work: profiling (device time per launch kind, around launches
// that run one by one) and step timing (host and device time per forward step). The backend calls
// them at fixed points; neither changes what runs, only how it is measured.
#pragma once
#include <cuda_runtime.h>

#include <memory>
#include <string>

namespace g4::cuda {

// Wraps each launch that runs directly. While one is attached, steps run op by op (no graphs).
class LaunchObserver {
 public:
  virtual ~LaunchObserver() = default;
  // `label`: the launch's name, with shapes where the backend gives them (matmuls).
  virtual void before(const std::string& label, cudaStream_t s) = 0;
  virtual void after(cudaStream_t s) = 0;
};
// BackendOptions::profile: device time per label between two events; at destruction stderr gets
// the table, largest first. The events themselves add launch gaps: totals exceed a plain run's.
std::unique_ptr<LaunchObserver> make_op_profile();

// Sees each step's phases (backend.h begin_step / end_step, and the read of its outputs).
class StepObserver {
 public:
  virtual ~StepObserver() = default;
  virtual void step_begin() {}
  virtual void step_logged(cudaStream_t) {}    // every op logged, before the step is launched
  virtual void step_launched(cudaStream_t) {}  // after the graph (or direct launches) went out
  virtual void output_read() {}                // a device-to-host read came back (the logits)
};
// BackendOptions::timing: at destruction stderr gets the medians per step of the host time
// logging ops, in end_step, waiting for the outputs, between steps, and the step's device time.
std::unique_ptr<StepObserver> make_step_timer();

}  // namespace g4::cuda

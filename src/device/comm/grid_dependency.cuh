#pragma once
// Programmatic dependent launch (sm_90): a kernel launched with LaunchShape::starts_early may begin
// while the kernel before it on the stream still runs, once every CTA of that one has called
// allow_dependent_launch() (or exited). Before it reads anything that kernel writes it calls
// wait_for_previous_grid(), which returns once that kernel has completed and its writes are
// visible to this grid. Both are no-ops in a kernel launched without the attribute, or with
// nothing in flight before it.
namespace caracal::comm {

// Every thread of a CTA of the earlier kernel (one that does not call it triggers at its exit).
__device__ inline void allow_dependent_launch() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// Any thread of the later kernel, before its first read of the earlier one's output.
__device__ inline void wait_for_previous_grid() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

}  // namespace caracal::comm

#pragma once
// The arguments every exchange kernel takes (plain data, host and device): the standalone
// launchers (src/transfer/exchange_launch.hpp) fill them, the device blocks and the fused kernels
// read them.
#include "caracal/transfer/exchange_buffers.hpp"
#include "device/transfer/device_params.hpp"

namespace caracal::transfer::detail {

// Everything an exchange kernel reads, for every rank (buffers resolved per rank on the device).
struct ExchangeArgs {
  int tokens = 0;
  int top_k = 0;
  int hidden = 0;
  int num_experts = 0;
  ScheduleParams schedule;
  RouterBuffers router;
  ForwardBuffers forward;
  BackwardBuffers backward;
  RouterScaling scaling;    // build_schedule (the gates), combine and reverse_dispatch (per call)
  bool has_shared = false;  // shared_out (combine) and shared_dx (reverse dispatch) are inputs
  bool rows_per_route = false;          // ExchangeOptions::rows_per_route
  CombinePush combine;                  // combine's push (per call)
  PullWindow window;                    // the rows dispatch and reverse combine pull (per call)
  // Reverse dispatch (per call): the dx slots of tokens on other ranks hold a sum per (token, rank,
  // window of this many rows), led by the group's highest row (DxSlots::kPerTokenRank); -1: a row
  // per route.
  int dx_group_rows = -1;
  // dispatch_fp8 (ExchangeOptions::fp8_dispatch): the scale of a zero block, a padding row's, and
  // the home scales' stride (ExchangeSizes::home_rows).
  float fp8_zero_scale = 0.0f;
  int fp8_home_rows = 0;
};

}  // namespace caracal::transfer::detail

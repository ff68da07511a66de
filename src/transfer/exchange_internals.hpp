#pragma once
// What the fused kernels (src/fused) read of a TokenExchange beyond its public API: the arguments
// its kernels take, so that they run the exchange's device blocks beside the GEMMs'.
#include "caracal/transfer/token_exchange.hpp"
#include "device/transfer/exchange_args.hpp"

namespace caracal::transfer {

struct ExchangeInternals {
  // What the exchange's kernels read (scaling and windows filled in per call).
  static const detail::ExchangeArgs& kernel_args(const TokenExchange& exchange);
  // reverse_dispatch_filled_dx_slots's arguments (checked), for a kernel that runs those sums itself.
  static detail::ExchangeArgs filled_dx_slots_args(const TokenExchange& exchange, const RouterNormalization& router,
                                                   DxSlots slots);
};

}  // namespace caracal::transfer

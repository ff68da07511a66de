// `caracal bench`'s host side without a GPU: the one mapping of its command line to the layers'
// MoELayerOptions.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "layer_options.hpp"

namespace caracal::bench_tool {
namespace {

// ---- The layers' options -----------------------------------------------------------------------

TEST(BenchLayerOptions, EveryFlagReachesItsOption) {
  BenchOptions a;
  a.exchange_sms = 20;
  a.fused_comm_ctas = 3;
  a.fused_pull_all_rows = true;
  a.separate_backward = true;
  a.separate_dx_sums = true;
  a.local_rows_before_backward = true;
  a.rows_per_route = true;
  a.dx_rows_per_route = true;
  a.ring_rows = 256;
  a.bf16_weight_grads = true;
  const MoELayerOptions o = layer_options(a, true);
  EXPECT_EQ(o.exchange_sms, 20);
  EXPECT_TRUE(o.fused_forward);
  EXPECT_EQ(o.fused_comm_ctas, 3);
  EXPECT_TRUE(o.fused_pull_all_rows);
  EXPECT_FALSE(o.fused_backward);
  EXPECT_FALSE(o.dx_sums_in_weight_grads);
  EXPECT_FALSE(o.fused_backward_local_rows_in_launch);
  EXPECT_TRUE(o.rows_per_route);
  EXPECT_TRUE(o.dx_rows_per_route);
  EXPECT_EQ(o.ring_rows, 256);
  EXPECT_TRUE(o.bf16_weight_gradients);
  EXPECT_FALSE(layer_options(a, false).fused_forward);
}

TEST(BenchLayerOptions, DefaultsAreTheLayersButTheGradientPrecision) {
  const BenchOptions a;
  nlohmann::json got = options_json(layer_options(a, true));
  MoELayerOptions layer;
  layer.bf16_weight_gradients = false;  // fp32 weight gradients unless --bf16-weight-grads
  EXPECT_EQ(got, options_json(layer));
  // v1's options differ from the fused layer's in fused_forward alone.
  nlohmann::json v1 = options_json(layer_options(a, false));
  EXPECT_FALSE(v1.at("fused_forward").get<bool>());
  v1["fused_forward"] = true;
  EXPECT_EQ(v1, got);
}

}  // namespace
}  // namespace caracal::bench_tool

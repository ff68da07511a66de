#include <gtest/gtest.h>

#include <string>

#include "caracal/error.hpp"
#include "caracal/layer_config.hpp"

namespace caracal {
namespace {

LayerConfig valid_config() {
  LayerConfig c;
  c.shape = LayerShape{7168, 2048, 256, 8, 1, 2048};
  c.ep_size = 8;
  c.tokens_per_rank = 4096;
  return c;
}

// Expects validate() to throw an Error whose message contains every fragment.
void expect_rejected(const LayerConfig& c, std::initializer_list<const char*> fragments) {
  try {
    c.validate();
    FAIL() << "validate() accepted an invalid config";
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const char* f : fragments) EXPECT_NE(msg.find(f), std::string::npos) << "message: " << msg;
  }
}

TEST(LayerConfig, AcceptsDeepSeekV3AtEp8) {
  const LayerConfig c = valid_config();
  EXPECT_NO_THROW(c.validate());
  EXPECT_EQ(c.local_experts(), 32);
}

TEST(LayerConfig, ForwardFlopsFollowDesignFormula) {
  const LayerShape s{7168, 2048, 256, 8, 1, 2048};
  const double t = 4096;
  EXPECT_DOUBLE_EQ(s.forward_flops(4096), 6 * t * 8 * 7168 * 2048 + 6 * t * 7168 * 2048);
}

TEST(LayerConfig, RejectsExpertsNotDivisibleByEp) {
  LayerConfig c = valid_config();
  c.ep_size = 3;
  expect_rejected(c, {"num_experts", "divisible", "ep_size", "3"});
}

TEST(LayerConfig, RejectsTopKAboveExperts) {
  LayerConfig c = valid_config();
  c.shape.top_k = 257;
  expect_rejected(c, {"top_k", "257", "num_experts=256"});
  c.shape.top_k = 0;
  expect_rejected(c, {"top_k"});
}

TEST(LayerConfig, RejectsMisalignedDimensionsPerPrecision) {
  LayerConfig c = valid_config();
  c.shape.hidden = 7168 + 32;
  expect_rejected(c, {"hidden", "multiple of 64", "bf16", "7200"});
  c = valid_config();
  c.shape.intermediate = 2880;  // a multiple of 64 but not of 128
  EXPECT_NO_THROW(c.validate());
  c.precision = Precision::kFP8;
  expect_rejected(c, {"intermediate", "multiple of 128", "fp8", "2880"});
  c = valid_config();
  c.shape.shared_intermediate = 100;
  expect_rejected(c, {"shared_intermediate", "multiple of 64"});
}

TEST(LayerConfig, RejectsInconsistentSharedExpert) {
  LayerConfig c = valid_config();
  c.shape.num_shared_experts = 2;
  expect_rejected(c, {"num_shared_experts", "0 or 1"});
  c.shape.num_shared_experts = 0;
  expect_rejected(c, {"shared_intermediate", "must be 0"});
  c.shape.shared_intermediate = 0;
  EXPECT_NO_THROW(c.validate());
}

TEST(LayerConfig, RejectsNonPositiveSizes) {
  LayerConfig c = valid_config();
  c.tokens_per_rank = 0;
  expect_rejected(c, {"tokens_per_rank", "at least 1"});
  c = valid_config();
  c.ep_size = 0;
  expect_rejected(c, {"ep_size"});
  c = valid_config();
  c.shape.hidden = -64;
  expect_rejected(c, {"hidden must be in [1, 65536], got -64"});
}

TEST(LayerConfig, RejectsSizesPastTheirBounds) {
  LayerConfig c = valid_config();
  c.shape.hidden = c.shape.intermediate = c.shape.shared_intermediate = 65536;
  c.shape.num_experts = 65536;
  EXPECT_NO_THROW(c.validate());
  c = valid_config();
  c.shape.hidden = int64_t{1} << 62;  // a multiple of 64
  expect_rejected(c, {"hidden must be in [1, 65536], got 4611686018427387904"});
  c = valid_config();
  c.shape.intermediate = 65536 + 64;
  expect_rejected(c, {"intermediate must be in [1, 65536], got 65600"});
  c = valid_config();
  c.shape.shared_intermediate = int64_t{1} << 40;
  expect_rejected(c, {"shared_intermediate must be in [1, 65536], got 1099511627776"});
  c = valid_config();
  c.shape.num_experts = int64_t{1} << 62;
  expect_rejected(c, {"num_experts must be in [1, 65536], got 4611686018427387904"});
}

TEST(LayerConfig, RejectsRouteCountsBeyond32Bits) {
  LayerConfig c = valid_config();
  c.shape.num_experts = 64 * 8;
  c.ep_size = 64;
  c.tokens_per_rank = 1 << 22;
  expect_rejected(c, {"2^31"});
  c = valid_config();
  c.tokens_per_rank = 9223372036854775807;  // the product would overflow int64 (and double -> int64)
  expect_rejected(c, {"must be below 2^31 (32-bit route indices), got 8 * 9223372036854775807 * 8"});
}

TEST(LayerConfig, RejectsBadRouterScale) {
  LayerConfig c = valid_config();
  c.router.scale = 0;
  expect_rejected(c, {"router.scale"});
}

TEST(LayerConfig, ParsesPrecision) {
  EXPECT_EQ(parse_precision("bf16"), Precision::kBF16);
  EXPECT_EQ(parse_precision("fp8"), Precision::kFP8);
  EXPECT_THROW(parse_precision("fp16"), Error);
}

}  // namespace
}  // namespace caracal

#include <gtest/gtest.h>

#include <set>

#include "caracal/error.hpp"
#include "caracal/presets.hpp"

namespace caracal {
namespace {

TEST(Presets, EveryDesignModelIsPresentAndValidAtEp8) {
  const std::set<std::string> expected = {"deepseek-v3", "kimi-k2",         "glm-5",        "qwen3.5-397b",
                                          "qwen3-235b",  "qwen3-30b-a3b",   "deepseek-v4-pro", "gpt-oss-120b"};
  std::set<std::string> names;
  for (const ModelPreset& p : model_presets()) {
    names.insert(p.name);
    LayerConfig c;
    c.shape = p.shape;
    c.router = p.router;
    c.ep_size = 8;
    c.tokens_per_rank = 4096;
    EXPECT_NO_THROW(c.validate()) << p.name;
  }
  EXPECT_EQ(names, expected);
}

TEST(Presets, ShapesMatchDesignTable) {
  const LayerShape& ds = find_model_preset("deepseek-v3").shape;
  EXPECT_EQ(ds.hidden, 7168);
  EXPECT_EQ(ds.intermediate, 2048);
  EXPECT_EQ(ds.num_experts, 256);
  EXPECT_EQ(ds.top_k, 8);
  EXPECT_EQ(ds.num_shared_experts, 1);
  EXPECT_EQ(ds.shared_intermediate, 2048);
  const ModelPreset& qwen = find_model_preset("qwen3.5-397b");
  EXPECT_EQ(qwen.shape.num_experts, 512);
  EXPECT_EQ(qwen.shape.top_k, 10);
  EXPECT_TRUE(qwen.shared_output_gate);
  const LayerShape& oss = find_model_preset("gpt-oss-120b").shape;
  EXPECT_EQ(oss.hidden, 2880);
  EXPECT_EQ(oss.num_shared_experts, 0);
  const ModelPreset& a3b = find_model_preset("qwen3-30b-a3b");
  EXPECT_EQ(a3b.shape.hidden, 2048);
  EXPECT_EQ(a3b.shape.intermediate, 768);
  EXPECT_EQ(a3b.shape.num_experts, 128);
  EXPECT_EQ(a3b.shape.top_k, 8);
  EXPECT_EQ(a3b.shape.num_shared_experts, 0);
  EXPECT_TRUE(a3b.router.normalize);
  EXPECT_EQ(a3b.router.scale, 1.0);
  EXPECT_EQ(find_model_preset("kimi-k2").shape.num_experts, 384);
  EXPECT_EQ(find_model_preset("deepseek-v4-pro").shape.top_k, 6);
}

// gpt-oss's experts (biases, clamped SwiGLU) are not the layer's: its preset says why; every
// other preset's experts are the plain SwiGLU the layer runs.
TEST(Presets, OnlyGptOssIsMarkedUnsupportedAndSaysWhy) {
  for (const ModelPreset& p : model_presets()) {
    if (p.name != "gpt-oss-120b") {
      EXPECT_EQ(p.unsupported, "") << p.name;
      continue;
    }
    EXPECT_NE(p.unsupported.find("biases"), std::string::npos) << p.unsupported;
    EXPECT_NE(p.unsupported.find("clamped SwiGLU"), std::string::npos) << p.unsupported;
    EXPECT_NE(p.unsupported.find("1.702"), std::string::npos) << p.unsupported;
  }
}

TEST(Presets, UnknownNameListsTheKnownOnes) {
  try {
    find_model_preset("deepseek-v2");
    FAIL();
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("deepseek-v2"), std::string::npos);
    EXPECT_NE(msg.find("kimi-k2"), std::string::npos);
  }
}

}  // namespace
}  // namespace caracal

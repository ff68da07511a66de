#include "caracal/presets.hpp"

#include "caracal/error.hpp"

namespace caracal {

namespace {
ModelPreset preset(std::string name, std::string description, int64_t hidden,
                   int64_t intermediate, int64_t experts, int64_t top_k, int64_t shared_i,
                   RouterNormalization router, bool shared_gate = false, std::string unsupported = "") {
  ModelPreset p;
  p.name = std::move(name);
  p.description = std::move(description);
  p.shape = LayerShape{hidden, intermediate, experts, top_k, shared_i > 0 ? 1 : 0, shared_i};
  p.router = router;
  p.shared_output_gate = shared_gate;
  p.unsupported = std::move(unsupported);
  return p;
}
}  // namespace

const std::vector<ModelPreset>& model_presets() {
  // Shapes: DESIGN §1 table. Router settings: the models' published config.json
  // (norm_topk_prob, routed_scaling_factor) where noted.
  static const std::vector<ModelPreset> presets = {
      // deepseek-ai/DeepSeek-V3 config.json: hidden_size 7168, moe_intermediate_size 2048,
      // n_routed_experts 256, num_experts_per_tok 8, n_shared_experts 1, norm_topk_prob true,
      // routed_scaling_factor 2.5. DeepSeek-R1 shares the architecture.
      preset("deepseek-v3", "DeepSeek-V3 / R1", 7168, 2048, 256, 8, 2048, {true, 2.5}),
      // moonshotai/Kimi-K2 config.json: DeepSeek-V3 architecture with 384 routed experts,
      // norm_topk_prob true, routed_scaling_factor 2.827.
      preset("kimi-k2", "Kimi K2", 7168, 2048, 384, 8, 2048, {true, 2.827}),
      // GLM-5: shape from DESIGN §1; router settings taken from GLM-4.5's config
      // (norm_topk_prob true, routed_scaling_factor 2.5) -- check against the release.
      preset("glm-5", "GLM-5", 6144, 2048, 256, 8, 2048, {true, 2.5}),
      // Qwen3.5-397B-A17B: 512 experts, top-10, one shared expert (I=1024) whose output the
      // framework scales by a per-token sigmoid gate; norm_topk_prob true.
      preset("qwen3.5-397b", "Qwen3.5-397B-A17B", 4096, 1024, 512, 10, 1024, {true, 1.0}, true),
      // Qwen/Qwen3-235B-A22B config.json: hidden_size 4096, moe_intermediate_size 1536,
      // num_experts 128, num_experts_per_tok 8, no shared expert, norm_topk_prob true.
      preset("qwen3-235b", "Qwen3-235B-A22B", 4096, 1536, 128, 8, 0, {true, 1.0}),
      // Qwen/Qwen3-30B-A3B config.json: hidden_size 2048, moe_intermediate_size 768,
      // num_experts 128, num_experts_per_tok 8, no shared expert, norm_topk_prob true (softmax
      // over all experts, the top-8 renormalized: transformers' Qwen3MoeSparseMoeBlock).
      preset("qwen3-30b-a3b", "Qwen3-30B-A3B", 2048, 768, 128, 8, 0, {true, 1.0}),
      // DeepSeek-V4-Pro: shape from DESIGN §1; router settings assumed as DeepSeek-V3's.
      preset("deepseek-v4-pro", "DeepSeek-V4-Pro", 7168, 3072, 384, 6, 3072, {true, 2.5}),
      // openai/gpt-oss-120b: hidden 2880, intermediate 2880, 128 experts, top-4, softmax over
      // the top-4 logits (= normalized exp scores). Its experts are not the plain SwiGLU of
      // DESIGN §1 (transformers' models/gpt_oss/modeling_gpt_oss.py, GptOssExperts): biases on
      // both projections and a clamped SwiGLU (alpha 1.702, limit 7.0).
      preset("gpt-oss-120b", "gpt-oss-120b", 2880, 2880, 128, 4, 0, {true, 1.0}, false,
             "its experts have biases (gate_up_proj_bias, down_proj_bias) and a clamped SwiGLU "
             "((up + 1) * gate * sigmoid(1.702 * gate), gate <= 7, up in [-7, 7]), which Caracal's "
             "layer does not implement"),
  };
  return presets;
}

std::string model_preset_names() {
  std::string names;
  for (const auto& p : model_presets()) {
    if (!names.empty()) names += ", ";
    names += p.name;
  }
  return names;
}

const ModelPreset& find_model_preset(const std::string& name) {
  for (const auto& p : model_presets())
    if (p.name == name) return p;
  throw Error("model: unknown preset '" + name + "'; expected one of: " + model_preset_names());
}

}  // namespace caracal

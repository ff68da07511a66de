// CARACAL_REQUIRE_GPU and CARACAL_REQUIRE_GPUS are read strictly (tests/gpu/gpu_requirements.hpp): the
// documented values are accepted, anything else is refused with a message naming the variable, the
// value and what is accepted (atoi read "yes" as 0, which skipped in silence).
#include <gtest/gtest.h>

#include <climits>
#include <string>

#include "gpu/gpu_requirements.hpp"

namespace caracal::test {
namespace {

TEST(GpuRequirements, UnsetOrEmptyRequiresNothing) {
  for (const char* unset : {static_cast<const char*>(nullptr), ""}) {
    const GpuRequirements r = parse_gpu_requirements(unset, unset);
    EXPECT_EQ(r.error, "");
    EXPECT_FALSE(r.gpu);
    EXPECT_EQ(r.gpus, 0);
  }
}

TEST(GpuRequirements, DocumentedValues) {
  EXPECT_FALSE(parse_gpu_requirements("0", nullptr).gpu);
  EXPECT_TRUE(parse_gpu_requirements("1", nullptr).gpu);
  EXPECT_EQ(parse_gpu_requirements(nullptr, "0").gpus, 0);
  EXPECT_EQ(parse_gpu_requirements(nullptr, "8").gpus, 8);
  EXPECT_EQ(parse_gpu_requirements(nullptr, "08").gpus, 8);
  EXPECT_EQ(parse_gpu_requirements(nullptr, "99999999999999999999").gpus, INT_MAX);
  for (const char* gpu : {"0", "1"}) {
    for (const char* gpus : {"0", "2", "64"}) EXPECT_EQ(parse_gpu_requirements(gpu, gpus).error, "") << gpu << " " << gpus;
  }
}

TEST(GpuRequirements, RefusesOtherRequireGpuValues) {
  for (const char* value : {"yes", "true", "no", "2", "01", " 1", "1 ", "-1", "on"}) {
    const GpuRequirements r = parse_gpu_requirements(value, nullptr);
    EXPECT_EQ(r.error, "CARACAL_REQUIRE_GPU=\"" + std::string(value) +
                           "\" is not accepted: it must be unset, empty, \"0\" or \"1\"");
    EXPECT_FALSE(r.gpu) << value;
  }
}

TEST(GpuRequirements, RefusesOtherRequireGpusValues) {
  for (const char* value : {"yes", "-1", "+2", "2x", " 2", "2 ", "0x2", "1.5", "two"}) {
    const GpuRequirements r = parse_gpu_requirements(nullptr, value);
    EXPECT_EQ(r.error, "CARACAL_REQUIRE_GPUS=\"" + std::string(value) +
                           "\" is not accepted: it must be unset, empty or a non-negative decimal integer "
                           "(the GPUs this machine has)");
    EXPECT_EQ(r.gpus, 0) << value;
  }
}

TEST(GpuRequirements, NamesBothWhenBothAreRefused) {
  const std::string error = parse_gpu_requirements("yes", "all").error;
  EXPECT_NE(error.find("CARACAL_REQUIRE_GPU=\"yes\""), std::string::npos) << error;
  EXPECT_NE(error.find("CARACAL_REQUIRE_GPUS=\"all\""), std::string::npos) << error;
}

// A refusal is a failure: its message must not hold the marker that makes CTest count a skip.
TEST(GpuRequirements, RefusalsDoNotHoldTheSkipMarker) {
  EXPECT_EQ(parse_gpu_requirements("yes", "all").error.find(CARACAL_SKIP_MARKER), std::string::npos);
}

}  // namespace
}  // namespace caracal::test

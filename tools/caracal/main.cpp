// caracal: the command-line tool. `caracal plan` sizes and costs a layer configuration;
// `caracal models` lists the model presets; `caracal bench` runs the layer on the GPU: it execs
// caracal-bench from this binary's directory, so that this one stays host-only (plans without a
// GPU, CUDA driver or NCCL).
#include <limits.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "run_command.hpp"

namespace {

// `caracal bench ARGS...` -> `<dir of caracal>/caracal-bench ARGS...`; returns only on failure.
int exec_bench(int argc, char** argv) {
  std::string dir;
  char self[PATH_MAX];
  const ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (n > 0) {
    self[n] = '\0';
    dir = self;
  } else {
    dir = argv[0];
  }
  const auto slash = dir.rfind('/');
  dir = slash == std::string::npos ? "." : dir.substr(0, slash);
  const std::string bench = dir + "/caracal-bench";
  std::vector<char*> args;
  args.push_back(const_cast<char*>(bench.c_str()));
  for (int i = 2; i < argc; ++i) args.push_back(argv[i]);
  args.push_back(nullptr);
  execv(bench.c_str(), args.data());
  std::cerr << "caracal: error: bench: cannot run " << bench << " (" << std::strerror(errno)
            << "): build the caracal-bench target (scripts/build.sh)\n";
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc >= 2 && std::string(argv[1]) == "bench") return exec_bench(argc, argv);
  CLI::App app{"Caracal: fused expert-parallel MoE training layer for Hopper GPUs"};
  app.require_subcommand(1);
  // Listed for --help only: main() hands `caracal bench ...` to caracal-bench before parsing.
  app.add_subcommand("bench", "Time the layer on a Hopper GPU against baselines (caracal bench --help)")
      ->allow_extras();
  const caracal::cli::Runner plan = caracal::cli::add_plan_command(app);
  const caracal::cli::Runner models = caracal::cli::add_models_command(app);
  return caracal::cli::parse_and_run(app, argc, argv, "", "--help",
                                     [&] { return app.got_subcommand("plan") ? plan() : models(); });
}

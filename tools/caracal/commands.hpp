#pragma once
// Subcommands of the `caracal` tool. Each registers its options on the app and returns the
// function that runs it once the command line is parsed.
#include <functional>

#include <CLI/CLI.hpp>

namespace caracal::cli {

using Runner = std::function<int()>;

Runner add_plan_command(CLI::App& app);
Runner add_models_command(CLI::App& app);

}  // namespace caracal::cli

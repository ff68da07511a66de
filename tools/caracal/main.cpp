// caracal: the command-line tool. `caracal plan` sizes and costs a layer configuration;
// `caracal models` lists the model presets.
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "caracal/error.hpp"
#include "commands.hpp"

int main(int argc, char** argv) {
  CLI::App app{"Caracal: fused expert-parallel MoE training layer for Hopper GPUs"};
  app.require_subcommand(1);
  const caracal::cli::Runner plan = caracal::cli::add_plan_command(app);
  const caracal::cli::Runner models = caracal::cli::add_models_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "caracal: error: " << e.what() << " (see --help)\n";
    return 2;
  }
  try {
    if (app.got_subcommand("plan")) return plan();
    return models();
  } catch (const caracal::Error& e) {
    std::cerr << "caracal: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "caracal: internal error: " << e.what() << "\n";
    return 3;
  }
}

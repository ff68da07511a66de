#pragma once
// How the `caracal` tools parse their command line, run, and end: every failure is one line on
// stderr, "caracal: error: <what><message>", and an exit code that says its kind.
#include <exception>
#include <iostream>

#include <CLI/CLI.hpp>

#include "caracal/error.hpp"

namespace caracal::cli {

// Parses the command line into `app` and returns run()'s exit code. --help prints the help and
// returns 0; a bad command line returns 2 (its message pointing to `help`), a caracal::Error 1
// and any other exception 3. `what` ("" or "bench: ") names the command in the messages.
template <typename Run>
int parse_and_run(CLI::App& app, int argc, char** argv, const char* what, const char* help, Run run) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::cerr << "caracal: error: " << what << e.what() << " (see " << help << ")\n";
    return 2;
  }
  try {
    return run();
  } catch (const Error& e) {
    std::cerr << "caracal: error: " << what << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "caracal: internal error: " << what << e.what() << "\n";
    return 3;
  }
}

}  // namespace caracal::cli

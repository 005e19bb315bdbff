// depthkv: the command-line program (subcommands in tools/cmd_*.cpp, declared in commands.hpp).

#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "depthkv/error.hpp"

int main(int argc, char** argv) {
  CLI::App app{"depthkv: layer-wise KV-cache budgets for LLM inference", "depthkv"};
  app.require_subcommand(1);
  depthkv_cli::register_generate(app);
  depthkv_cli::register_profile(app);
  depthkv_cli::register_allocate(app);
  depthkv_cli::register_eval(app);
  depthkv_cli::register_analyze(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const depthkv::Error& e) {
    std::fflush(stdout);
    std::string what = e.what();
    const std::string prefix = "depthkv: ";
    if (what.compare(0, prefix.size(), prefix) == 0) what = what.substr(prefix.size());
    std::cerr << "depthkv: error: " << what << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "depthkv: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

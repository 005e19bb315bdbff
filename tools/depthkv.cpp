// depthkv: the command-line program (subcommands in tools/cmd_*.cpp, declared in commands.hpp).
// Exit code 0 on success, 1 on any error, reported on stderr as "depthkv: error: <message>"
// (also when standard output could not be written, e.g. a full disk or /dev/full).
// Output files are written atomically (depthkv/detail/atomic_file.hpp); SIGINT, SIGTERM and
// SIGHUP remove the temporary file of a write in progress, then end the program as the signal
// would have, so an interrupted run leaves each output file as it was or complete.

#include <signal.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <iostream>
#include <string>

#include <CLI/CLI.hpp>

#include "commands.hpp"
#include "depthkv/detail/atomic_file.hpp"
#include "depthkv/error.hpp"

namespace {

/// Removes the temporary files of writes in progress; the default action of `sig` (restored by
/// SA_RESETHAND) then ends the program when the handler returns.
extern "C" void on_terminating_signal(int sig) {
  depthkv::detail::remove_pending_temp_files();
  std::raise(sig);  // blocked until the handler returns
}

/// Installs `on_terminating_signal` for SIGINT, SIGTERM and SIGHUP, except where the signal is
/// ignored (nohup, a shell's background job), which stays ignored.
void install_signal_cleanup() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction old {};
    if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler == SIG_IGN) continue;
    struct sigaction sa {};
    sa.sa_handler = on_terminating_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESETHAND;
    ::sigaction(sig, &sa, nullptr);
  }
}

}  // namespace

int main(int argc, char** argv) {
  install_signal_cleanup();
  CLI::App app{"depthkv: layer-wise KV-cache budgets for LLM inference", "depthkv"};
  app.require_subcommand(1);
  app.failure_message([](const CLI::App*, const CLI::Error& e) {
    return std::string("depthkv: error: ") + e.what() + "\nRun with --help for more information.\n";
  });
  depthkv_cli::register_generate(app);
  depthkv_cli::register_profile(app);
  depthkv_cli::register_allocate(app);
  depthkv_cli::register_eval(app);
  depthkv_cli::register_analyze(app);
  depthkv_cli::register_tokenize(app);
  depthkv_cli::register_perplexity(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 1;  // --help: 0; a usage error: its message, then 1 like every error
  } catch (const depthkv::Error& e) {
    std::fflush(stdout);
    std::cerr << "depthkv: error: " << e.message() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::cerr << "depthkv: error: " << e.what() << "\n";
    return 1;
  }
  std::cout.flush();
  if (std::fflush(stdout) != 0 || std::ferror(stdout) || !std::cout.good()) {
    std::cerr << "depthkv: error: cannot write to standard output (disk full, or a closed pipe?)\n";
    return 1;
  }
  return 0;
}

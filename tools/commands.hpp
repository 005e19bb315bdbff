#pragma once
// The subcommands of the `depthkv` program: each tools/cmd_<name>.cpp defines
// `void register_<name>(CLI::App& app)`, which adds its subcommand to `app` with a callback that
// runs it. Errors are thrown as depthkv::Error and reported by main().

#include <CLI/CLI.hpp>

namespace depthkv_cli {

/// `depthkv generate`: text generation as llama2.c's `run`, optionally on a pruned KV cache.
void register_generate(CLI::App& app);

/// `depthkv profile`: per-layer loss curves on calibration text -> profile file.
void register_profile(CLI::App& app);

/// `depthkv allocate`: per-layer budgets from a profile.
void register_allocate(CLI::App& app);

/// `depthkv eval`: allocation policies against the full cache on held-out windows.
void register_eval(CLI::App& app);

/// `depthkv tokenize`: the token ids of a text, as the model's vocabulary encodes it.
void register_tokenize(CLI::App& app);

/// `depthkv perplexity`: mean NLL and perplexity of the full cache over consecutive windows.
void register_perplexity(CLI::App& app);

/// `depthkv analyze`: rank correlation of representation metrics with the measured sensitivity.
void register_analyze(CLI::App& app);

}  // namespace depthkv_cli

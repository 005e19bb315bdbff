#pragma once
// Renamed flags: the old spelling stays a hidden alias for one release, sets the same value
// through the same checks, and says on stderr which flag replaces it (stdout is unchanged).

#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

namespace depthkv_cli {

/// The line a deprecated alias prints to stderr (without the newline):
/// "depthkv: note: <old_name> is deprecated here, use <new_name>".
inline std::string deprecation_note(const std::string& old_name, const std::string& new_name) {
  return "depthkv: note: " + old_name + " is deprecated here, use " + new_name;
}

/// Registers `old_name` on `c` as a hidden alias of the option `current` (already registered on
/// `c`, bound to `target`): the alias sets `target` too, after `checks` (give the checks of
/// `current`, so both names refuse the same values, the error naming the name used), and prints
/// deprecation_note() to stderr once per use. Giving both names is an error.
/// @return the alias option
template <class T>
CLI::Option* add_deprecated_alias(CLI::App* c, CLI::Option* current, const std::string& old_name, T& target,
                                  const std::vector<CLI::Validator>& checks = {}) {
  const std::string new_name = current->get_name();
  const std::string note = deprecation_note(old_name, new_name);
  CLI::Option* o = c->add_option_function<std::string>(
      old_name,
      [=, &target](const std::string& value) {
        if (current->count() > 0) throw CLI::ExcludesError(old_name, new_name);
        std::string in = value;
        for (const CLI::Validator& v : checks) {
          const std::string why = v(in);
          if (!why.empty()) throw CLI::ValidationError(old_name, why);
        }
        if (!CLI::detail::lexical_conversion<T, T>({in}, target))
          throw CLI::ConversionError(old_name, {in});
        std::fprintf(stderr, "%s\n", note.c_str());
      },
      "");
  o->group("");  // hidden from --help
  return o;
}

}  // namespace depthkv_cli

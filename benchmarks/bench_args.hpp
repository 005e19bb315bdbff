#pragma once
// Command-line options of the benchmark programs: `--name VALUE` options and `--name` flags bound
// to variables, an optional positional argument, one usage line, and the data folder default
// (`DEPTHKV_DATA_DIR` in the environment, else the build's `DEPTHKV_DEFAULT_DATA_DIR`).
//
//   int prompt = 512; bool json = false; std::string data = depthkv_bench::default_data_dir();
//   depthkv_bench::Args a("engine_bench");
//   a.option("--prompt", prompt).flag("--json", json).option("--data", data);
//   if (!a.parse(argc, argv)) return 2;   // usage printed

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace depthkv_bench {

/// The data folder: `$DEPTHKV_DATA_DIR`, else the folder configured at build time.
inline std::string default_data_dir() {
  const char* env = std::getenv("DEPTHKV_DATA_DIR");
  return env ? env : DEPTHKV_DEFAULT_DATA_DIR;
}

class Args {
 public:
  explicit Args(std::string program) : program_(std::move(program)) {}

  /// `--name N`: a whole number (the whole value must parse).
  Args& option(const char* name, int& v) {
    return add(name, "N", [&v](const char* s) {
      char* end = nullptr;
      errno = 0;
      const long x = std::strtol(s, &end, 10);
      if (errno || end == s || *end || x < -2147483647L || x > 2147483647L) return false;
      v = static_cast<int>(x);
      return true;
    });
  }
  /// `--name R`: a real number.
  Args& option(const char* name, double& v) {
    return add(name, "R", [&v](const char* s) {
      char* end = nullptr;
      v = std::strtod(s, &end);
      return end != s && !*end;
    });
  }
  /// `--name S`: a string.
  Args& option(const char* name, std::string& v) {
    return add(name, "S", [&v](const char* s) {
      v = s;
      return true;
    });
  }
  /// `--name VALUE` handed to `set`, which returns false for a bad value.
  Args& option(const char* name, const char* meta, std::function<bool(const char*)> set) {
    return add(name, meta, std::move(set));
  }
  /// `--name` alone: sets `v` to `value`.
  Args& flag(const char* name, bool& v, bool value = true) {
    opts_.push_back({name, "", [&v, value](const char*) {
                       v = value;
                       return true;
                     }, false});
    return *this;
  }
  /// One positional argument (optional unless `required`).
  Args& positional(const char* meta, std::string& v, bool required) {
    pos_meta_ = meta;
    pos_ = &v;
    pos_required_ = required;
    return *this;
  }

  /// Parses `argv`; on an unknown option, a missing or bad value, or a missing positional
  /// argument prints what was wrong and the usage line to stderr and returns false.
  bool parse(int argc, char** argv) const {
    bool have_pos = false;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      const Opt* o = nullptr;
      for (const Opt& x : opts_)
        if (a == x.name) o = &x;
      if (!o) {
        if (pos_ && !have_pos && (a.empty() || a[0] != '-')) {
          *pos_ = a;
          have_pos = true;
          continue;
        }
        return fail("unknown argument " + a);
      }
      if (!o->takes_value) {
        o->set(nullptr);
        continue;
      }
      if (i + 1 >= argc) return fail(a + " needs a value");
      if (!o->set(argv[++i])) return fail("bad value for " + a + ": " + argv[i]);
    }
    if (pos_ && pos_required_ && !have_pos) return fail(std::string("missing ") + pos_meta_);
    return true;
  }

  /// "usage: PROGRAM [FILE] [--name N] ...".
  std::string usage() const {
    std::string u = "usage: " + program_;
    if (pos_) u += pos_required_ ? std::string(" ") + pos_meta_ : std::string(" [") + pos_meta_ + "]";
    for (const Opt& o : opts_) u += " [" + std::string(o.name) + (o.takes_value ? " " + std::string(o.meta) : "") + "]";
    return u;
  }

  /// Prints `what` and the usage line to stderr; returns false (for `return a.fail(...) ? 0 : 2`).
  bool fail(const std::string& what) const {
    std::fprintf(stderr, "%s: %s\n%s\n", program_.c_str(), what.c_str(), usage().c_str());
    return false;
  }

 private:
  struct Opt {
    const char* name;
    const char* meta;
    std::function<bool(const char*)> set;
    bool takes_value;
  };
  Args& add(const char* name, const char* meta, std::function<bool(const char*)> set) {
    opts_.push_back({name, meta, std::move(set), true});
    return *this;
  }

  std::string program_;
  std::vector<Opt> opts_;
  const char* pos_meta_ = "";
  std::string* pos_ = nullptr;
  bool pos_required_ = false;
};

}  // namespace depthkv_bench

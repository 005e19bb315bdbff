// Tests of the bounded-memory options of `depthkv eval` (--schedule, --interval, peak_kv_bytes) and
// `depthkv generate` (--max-kv-tokens, --interval), run as separate processes on stories260K.

#include <catch2/catch.hpp>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "support/run_cli.hpp"
#include "support/temp_dir.hpp"
#include "support/test_data.hpp"

using depthkv_test::require_error;
using depthkv_test::run_cli;
using depthkv_test::shell_quoted;

namespace {
// stories260K: 5 layers x 4 KV heads x head_dim 8, K and V in float
constexpr double kTokenBytes = 5 * 4 * 8 * 2 * 4;  // per position, all layers
}  // namespace

TEST_CASE("eval --schedule chunked: one chunk equals oneshot, peak_kv_bytes within budget + one chunk",
          "[cli][eval][schedule][real]") {
  const std::string text = shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt"));
  const std::string profile = depthkv_test::scratch_dir().file("schedule_profile.json");
  const std::string common = " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1";
  REQUIRE(run_cli("profile --model " + depthkv_test::stories_model_arg() + " --text " + text + common +
                  " --windows 4 --ratios 0.2,0.5 --scorers h2o -o " + shell_quoted(profile))
              .status == 0);
  const std::string base = "eval --model " + depthkv_test::stories_model_arg() + " --text " + text + " --profile " + shell_quoted(profile) +
                           common + " --keeps 0.2 --policies uniform,optimal --windows 3 --json";
  const auto once = run_cli(base), one_chunk = run_cli(base + " --schedule chunked"),
             chunked = run_cli(base + " --schedule chunked --chunk 16"),
             spaced = run_cli(base + " --schedule chunked --chunk 8 --interval 24");
  REQUIRE(once.status == 0);
  REQUIRE(one_chunk.status == 0);
  REQUIRE(chunked.status == 0);
  REQUIRE(spaced.status == 0);
  const auto a = nlohmann::json::parse(once.out), b = nlohmann::json::parse(one_chunk.out),
             c = nlohmann::json::parse(chunked.out), d = nlohmann::json::parse(spaced.out);
  REQUIRE(a.size() == 2);
  for (std::size_t i = 0; i < a.size(); ++i) {
    CAPTURE(i);
    REQUIRE(a[i]["full_kv_bytes"].get<double>() == 80 * kTokenBytes);  // context + continuation
    REQUIRE(a[i]["peak_kv_bytes"].get<double>() == 64 * kTokenBytes);   // the full context, before eviction
    REQUIRE(b[i]["kl"].get<double>() == Approx(a[i]["kl"].get<double>()).margin(1e-9));
    REQUIRE(b[i]["peak_kv_bytes"] == a[i]["peak_kv_bytes"]);
    REQUIRE(c[i]["bytes_kept"] == a[i]["bytes_kept"]);  // same final budget
    const double kept = a[i]["bytes_kept"].get<double>();
    REQUIRE(c[i]["peak_kv_bytes"].get<double>() <= kept + 16 * kTokenBytes);  // budget + one chunk (or the continuation)
    REQUIRE(c[i]["peak_kv_bytes"].get<double>() < a[i]["peak_kv_bytes"].get<double>());
    REQUIRE(d[i]["peak_kv_bytes"].get<double>() <= kept + 24 * kTokenBytes);
  }
  // decode: a short context and a long continuation, evicted every --interval tokens
  const std::string longer = "eval --model " + depthkv_test::stories_model_arg() + " --text " + text + " --profile " + shell_quoted(profile) +
                             " --context 32 --continuation 48 --sinks 2 --recent 4 --obs-window 4 --threads 1"
                             " --keeps 0.2 --policies uniform,optimal --windows 3 --json --chunk 16";
  const auto pre = run_cli(longer + " --schedule chunked"), dec = run_cli(longer + " --schedule decode --interval 4");
  REQUIRE(pre.status == 0);
  REQUIRE(dec.status == 0);
  const auto e = nlohmann::json::parse(dec.out), f = nlohmann::json::parse(pre.out);
  for (std::size_t i = 0; i < e.size(); ++i) {
    CAPTURE(i);
    REQUIRE(e[i]["bytes_kept"] == f[i]["bytes_kept"]);  // the same budget after the context
    // chunked: the kept context + all 48 continuation tokens. decode: the second prefill chunk on
    // the 6 protected tokens left after the first, or at the end keep 0.2 of the 80 tokens seen
    // (16 per layer) plus one interval
    REQUIRE(f[i]["peak_kv_bytes"].get<double>() >= 48 * kTokenBytes);
    REQUIRE(e[i]["peak_kv_bytes"].get<double>() <= std::max(6 + 16, 16 + 4) * kTokenBytes);
  }
  require_error(run_cli(base + " --schedule sometimes", "2>&1"),
                "--schedule must be oneshot, chunked or decode, got 'sometimes'");
  require_error(run_cli(base + " --schedule chunked --interval 0", "2>&1"), "--interval: must be >= 1, got 0");
  std::remove(profile.c_str());
}

TEST_CASE("profile --schedule chunked: recorded in the file, one chunk equals oneshot", "[cli][profile][schedule][real]") {
  const std::string text = shell_quoted(depthkv_test::data_path("text/tinystories_valid.txt"));
  const auto& dir = depthkv_test::scratch_dir();
  const std::string p1 = dir.file("prof_once.json"), p2 = dir.file("prof_one_chunk.json"), p3 = dir.file("prof_chunked.json");
  const std::string base = "profile --model " + depthkv_test::stories_model_arg() + " --text " + text +
                           " --context 64 --continuation 16 --sinks 2 --recent 4 --obs-window 4 --threads 1"
                           " --windows 3 --ratios 0.2,0.5 --scorers h2o";
  REQUIRE(run_cli(base + " -o " + shell_quoted(p1)).status == 0);
  REQUIRE(run_cli(base + " --schedule chunked -o " + shell_quoted(p2)).status == 0);
  REQUIRE(run_cli(base + " --schedule chunked --chunk 16 -o " + shell_quoted(p3)).status == 0);
  const auto read = [](const std::string& f) {
    std::ifstream in(f);
    return nlohmann::json::parse(in);
  };
  const auto a = read(p1), b = read(p2), c = read(p3);
  REQUIRE_FALSE(a["calibration"].contains("eviction_chunk"));
  REQUIRE(b["calibration"]["eviction_chunk"] == 1024);
  REQUIRE(c["calibration"]["eviction_chunk"] == 16);
  const auto& ka = a["scorers"]["h2o"]["kl"]["mean"];
  const auto& kb = b["scorers"]["h2o"]["kl"]["mean"];
  const auto& kc = c["scorers"]["h2o"]["kl"]["mean"];
  bool differs = false;
  for (std::size_t l = 0; l < ka.size(); ++l)
    for (std::size_t r = 0; r < ka[l].size(); ++r) {
      REQUIRE(kb[l][r].get<double>() == Approx(ka[l][r].get<double>()).margin(1e-9));
      differs = differs || std::abs(kc[l][r].get<double>() - ka[l][r].get<double>()) > 1e-6;
    }
  REQUIRE(differs);  // chunked eviction measures another pruning
  require_error(run_cli(base + " --schedule sometimes -o " + shell_quoted(p1), "2>&1"),
                "--schedule must be oneshot or chunked, got 'sometimes'");
  require_error(run_cli(base + " --schedule chunked --chunk 16 --resume -o " + shell_quoted(p1), "2>&1"),
                "--resume: '" + p1 + "' was measured with other settings (text, document split, windows, ratios or schedule)");
}

TEST_CASE("generate --max-kv-tokens: bounded cache, a budget never reached gives the default output",
          "[cli][generate][schedule][real]") {
  const std::string g = "generate --model " + depthkv_test::stories_model_arg() + " --prompt 'Once upon a time' -t 0 -n 200 ";
  const auto full = run_cli(g), big = run_cli(g + "--max-kv-tokens 100000");
  REQUIRE(full.status == 0);
  REQUIRE(big.out == full.out);
  const auto bounded = run_cli(g + "--max-kv-tokens 300 --interval 16", "2>&1");
  REQUIRE(bounded.status == 0);
  // 300 tokens + one interval of 16 in each of the 5 layers, at 128 bytes per layer-token (F16
  // keys and values, the default) or 256 (--kv-type f32)
  REQUIRE(bounded.out.find("peak 48640 bytes") != std::string::npos);
  const auto bounded32 = run_cli(g + "--max-kv-tokens 300 --interval 16 --kv-type f32", "2>&1");
  REQUIRE(bounded32.out.find("peak 97280 bytes") != std::string::npos);
  require_error(run_cli(g + "--max-kv-tokens 300 --keep 0.5", "2>&1"), "give --keep or --max-kv-tokens, not both");
  require_error(run_cli(g + "--max-kv-tokens 300 --interval 0", "2>&1"), "--interval: must be >= 1, got 0");
}

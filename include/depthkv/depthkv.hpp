#pragma once
/// @file depthkv.hpp
/// @brief Umbrella header of the core library (Eigen is its only dependency): storage (strided
/// and paged), scoring, eviction, profiles and budget allocation. Not included:
/// representation_metrics.hpp (layer similarity measures; include it directly), profile_io.hpp
/// (JSON, needs nlohmann_json), the reference engine (llama.hpp) and the CUDA headers (cuda/).

#include "depthkv/config.hpp"
#include "depthkv/error.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/paged_cache.hpp"
#include "depthkv/selection.hpp"
#include "depthkv/simd_level.hpp"
#include "depthkv/thread_pool.hpp"
#include "depthkv/scorer_config.hpp"
#include "depthkv/token_scorer.hpp"
#include "depthkv/evictor.hpp"
#include "depthkv/head_budget.hpp"
#include "depthkv/sensitivity_profile.hpp"
#include "depthkv/budget_allocator.hpp"
#include "depthkv/sensitivity_profiler.hpp"
#include "depthkv/eviction_schedule.hpp"

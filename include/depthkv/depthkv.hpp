#pragma once
/// @file depthkv.hpp
/// @brief Umbrella header of the core library (Eigen is its only dependency).

#include "depthkv/config.hpp"
#include "depthkv/error.hpp"
#include "depthkv/kv_cache.hpp"
#include "depthkv/token_scorer.hpp"
#include "depthkv/evictor.hpp"
#include "depthkv/sensitivity_profile.hpp"
#include "depthkv/budget_allocator.hpp"
#include "depthkv/sensitivity_profiler.hpp"
#include "depthkv/representation_metrics.hpp"

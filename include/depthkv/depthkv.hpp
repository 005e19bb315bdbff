#pragma once
/// @file depthkv.hpp
/// @brief Umbrella header of the core library (Eigen is its only dependency).

#include "depthkv/config.hpp"
#include "depthkv/error.hpp"
#include "depthkv/kv_cache.hpp"

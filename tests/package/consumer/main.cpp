// A consumer of the installed (or add_subdirectory'd) depthkv package.
#include <depthkv/depthkv.hpp>

#include <cstdio>

int main() {
  depthkv::KVCache<depthkv::HostLayer<float>> cache;
  cache.add_layer(depthkv::HostLayer<float>(2, 4));
  const float k[8] = {1, 2, 3, 4, 5, 6, 7, 8};
  cache.layer(0).append(k, k, 0);
  std::printf("consumer: %zu bytes held\n", cache.bytes());
  return cache.bytes() == 2 * 4 * 2 * sizeof(float) ? 0 : 1;
}

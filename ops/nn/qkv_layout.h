// The fused qkv row that attention and rotary read: n_head query heads, then kv_heads key heads,
// then kv_heads value heads, each head_size wide (grouped-query attention when kv_heads < n_head;
// query head h uses key/value head h / (n_head / kv_heads)). Builders check it once here, so both
// ops refuse the same shapes with the same message, naming the layer.
//
//   const QkvLayout l = qkv_layout(g.value(qkv).shape, n_head, kv_heads, name);  // throws on a bad shape
//   ValueId out = g.add_activation(name + ".out", Shape{s[0], s[1], l.n_head * l.head_size});
#pragma once

#include <string>

#include "op_util.h"

namespace engine::ops {

struct QkvLayout {
  int64_t n_head = 0, kv_heads = 0, head_size = 0;
};

// kv_heads 0 means n_head. `qkv` must be (B, T, (n_head + 2 kv_heads) x head_size).
inline QkvLayout qkv_layout(const Shape& qkv, int64_t n_head, int64_t kv_heads, const std::string& name) {
  if (kv_heads == 0) kv_heads = n_head;
  if (n_head < 1 || kv_heads < 1 || n_head % kv_heads != 0)
    shape_error(name, std::to_string(kv_heads) + " key/value heads do not divide " + std::to_string(n_head) + " heads");
  const int64_t slots = n_head + 2 * kv_heads;  // head-sized slices in a row of qkv
  if (qkv.rank() != 3 || qkv[2] % slots != 0)
    shape_error(name, "qkv must be (B, T, (" + std::to_string(n_head) + " + 2 x " + std::to_string(kv_heads) +
                          ") x head_size), got " + qkv.str());
  return {.n_head = n_head, .kv_heads = kv_heads, .head_size = qkv[2] / slots};
}

}  // namespace engine::ops

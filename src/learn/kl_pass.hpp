// The pass behind kl_loss and evaluate (kl_loss.cpp): evaluation observes softmax(ŝ) of every
// (query, group) without a second copy of the forward pass.
#pragma once

#include <functional>
#include <span>

#include "masskv/learn/train.hpp"

namespace masskv::learn {

// Called with (batch index j, group g, softmax(ŝ) over the prefix), from OpenMP threads: it
// must only write state of its own (j, g).
template <class T>
using Observer = std::function<void(std::size_t, int, std::span<const T>)>;

template <class T>
double kl_pass(const LayerActivations& data, const Geometry& geo,
               std::span<const std::size_t> queries, const Weights<T>& w, Weights<T>* grad,
               const Observer<T>* observe);

}  // namespace masskv::learn

#include "attn/rows.hpp"

namespace masskv::attn::detail {

RowSource::RowSource(const kv::PagedKVView& cache, const SelectionView* selection)
    : c_(cache), sel_(selection), esize_(static_cast<std::int64_t>(dtype_size(cache.dtype))) {}

int RowSource::units(int b, int h) const {
  if (sel_ == nullptr) return c_.table.num_pages(b);
  return sel_->count[b * sel_->num_kv_heads + h];
}

int RowSource::count(int b, int h, int begin, int end) const {
  if (token_units()) return end - begin;
  int n = 0;
  for (int i = begin; i < end; ++i) {
    n += c_.table.page_len(b, sel_ == nullptr ? i : sel_->list(b, h)[i], c_.page_size);
  }
  return n;
}

int RowSource::gather(int b, int h, int begin, int end, const void** k, const void** v,
                      std::int64_t* pos) const {
  const char* kb = static_cast<const char*>(c_.k);
  const char* vb = static_cast<const char*>(c_.v);
  const int P = c_.page_size;
  int n = 0;
  auto put = [&](int logical, int slot) {
    const std::int64_t off = c_.offset(c_.table.page(b, logical), h, slot) * esize_;
    k[n] = kb + off;
    v[n] = vb + off;
    if (pos != nullptr) pos[n] = static_cast<std::int64_t>(logical) * P + slot;
    ++n;
  };
  auto put_page = [&](int logical) {
    const int len = c_.table.page_len(b, logical, P);
    for (int slot = 0; slot < len; ++slot) put(logical, slot);
  };
  if (sel_ == nullptr) {
    for (int p = begin; p < end; ++p) put_page(p);
  } else {
    const auto ids = sel_->list(b, h);
    if (sel_->unit == SelectionView::Unit::page) {
      for (int i = begin; i < end; ++i) put_page(ids[i]);
    } else {
      for (int i = begin; i < end; ++i) put(ids[i] / P, ids[i] % P);
    }
  }
  return n;
}

}  // namespace masskv::attn::detail

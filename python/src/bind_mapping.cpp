// softmax / entmax / entmax_threshold over the rows of a 1-d or 2-d array (docs/design.md §2.1).
#include <cstddef>
#include <span>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "masskv/error.hpp"
#include "masskv/mapping.hpp"

namespace masskv::py {

Mapping mapping_of(double alpha) {
  if (alpha == 1.0) return Mapping::softmax();
  const Mapping m = Mapping::entmax(alpha);
  m.validate();
  return m;
}

namespace {

// Rows of a C-contiguous 1-d or 2-d float32/float64 array.
struct Rows {
  Elem elem = Elem::f32;
  std::size_t rows = 0, cols = 0;
  std::vector<std::size_t> shape;
};

Rows rows_of(const InArray& a, const char* name) {
  require_cpu(a, name);
  if (a.dtype().code != static_cast<std::uint8_t>(nb::dlpack::dtype_code::Float) ||
      (a.dtype().bits != 32 && a.dtype().bits != 64)) {
    throw nb::type_error(
        (std::string(name) + ": expected dtype float32 or float64, got " + dtype_name(a.dtype()))
            .c_str());
  }
  if (a.ndim() != 1 && a.ndim() != 2) {
    throw nb::value_error(
        (std::string(name) + ": expected a 1-d or 2-d array, got shape " + shape_string(a))
            .c_str());
  }
  require_c_contiguous(a, name);
  Rows r;
  r.elem = a.dtype().bits == 32 ? Elem::f32 : Elem::f64;
  r.cols = a.shape(a.ndim() - 1);
  r.rows = a.ndim() == 1 ? 1 : a.shape(0);
  for (std::size_t i = 0; i < a.ndim(); ++i) r.shape.push_back(a.shape(i));
  return r;
}

// `out` (or a new array) of the same shape and dtype as the scores.
template <class T>
nb::object output_like(const Rows& r, nb::handle out, T** data) {
  if (out.is_none()) return new_numpy<T>(r.shape, data);
  OutArray o = as_output(out, "out");
  const InArray in(o);
  require_flat(in, r.elem, "out");
  bool same_shape = in.ndim() == r.shape.size();
  for (std::size_t i = 0; same_shape && i < in.ndim(); ++i) same_shape = in.shape(i) == r.shape[i];
  if (!same_shape)
    throw nb::value_error(("out: shape " + shape_string(in) + " differs from scores'").c_str());
  *data = static_cast<T*>(o.data());
  return nb::borrow(out);
}

std::vector<std::size_t> row_shape(const Rows& r) {
  return r.shape.size() == 1 ? std::vector<std::size_t>{} : std::vector<std::size_t>{r.rows};
}

template <class T>
nb::tuple softmax_rows(const InArray& scores, const Rows& r, nb::handle out) {
  T* p = nullptr;
  nb::object p_obj = output_like<T>(r, out, &p);
  double* lse = nullptr;
  nb::object lse_obj = new_numpy<double>(row_shape(r), &lse);
  const T* s = static_cast<const T*>(scores.data());
  {
    nb::gil_scoped_release nogil;
    for (std::size_t i = 0; i < r.rows; ++i) {
      lse[i] =
          softmax(std::span<const T>(s + i * r.cols, r.cols), std::span<T>(p + i * r.cols, r.cols));
    }
  }
  return nb::make_tuple(p_obj, lse_obj);
}

template <class T>
nb::tuple entmax_rows(const InArray& scores, const Rows& r, double alpha, nb::handle out) {
  mapping_of(alpha).validate();
  if (alpha == 1.0)
    throw nb::value_error("alpha: entmax needs alpha in (1, 2]; use softmax for alpha = 1");
  T* p = nullptr;
  nb::object p_obj = output_like<T>(r, out, &p);
  double* tau = nullptr;
  nb::object tau_obj = new_numpy<double>(row_shape(r), &tau);
  std::int64_t* support = nullptr;
  nb::object sup_obj = new_numpy<std::int64_t>(row_shape(r), &support);
  const T* s = static_cast<const T*>(scores.data());
  {
    nb::gil_scoped_release nogil;
    for (std::size_t i = 0; i < r.rows; ++i) {
      const EntmaxThreshold t = entmax(std::span<const T>(s + i * r.cols, r.cols), alpha,
                                       std::span<T>(p + i * r.cols, r.cols));
      tau[i] = t.tau;
      support[i] = t.support;
    }
  }
  return nb::make_tuple(p_obj, tau_obj, sup_obj);
}

}  // namespace

void bind_mapping(nb::module_& m) {
  nb::class_<EntmaxThreshold>(m, "EntmaxThreshold",
                              "Threshold of alpha-entmax on z = (alpha-1)*s (docs/design.md §2.1): "
                              "p_i = [z_i - tau]_+^(1/(alpha-1)), sum p = 1.")
      .def_ro("tau", &EntmaxThreshold::tau, "best estimate of the root")
      .def_ro("tau_lo", &EntmaxThreshold::tau_lo, "f(tau_lo) >= 1 is guaranteed")
      .def_ro("tau_hi", &EntmaxThreshold::tau_hi, "f(tau_hi) <= 1")
      .def_ro("support", &EntmaxThreshold::support, "#{i : z_i > tau}")
      .def("__repr__", [](const EntmaxThreshold& t) {
        return "EntmaxThreshold(tau=" + std::to_string(t.tau) +
               ", support=" + std::to_string(t.support) + ")";
      });

  m.def(
      "softmax",
      [](InArray scores, nb::handle out) {
        const Rows r = rows_of(scores, "scores");
        return r.elem == Elem::f32 ? softmax_rows<float>(scores, r, out)
                                   : softmax_rows<double>(scores, r, out);
      },
      nb::arg("scores").noconvert(), nb::arg("out").none() = nb::none(),
      nb::sig(
          "def softmax(scores: numpy.typing.ArrayLike, out: numpy.typing.ArrayLike | None = None) "
          "-> tuple[numpy.typing.ArrayLike, numpy.ndarray]"),
      "softmax over the last axis of a 1-d or 2-d float32/float64 C-contiguous array.\n\n"
      "Returns (p, lse): p has the scores' shape and dtype (written into `out` when given);\n"
      "lse is the natural-log log-sum-exp per row, float64 of shape scores.shape[:-1].");

  m.def(
      "entmax",
      [](InArray scores, double alpha, nb::handle out) {
        const Rows r = rows_of(scores, "scores");
        return r.elem == Elem::f32 ? entmax_rows<float>(scores, r, alpha, out)
                                   : entmax_rows<double>(scores, r, alpha, out);
      },
      nb::arg("scores").noconvert(), nb::arg("alpha") = 1.5, nb::arg("out").none() = nb::none(),
      nb::sig("def entmax(scores: numpy.typing.ArrayLike, alpha: float = 1.5, out: "
              "numpy.typing.ArrayLike | None = None) "
              "-> tuple[numpy.typing.ArrayLike, numpy.ndarray, numpy.ndarray]"),
      "alpha-entmax (alpha in (1, 2]; 2 is sparsemax) over the last axis of a 1-d or 2-d\n"
      "float32/float64 C-contiguous array. Entries outside the support are exactly 0.\n\n"
      "Returns (p, tau, support): tau is the threshold on z = (alpha-1)*s (float64) and support\n"
      "the number of nonzeros (int64), both of shape scores.shape[:-1].");

  m.def(
      "entmax_threshold",
      [](InArray scores, double alpha) {
        const Rows r = rows_of(scores, "scores");
        if (r.shape.size() != 1) throw nb::value_error("scores: expected a 1-d array");
        nb::gil_scoped_release nogil;
        return r.elem == Elem::f32
                   ? entmax_threshold(
                         std::span<const float>(static_cast<const float*>(scores.data()), r.cols),
                         alpha)
                   : entmax_threshold(
                         std::span<const double>(static_cast<const double*>(scores.data()), r.cols),
                         alpha);
      },
      nb::arg("scores").noconvert(), nb::arg("alpha"),
      "The alpha-entmax threshold of a 1-d float32/float64 array, with its certified bracket\n"
      "[tau_lo, tau_hi] and support size.");
}

}  // namespace masskv::py

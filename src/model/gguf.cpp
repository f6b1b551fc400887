#include "masskv/model/gguf.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>

namespace masskv::model {

namespace {

constexpr std::uint64_t kNoIndex = ~std::uint64_t{0};
constexpr int kMaxArrayDepth = 8;              // nested arrays deeper than this are rejected
constexpr std::uint64_t kMaxKeyBytes = 65535;  // ggml's docs/gguf.md: keys are < 2^16 bytes

// Bytes of a fixed-size metadata scalar, 0 for string/array/unknown.
std::uint64_t scalar_size(std::uint32_t type) noexcept {
  switch (static_cast<GgufType>(type)) {
    case GgufType::u8:
    case GgufType::i8:
    case GgufType::boolean:
      return 1;
    case GgufType::u16:
    case GgufType::i16:
      return 2;
    case GgufType::u32:
    case GgufType::i32:
    case GgufType::f32:
      return 4;
    case GgufType::u64:
    case GgufType::i64:
    case GgufType::f64:
      return 8;
    case GgufType::string:
    case GgufType::array:
      return 0;
  }
  return 0;
}

bool known_value_type(std::uint32_t type) noexcept {
  return type <= static_cast<std::uint32_t>(GgufType::f64);
}

bool is_signed_int(GgufType t) noexcept {
  return t == GgufType::i8 || t == GgufType::i16 || t == GgufType::i32 || t == GgufType::i64;
}

// Little-endian load of `size` bytes; signed types are sign-extended to 64 bits.
std::uint64_t load_scalar(const std::byte* p, GgufType type) noexcept {
  const std::uint64_t size = scalar_size(static_cast<std::uint32_t>(type));
  std::uint64_t v = 0;
  for (std::uint64_t i = 0; i < size; ++i) v |= std::to_integer<std::uint64_t>(p[i]) << (8 * i);
  if (is_signed_int(type) && size < 8) {
    const std::uint64_t sign = std::uint64_t{1} << (8 * size - 1);
    v = (v ^ sign) - sign;
  }
  return v;
}

bool checked_mul(std::uint64_t a, std::uint64_t b, std::uint64_t* out) noexcept {
  return !__builtin_mul_overflow(a, b, out);
}

}  // namespace

std::string_view to_string(GgufType type) noexcept {
  switch (type) {
    case GgufType::u8:
      return "uint8";
    case GgufType::i8:
      return "int8";
    case GgufType::u16:
      return "uint16";
    case GgufType::i16:
      return "int16";
    case GgufType::u32:
      return "uint32";
    case GgufType::i32:
      return "int32";
    case GgufType::f32:
      return "float32";
    case GgufType::boolean:
      return "bool";
    case GgufType::string:
      return "string";
    case GgufType::array:
      return "array";
    case GgufType::u64:
      return "uint64";
    case GgufType::i64:
      return "int64";
    case GgufType::f64:
      return "float64";
  }
  return "unknown";
}

// ---- GgufValue -----------------------------------------------------------------------------

GgufValue::IntValue GgufValue::as_integer(std::string_view argument) const {
  const bool integer = type_ == GgufType::u8 || type_ == GgufType::u16 || type_ == GgufType::u32 ||
                       type_ == GgufType::u64 || is_signed_int(type_);
  require(integer, ErrorCode::invalid_argument, argument, "is ", to_string(type_),
          ", not an integer");
  return {is_signed_int(type_) && static_cast<std::int64_t>(bits_) < 0, bits_};
}

double GgufValue::as_float(std::string_view argument) const {
  if (type_ == GgufType::f32) {
    return std::bit_cast<float>(static_cast<std::uint32_t>(bits_));
  }
  require(type_ == GgufType::f64, ErrorCode::invalid_argument, argument, "is ", to_string(type_),
          ", not a float");
  return std::bit_cast<double>(bits_);
}

GgufType GgufValue::array_type(std::string_view argument) const {
  require(type_ == GgufType::array, ErrorCode::invalid_argument, argument, "is ", to_string(type_),
          ", not an array");
  return array_type_;
}

std::uint64_t GgufValue::array_size(std::string_view argument) const {
  array_type(argument);
  return array_size_;
}

const std::vector<std::string_view>& GgufValue::strings(std::string_view argument) const {
  require(array_type(argument) == GgufType::string, ErrorCode::invalid_argument, argument,
          "is an array of ", to_string(array_type_), ", not of strings");
  return strings_;
}

const std::vector<GgufValue>& GgufValue::arrays(std::string_view argument) const {
  require(array_type(argument) == GgufType::array, ErrorCode::invalid_argument, argument,
          "is an array of ", to_string(array_type_), ", not of arrays");
  return arrays_;
}

GgufValue GgufValue::element(std::uint64_t i) const {
  GgufValue v;
  v.type_ = array_type_;
  v.bits_ = load_scalar(array_data_ + i * scalar_size(static_cast<std::uint32_t>(array_type_)),
                        array_type_);
  return v;
}

// ---- parser ------------------------------------------------------------------------------

class GgufParser {
 public:
  GgufParser(std::span<const std::byte> bytes, GgufFile& out) : bytes_(bytes), out_(out) {}

  void parse() {
    parse_header();
    for (std::uint64_t i = 0; i < kv_count_; ++i) parse_kv(i);
    parse_alignment();
    for (std::uint64_t i = 0; i < tensor_count_; ++i) parse_tensor_info(i);
    place_data();
  }

 private:
  std::uint64_t remaining() const noexcept { return bytes_.size() - pos_; }

  // Fails unless n more bytes are there; `index` (when given) says which element needed them.
  void need(std::uint64_t n, std::string_view argument, std::string_view what,
            std::uint64_t index = kNoIndex) const {
    if (n <= remaining()) return;
    if (index != kNoIndex) {
      fail(ErrorCode::io, argument, "truncated ", what, " ", index, ": needs ", n,
           " bytes at offset ", pos_, ", file has ", bytes_.size());
    }
    fail(ErrorCode::io, argument, "truncated ", what, ": needs ", n, " bytes at offset ", pos_,
         ", file has ", bytes_.size());
  }

  template <class T>
  T read(std::string_view argument, std::string_view what, std::uint64_t index = kNoIndex) {
    need(sizeof(T), argument, what, index);
    std::uint64_t v = 0;
    for (std::size_t i = 0; i < sizeof(T); ++i) {
      v |= std::to_integer<std::uint64_t>(bytes_[pos_ + i]) << (8 * i);
    }
    pos_ += sizeof(T);
    return static_cast<T>(v);
  }

  std::string_view read_string(std::string_view argument, std::string_view what,
                               std::uint64_t index = kNoIndex) {
    const auto n = read<std::uint64_t>(argument, what, index);
    need(n, argument, what, index);
    const std::string_view s(reinterpret_cast<const char*>(bytes_.data() + pos_), n);
    pos_ += n;
    return s;
  }

  void parse_header() {
    constexpr std::string_view arg = "gguf.header";
    need(4, arg, "magic");
    require(std::memcmp(bytes_.data(), "GGUF", 4) == 0, ErrorCode::io, arg,
            "bad magic (not a GGUF file)");
    pos_ = 4;
    out_.version_ = read<std::uint32_t>(arg, "version");
    require(out_.version_ == 2 || out_.version_ == 3, ErrorCode::io, arg, "unsupported version ",
            out_.version_, " (2 and 3 are read)");
    tensor_count_ = read<std::uint64_t>(arg, "tensor count");
    kv_count_ = read<std::uint64_t>(arg, "metadata count");
    // Each entry takes at least this many bytes, so larger counts cannot fit the file; checking
    // here keeps a forged count from reserving huge vectors.
    require(kv_count_ <= remaining() / (8 + 4 + 1), ErrorCode::io, arg, "metadata count ",
            kv_count_, " cannot fit in ", remaining(), " remaining bytes");
    require(tensor_count_ <= remaining() / (8 + 4 + 8 + 4 + 8), ErrorCode::io, arg, "tensor count ",
            tensor_count_, " cannot fit in ", remaining(), " remaining bytes");
    out_.kv_.reserve(kv_count_);
    out_.tensors_.reserve(tensor_count_);
  }

  void parse_kv(std::uint64_t i) {
    const std::string key_arg = detail::concat("gguf.kv[", i, "].key");
    const std::string_view key = read_string(key_arg, "key");
    require(!key.empty() && key.size() <= kMaxKeyBytes, ErrorCode::io, key_arg, "key length ",
            key.size(), " outside [1, ", kMaxKeyBytes, "]");
    require(out_.kv_index_.emplace(key, out_.kv_.size()).second, ErrorCode::io, key_arg,
            "duplicate key '", key, "'");
    const std::string value_arg = detail::concat("gguf.kv[", i, "].value");
    const auto type = read<std::uint32_t>(value_arg, "value type");
    out_.kv_.push_back({key, read_value(type, value_arg, 0)});
  }

  GgufValue read_value(std::uint32_t type, std::string_view arg, int depth) {
    require(known_value_type(type), ErrorCode::io, arg, "unknown value type ", type);
    GgufValue v;
    v.type_ = static_cast<GgufType>(type);
    if (v.type_ == GgufType::string) {
      v.str_ = read_string(arg, "string");
    } else if (v.type_ == GgufType::array) {
      read_array(v, arg, depth);
    } else {
      const std::uint64_t size = scalar_size(type);
      need(size, arg, "value");
      v.bits_ = load_scalar(bytes_.data() + pos_, v.type_);
      require(v.type_ != GgufType::boolean || v.bits_ <= 1, ErrorCode::io, arg, "bool byte ",
              v.bits_, " is neither 0 nor 1");
      pos_ += size;
    }
    return v;
  }

  void read_array(GgufValue& v, std::string_view arg, int depth) {
    require(depth < kMaxArrayDepth, ErrorCode::io, arg, "arrays nested deeper than ",
            kMaxArrayDepth);
    const auto elem = read<std::uint32_t>(arg, "array element type");
    require(known_value_type(elem), ErrorCode::io, arg, "unknown array element type ", elem);
    const auto count = read<std::uint64_t>(arg, "array length");
    v.array_type_ = static_cast<GgufType>(elem);
    v.array_size_ = count;
    // Smallest encoding of one element: a string is an 8-byte length, an array a 4-byte type and
    // an 8-byte count; a count that cannot fit is rejected before anything is reserved.
    const std::uint64_t min_elem = elem == static_cast<std::uint32_t>(GgufType::string) ? 8
                                   : elem == static_cast<std::uint32_t>(GgufType::array)
                                       ? 12
                                       : scalar_size(elem);
    require(count <= remaining() / min_elem, ErrorCode::io, arg, "array of ", count, " ",
            to_string(v.array_type_), " cannot fit in ", remaining(), " remaining bytes");
    if (v.array_type_ == GgufType::string) {
      v.strings_.reserve(count);
      for (std::uint64_t j = 0; j < count; ++j) {
        v.strings_.push_back(read_string(arg, "array string", j));
      }
    } else if (v.array_type_ == GgufType::array) {
      v.arrays_.reserve(count);
      for (std::uint64_t j = 0; j < count; ++j) {
        GgufValue inner;
        inner.type_ = GgufType::array;
        read_array(inner, arg, depth + 1);
        v.arrays_.push_back(std::move(inner));
      }
    } else {
      v.array_data_ = bytes_.data() + pos_;
      if (v.array_type_ == GgufType::boolean) {
        for (std::uint64_t j = 0; j < count; ++j) {
          require(std::to_integer<unsigned>(v.array_data_[j]) <= 1, ErrorCode::io, arg,
                  "bool element ", j, " is neither 0 nor 1");
        }
      }
      pos_ += count * min_elem;
    }
  }

  void parse_alignment() {
    const GgufValue* a = out_.find("general.alignment");
    if (a == nullptr) return;
    constexpr std::string_view arg = "gguf.alignment";
    const bool is_uint = a->type() == GgufType::u8 || a->type() == GgufType::u16 ||
                         a->type() == GgufType::u32 || a->type() == GgufType::u64;
    require(is_uint, ErrorCode::io, arg, "general.alignment is ", to_string(a->type()),
            ", not an unsigned integer");
    const auto value = a->as<std::uint64_t>(arg);
    require(std::has_single_bit(value), ErrorCode::io, arg, "general.alignment ", value,
            " is not a power of two");
    out_.alignment_ = value;
  }

  void parse_tensor_info(std::uint64_t i) {
    const std::string index_arg = detail::concat("gguf.tensor[", i, "]");
    GgufTensor t{};
    t.name = read_string(index_arg, "tensor name");
    const std::string arg = detail::concat("gguf.tensor[", t.name, "]");
    require(!t.name.empty(), ErrorCode::io, index_arg, "empty tensor name");
    require(out_.tensor_index_.emplace(t.name, out_.tensors_.size()).second, ErrorCode::io, arg,
            "duplicate tensor name");
    t.n_dims = read<std::uint32_t>(arg, "n_dims");
    require(t.n_dims >= 1 && t.n_dims <= 4, ErrorCode::io, arg, "n_dims ", t.n_dims,
            " outside [1, 4]");
    t.dims = {1, 1, 1, 1};
    t.n_elements = 1;
    for (std::uint32_t d = 0; d < t.n_dims; ++d) {
      t.dims[d] = read<std::uint64_t>(arg, "dimension", d);
      require(t.dims[d] >= 1, ErrorCode::io, arg, "dimension ", d, " is 0");
      require(checked_mul(t.n_elements, t.dims[d], &t.n_elements) &&
                  t.n_elements <= static_cast<std::uint64_t>(INT64_MAX),
              ErrorCode::io, arg, "element count overflows (dimension ", d, " = ", t.dims[d], ")");
    }
    const auto raw_type = read<std::uint32_t>(arg, "type");
    const TypeTraits* traits = find_type_traits(raw_type);
    require(traits != nullptr, ErrorCode::io, arg, "unknown ggml type ", raw_type);
    t.type = static_cast<GgmlType>(raw_type);
    // Rows are whole blocks: a K-quant tensor whose width is not a multiple of 256 is invalid.
    require(t.dims[0] % traits->block_elems == 0, ErrorCode::io, arg, "row width ", t.dims[0],
            " is not a multiple of the ", traits->name, " block size ", traits->block_elems);
    require(checked_mul(t.n_elements / traits->block_elems, traits->block_bytes, &t.bytes),
            ErrorCode::io, arg, "byte size overflows");
    t.offset = read<std::uint64_t>(arg, "offset");
    out_.tensors_.push_back(t);
  }

  void place_data() {
    const std::uint64_t align = out_.alignment_;
    std::uint64_t start = pos_ + (align - pos_ % align) % align;
    if (start < pos_) start = ~std::uint64_t{0};  // overflowed: surely past the end
    out_.data_offset_ = start;
    if (out_.tensors_.empty()) return;
    require(start <= bytes_.size(), ErrorCode::io, "gguf.data", "data section starts at ", start,
            " past the end of the file (", bytes_.size(), " bytes)");
    const std::uint64_t data_size = bytes_.size() - start;
    for (GgufTensor& t : out_.tensors_) {
      const std::string arg = detail::concat("gguf.tensor[", t.name, "]");
      require(t.offset % align == 0, ErrorCode::io, arg, "data offset ", t.offset,
              " is not a multiple of the alignment ", align);
      require(t.offset <= data_size && t.bytes <= data_size - t.offset, ErrorCode::io, arg,
              "data [", t.offset, ", +", t.bytes, ") lies past the end of the data section (",
              data_size, " bytes)");
      t.data = bytes_.data() + start + t.offset;
    }
  }

  std::span<const std::byte> bytes_;
  GgufFile& out_;
  std::uint64_t pos_ = 0;
  std::uint64_t kv_count_ = 0;
  std::uint64_t tensor_count_ = 0;
};

// ---- GgufFile ----------------------------------------------------------------------------

struct GgufFile::Mapping {
  void* addr = nullptr;
  std::size_t size = 0;
  Mapping() = default;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping() {
    if (addr != nullptr) munmap(addr, size);
  }
};

GgufFile::GgufFile() = default;
GgufFile::GgufFile(GgufFile&&) noexcept = default;
GgufFile& GgufFile::operator=(GgufFile&&) noexcept = default;
GgufFile::~GgufFile() = default;

GgufFile GgufFile::from_buffer(std::span<const std::byte> bytes) {
  GgufFile f;
  f.bytes_ = bytes;
  GgufParser(bytes, f).parse();
  return f;
}

GgufFile GgufFile::open(const std::string& path) {
  constexpr std::string_view arg = "gguf.path";
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  require(fd >= 0, ErrorCode::io, arg, "cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(ErrorCode::io, arg, "'", path, "' is not a readable regular file");
  }
  auto mapping = std::make_unique<Mapping>();
  mapping->size = static_cast<std::size_t>(st.st_size);
  if (mapping->size > 0) {
    void* p = mmap(nullptr, mapping->size, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail(ErrorCode::io, arg, "cannot map '", path, "': ", std::strerror(err));
    }
    mapping->addr = p;
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  GgufFile f;
  f.bytes_ = {static_cast<const std::byte*>(mapping->addr), mapping->size};
  f.mapping_ = std::move(mapping);
  GgufParser(f.bytes_, f).parse();
  return f;
}

const GgufValue* GgufFile::find(std::string_view key) const noexcept {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].value;
}

const GgufValue& GgufFile::at(std::string_view key) const {
  const GgufValue* v = find(key);
  require(v != nullptr, ErrorCode::out_of_range, key, "metadata key not in the file");
  return *v;
}

const GgufTensor* GgufFile::find_tensor(std::string_view name) const noexcept {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GgufTensor& GgufFile::tensor(std::string_view name) const {
  const GgufTensor* t = find_tensor(name);
  require(t != nullptr, ErrorCode::out_of_range, name, "tensor not in the file");
  return *t;
}

}  // namespace masskv::model

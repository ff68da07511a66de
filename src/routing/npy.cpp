// Routing traces as NumPy .npy files (format versions 1.0, 2.0 and 3.0): a magic string, a
// version, a little-endian header length, a Python dict literal describing the array, then the
// raw data. Only int32 ('<i4'), C order, 3-D [W, T, k] arrays are traces. Read from a file or from
// a stream that cannot seek (a pipe, a FIFO, /dev/stdin on one).
#include <array>
#include <cctype>
#include <cstring>
#include <fstream>
#include <limits>
#include <map>
#include <sstream>

#include "caracal/error.hpp"
#include "caracal/routing.hpp"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "traces are read and written as raw little-endian int32");

namespace caracal {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = sizeof(kMagic) - 1;
constexpr int64_t kChunkBytes = int64_t{16} << 20;  // progress is reported once per chunk
constexpr int64_t kMaxRoutes = std::numeric_limits<int32_t>::max();

[[noreturn]] void fail(const std::string& path, const std::string& problem) {
  throw Error("routing trace '" + path + "': " + problem);
}

// ---- Header dict ---------------------------------------------------------------------------
// The header is a Python literal such as
//   {'descr': '<i4', 'fortran_order': False, 'shape': (64, 4096, 8), }
// Values are kept as their text: strings unquoted, booleans as written, tuples as a list of ints.
struct HeaderValue {
  enum class Kind { kString, kBool, kTuple } kind = Kind::kString;
  std::string text;
  std::vector<int64_t> tuple;
};

class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& path) : text_(text), path_(path) {}

  std::map<std::string, HeaderValue> parse_dict() {
    std::map<std::string, HeaderValue> dict;
    expect('{');
    while (!consume('}')) {
      const std::string key = parse_string();
      expect(':');
      if (!dict.emplace(key, parse_value()).second) error("key '" + key + "' appears twice");
      if (!consume(',')) {
        expect('}');
        break;
      }
    }
    skip_space();
    if (pos_ != text_.size()) error("unexpected text after the closing '}'");
    return dict;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    constexpr size_t kShown = 200;  // enough to recognize a header, not a wall of text
    fail(path_, "malformed .npy header (" + what + " at offset " + std::to_string(pos_) +
                    "): " + text_.substr(0, kShown) + (text_.size() > kShown ? "..." : ""));
  }
  void skip_space() {
    while (pos_ < text_.size() && std::isspace(static_cast<unsigned char>(text_[pos_]))) ++pos_;
  }
  bool consume(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  void expect(char c) {
    if (!consume(c)) error(std::string("expected '") + c + "'");
  }
  bool consume_word(const char* word) {
    skip_space();
    const size_t n = std::strlen(word);
    if (text_.compare(pos_, n, word) != 0) return false;
    pos_ += n;
    return true;
  }

  std::string parse_string() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) error("expected a string");
    const char quote = text_[pos_++];
    const size_t end = text_.find(quote, pos_);
    if (end == std::string::npos) error("unterminated string");
    std::string s = text_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return s;
  }

  int64_t parse_int() {
    skip_space();
    const size_t begin = pos_;
    int64_t value = 0;
    while (pos_ < text_.size() && std::isdigit(static_cast<unsigned char>(text_[pos_]))) {
      const int digit = text_[pos_++] - '0';
      if (value > (std::numeric_limits<int64_t>::max() - digit) / 10) error("dimension too large");
      value = value * 10 + digit;
    }
    if (pos_ == begin) error("expected a non-negative integer");
    consume('L');  // Python 2 long suffix
    return value;
  }

  // "(a, b, c)", "(a,)" or "()".
  std::vector<int64_t> parse_tuple() {
    std::vector<int64_t> values;
    expect('(');
    while (!consume(')')) {
      values.push_back(parse_int());
      if (!consume(',')) {
        expect(')');
        break;
      }
    }
    return values;
  }

  HeaderValue parse_value() {
    HeaderValue v;
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == '(') {
      v.kind = HeaderValue::Kind::kTuple;
      v.tuple = parse_tuple();
    } else if (consume_word("True")) {
      v.kind = HeaderValue::Kind::kBool;
      v.text = "True";
    } else if (consume_word("False")) {
      v.kind = HeaderValue::Kind::kBool;
      v.text = "False";
    } else if (pos_ < text_.size() && (text_[pos_] == '\'' || text_[pos_] == '"')) {
      v.kind = HeaderValue::Kind::kString;
      v.text = parse_string();
    } else {
      error("expected a string, True/False or a tuple");
    }
    return v;
  }

  const std::string& text_;
  const std::string& path_;
  size_t pos_ = 0;
};

// ---- Reading -------------------------------------------------------------------------------
struct TraceHeader {
  std::vector<int64_t> shape;
};

std::string shape_text(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '(';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << (shape.size() == 1 ? ",)" : ")");
  return os.str();
}

const HeaderValue& require_key(const std::map<std::string, HeaderValue>& dict, const char* key,
                               HeaderValue::Kind kind, const std::string& path) {
  const auto it = dict.find(key);
  if (it == dict.end()) fail(path, std::string(".npy header has no '") + key + "' entry");
  if (it->second.kind != kind) fail(path, std::string(".npy header entry '") + key + "' has the wrong type");
  return it->second;
}

void check_header_dict(const std::map<std::string, HeaderValue>& dict, const std::string& path) {
  for (const auto& entry : dict) {
    const std::string& key = entry.first;
    if (key != "descr" && key != "fortran_order" && key != "shape") {
      fail(path, "unexpected key '" + key + "' in the .npy header");
    }
  }
  const std::string& descr = require_key(dict, "descr", HeaderValue::Kind::kString, path).text;
  if (descr != "<i4") {
    fail(path, "dtype '" + descr + "' is not supported: expected '<i4' (little-endian int32)");
  }
  if (require_key(dict, "fortran_order", HeaderValue::Kind::kBool, path).text != "False") {
    fail(path, "array is in Fortran order (fortran_order: True): expected C order");
  }
  const std::vector<int64_t>& shape = require_key(dict, "shape", HeaderValue::Kind::kTuple, path).tuple;
  if (shape.size() != 3) {
    fail(path, "shape " + shape_text(shape) + " is " + std::to_string(shape.size()) +
                   "-D: expected 3-D [world_size, tokens_per_rank, top_k]");
  }
  for (const int64_t d : shape) {
    if (d == 0) fail(path, "shape " + shape_text(shape) + " has a zero dimension: expected all >= 1");
  }
}

uint32_t read_little_endian(const unsigned char* bytes, int count) {
  uint32_t value = 0;
  for (int i = count - 1; i >= 0; --i) value = value << 8 | bytes[i];
  return value;
}

void read_exactly(std::ifstream& in, char* data, int64_t bytes, const std::string& path,
                  const char* what) {
  in.read(data, bytes);
  if (in.gcount() != bytes) fail(path, std::string("file ends inside the ") + what);
}

// Bytes from the read position to the end, or -1 for a stream that cannot seek (a pipe, a FIFO,
// /dev/stdin on either), whose size is known only once it has been read.
int64_t bytes_left(std::ifstream& in) {
  std::streambuf& buffer = *in.rdbuf();
  const std::streampos here = buffer.pubseekoff(0, std::ios::cur, std::ios::in);
  if (here == std::streampos(-1)) return -1;
  const std::streampos end = buffer.pubseekoff(0, std::ios::end, std::ios::in);
  if (buffer.pubseekpos(here, std::ios::in) != here || end == std::streampos(-1)) return -1;
  return static_cast<int64_t>(end - here);
}

// Reads up to `bytes` bytes into `out`, grown a chunk at a time as they arrive, so that a size
// past the end of a stream takes at most one chunk more than the stream holds; `progress` after
// each chunk. Returns the bytes read: fewer than `bytes` where the stream ends first.
template <typename Container>
int64_t read_chunks(std::ifstream& in, Container& out, int64_t bytes, const ProgressFn& progress) {
  constexpr auto kElement = static_cast<int64_t>(sizeof(typename Container::value_type));
  int64_t done = 0;
  while (done < bytes) {
    const int64_t chunk = std::min(kChunkBytes, bytes - done);
    out.resize(static_cast<size_t>((done + chunk + kElement - 1) / kElement));
    in.read(reinterpret_cast<char*>(out.data()) + done, chunk);
    done += in.gcount();
    if (in.gcount() != chunk) break;
    if (progress) progress(done, bytes);
  }
  return done;
}

TraceHeader read_header(std::ifstream& in, const std::string& path) {
  std::array<char, kMagicSize + 2> preamble{};
  in.read(preamble.data(), static_cast<std::streamsize>(preamble.size()));
  if (in.gcount() < static_cast<std::streamsize>(kMagicSize) ||
      std::memcmp(preamble.data(), kMagic, kMagicSize) != 0) {
    fail(path, "not a .npy file (missing the \\x93NUMPY magic string)");
  }
  if (in.gcount() != static_cast<std::streamsize>(preamble.size())) fail(path, "file ends inside the .npy preamble");
  const int major = static_cast<unsigned char>(preamble[kMagicSize]);
  const int minor = static_cast<unsigned char>(preamble[kMagicSize + 1]);
  if (major < 1 || major > 3 || minor != 0) {
    fail(path, ".npy format version " + std::to_string(major) + "." + std::to_string(minor) +
                   " is not supported: expected 1.0, 2.0 or 3.0");
  }
  // Version 1.0 stores the header length in 2 bytes, later versions in 4.
  const int length_bytes = major == 1 ? 2 : 4;
  std::array<unsigned char, 4> length{};
  read_exactly(in, reinterpret_cast<char*>(length.data()), length_bytes, path, ".npy header length");
  const int64_t header_length = read_little_endian(length.data(), length_bytes);
  const int64_t left = bytes_left(in);
  if (left >= 0 && header_length > left) fail(path, "file ends inside the .npy header");
  std::string header;
  if (read_chunks(in, header, header_length, nullptr) != header_length) fail(path, "file ends inside the .npy header");

  TraceHeader result;
  const auto dict = HeaderParser(header, path).parse_dict();
  check_header_dict(dict, path);
  result.shape = dict.at("shape").tuple;
  return result;
}

int64_t route_count(const std::vector<int64_t>& shape, const std::string& path) {
  int64_t count = 1;
  for (const int64_t d : shape) {
    if (d > kMaxRoutes / count) {
      fail(path, "shape " + shape_text(shape) +
                     " holds 2^31 or more routes: at most 2^31 - 1 are supported (32-bit indices)");
    }
    count *= d;
  }
  return count;
}

[[noreturn]] void fail_truncated(const std::string& path, const std::vector<int64_t>& shape, int64_t expected,
                                 int64_t available) {
  fail(path, "data is truncated: shape " + shape_text(shape) + " needs " + std::to_string(expected) +
                 " bytes, the file holds " + std::to_string(available));
}

void check_ids(const Routing& routing, const std::string& path) {
  for (size_t i = 0; i < routing.topk_idx.size(); ++i) {
    const int32_t id = routing.topk_idx[i];
    if (id < -1) {
      const int64_t k = routing.top_k, t = routing.tokens_per_rank;
      const int64_t flat = static_cast<int64_t>(i);
      fail(path, "entry [" + std::to_string(flat / (k * t)) + ", " + std::to_string(flat / k % t) +
                     ", " + std::to_string(flat % k) + "] is " + std::to_string(id) +
                     ": expected an expert id >= 0 or -1 for an empty slot");
    }
  }
}

// ---- Writing -------------------------------------------------------------------------------
// Version 1.0 header, padded with spaces so that the data starts on a 64-byte boundary.
std::string make_header(const Routing& routing) {
  std::string dict = "{'descr': '<i4', 'fortran_order': False, 'shape': (" +
                     std::to_string(routing.world_size) + ", " +
                     std::to_string(routing.tokens_per_rank) + ", " + std::to_string(routing.top_k) +
                     "), }";
  const size_t unpadded = kMagicSize + 2 + 2 + dict.size() + 1;  // + the final '\n'
  dict.append((64 - unpadded % 64) % 64, ' ');
  dict.push_back('\n');
  std::string header(kMagic, kMagicSize);
  header.push_back('\x01');
  header.push_back('\x00');
  header.push_back(static_cast<char>(dict.size() & 0xff));
  header.push_back(static_cast<char>(dict.size() >> 8));
  return header + dict;
}

}  // namespace

Routing load_routing_npy(const std::string& path, const ProgressFn& progress) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open the file for reading (missing or unreadable)");
  const TraceHeader header = read_header(in, path);

  // A file's size is checked before reading; a stream that cannot seek is read to the data's end
  // (a chunk at a time), then must end there.
  const int64_t expected = route_count(header.shape, path) * static_cast<int64_t>(sizeof(int32_t));
  const int64_t available = bytes_left(in);
  if (available >= 0 && available < expected) fail_truncated(path, header.shape, expected, available);
  if (available > expected) {
    fail(path, std::to_string(available - expected) + " bytes of trailing garbage after the " +
                   std::to_string(expected) + " data bytes of shape " + shape_text(header.shape));
  }

  Routing routing;
  routing.world_size = header.shape[0];
  routing.tokens_per_rank = header.shape[1];
  routing.top_k = header.shape[2];
  if (available >= 0) routing.topk_idx.reserve(static_cast<size_t>(expected) / sizeof(int32_t));
  const int64_t read = read_chunks(in, routing.topk_idx, expected, progress);
  if (read != expected) {
    if (available >= 0) fail(path, "read failed after " + std::to_string(read) + " data bytes");
    fail_truncated(path, header.shape, expected, read);
  }
  if (available < 0 && in.peek() != std::ifstream::traits_type::eof()) {
    fail(path, "trailing garbage after the " + std::to_string(expected) + " data bytes of shape " +
                   shape_text(header.shape));
  }
  check_ids(routing, path);
  return routing;
}

void save_routing_npy(const Routing& routing, const std::string& path) {
  // Any non-negative int32 id may be saved: the number of experts is not known here.
  routing.validate(std::numeric_limits<int32_t>::max());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) fail(path, "cannot open the file for writing");
  const std::string header = make_header(routing);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(reinterpret_cast<const char*>(routing.topk_idx.data()),
            static_cast<std::streamsize>(routing.topk_idx.size() * sizeof(int32_t)));
  out.close();
  if (!out) fail(path, "write failed");
}

}  // namespace caracal

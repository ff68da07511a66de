// Routing traces as NumPy .npy files (format versions 1.0, 2.0 and 3.0): a magic string, a
// version, a little-endian header length, a Python dict literal describing the array, then the
// raw data. Only int32 ('<i4'), C order, 3-D [W, T, k] arrays are traces.
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
  int64_t data_offset = 0;  // bytes before the data
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

int64_t file_size(std::ifstream& in) {
  const std::streampos here = in.tellg();
  in.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(in.tellg());
  in.seekg(here);
  return size;
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
  const uint32_t header_length = read_little_endian(length.data(), length_bytes);
  if (header_length > file_size(in) - in.tellg()) fail(path, "file ends inside the .npy header");
  std::string header(header_length, '\0');
  read_exactly(in, header.data(), header_length, path, ".npy header");

  TraceHeader result;
  const auto dict = HeaderParser(header, path).parse_dict();
  check_header_dict(dict, path);
  result.shape = dict.at("shape").tuple;
  result.data_offset = static_cast<int64_t>(kMagicSize) + 2 + length_bytes + header_length;
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

void read_data(std::ifstream& in, Routing& routing, const std::string& path,
               const ProgressFn& progress) {
  char* data = reinterpret_cast<char*>(routing.topk_idx.data());
  const int64_t total = static_cast<int64_t>(routing.topk_idx.size() * sizeof(int32_t));
  for (int64_t done = 0; done < total;) {
    const int64_t chunk = std::min(kChunkBytes, total - done);
    in.read(data + done, chunk);
    if (in.gcount() != chunk) fail(path, "read failed after " + std::to_string(done) + " data bytes");
    done += chunk;
    if (progress) progress(done, total);
  }
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

  const int64_t expected = route_count(header.shape, path) * static_cast<int64_t>(sizeof(int32_t));
  const int64_t available = file_size(in) - header.data_offset;
  if (available < expected) {
    fail(path, "data is truncated: shape " + shape_text(header.shape) + " needs " +
                   std::to_string(expected) + " bytes, the file holds " + std::to_string(available));
  }
  if (available > expected) {
    fail(path, std::to_string(available - expected) + " bytes of trailing garbage after the " +
                   std::to_string(expected) + " data bytes of shape " + shape_text(header.shape));
  }

  Routing routing;
  routing.world_size = header.shape[0];
  routing.tokens_per_rank = header.shape[1];
  routing.top_k = header.shape[2];
  routing.topk_idx.resize(static_cast<size_t>(expected) / sizeof(int32_t));
  read_data(in, routing, path, progress);
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

#include "services/serving/json_constraint.h"

#include <algorithm>

namespace moe::serving {

using json_internal::Node;
using json_internal::TrieNode;

namespace {

enum FrameKind : uint8_t { kRoot, kObject, kKey, kArray, kString, kNumber, kLiteral };
enum RootPhase : uint8_t { kBefore, kAfter };
enum ObjectPhase : uint8_t { kObjOpen, kObjKey, kObjColon, kObjValue, kObjComma };
enum ArrayPhase : uint8_t { kArrOpen, kArrValue, kArrComma };
enum NumberPhase : uint8_t {
  kNumSign,
  kNumZero,
  kNumInt,
  kNumDot,
  kNumFrac,
  kNumE,
  kNumESign,
  kNumExp
};
// Where a string's lexer stands (Frame::sub of kString and kKey frames).
enum StringState : uint8_t {
  kStrNormal,
  kStrEscape,
  // \uXXXX in values: U1D after a first digit D, ...High inside a high
  // surrogate, then the \uDC00-\uDFFF that must follow it.
  kStrU0,
  kStrU1,
  kStrU1D,
  kStrU2,
  kStrU2High,
  kStrU3,
  kStrU3High,
  kStrLowBackslash,
  kStrLowU,
  kStrL0,
  kStrL1,
  kStrL2,
  kStrL3,
  // \u00xx in keys (canonical: control characters only, lower case).
  kStrK0,
  kStrK1,
  kStrK2,
  kStrK3Zero,
  kStrK3One,
  // UTF-8 continuation bytes still due; E0/ED/F0/F4 narrow the first one
  // (no overlong forms, no surrogates, nothing above U+10FFFF).
  kStrC1,
  kStrC2,
  kStrC3,
  kStrE0,
  kStrED,
  kStrF0,
  kStrF4,
};

// Object frames: a = properties seen, b = properties that may still come
// (unseen, and fitting the depth left), sub = the property whose value is
// next, flags & kAdditionalOk: other keys may come.
constexpr uint8_t kAdditionalOk = 1;
constexpr uint8_t kPendingAdditional = 64;
// Number frames: a = magnitude (integers), b = digit counts, flags below.
constexpr uint8_t kNegative = 1;
// Key frames: a = code points, b = key-trie node (as int64; -1 off the trie).
// String frames: a = code points. Literal frames: a = literal-trie node.
// Array frames: a = elements begun.

constexpr int kMaxFrames = kJsonMaxDepth + 2;

bool IsWhitespace(uint8_t c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }
bool IsDigit(uint8_t c) { return c >= '0' && c <= '9'; }
bool IsHex(uint8_t c) { return IsDigit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F'); }
bool In(uint8_t c, uint8_t lo, uint8_t hi) { return c >= lo && c <= hi; }

// The next lexer state of a string after `c`, or -1 when `c` may not come.
// *starts: `c` begins a code point; *closes: `c` is the closing quote.
// canonical: keys, which take only the escapes a serializer writes.
int LexString(uint8_t state, uint8_t c, bool canonical, bool* starts, bool* closes) {
  *starts = false;
  *closes = false;
  switch (state) {
    case kStrNormal:
      if (c == '"') {
        *closes = true;
        return kStrNormal;
      }
      if (c < 0x20) return -1;
      *starts = true;
      if (c == '\\') return kStrEscape;
      if (c < 0x80) return kStrNormal;
      if (c < 0xC2) return -1;
      if (c < 0xE0) return kStrC1;
      if (c == 0xE0) return kStrE0;
      if (c == 0xED) return kStrED;
      if (c < 0xF0) return kStrC2;
      if (c == 0xF0) return kStrF0;
      if (c < 0xF4) return kStrC3;
      if (c == 0xF4) return kStrF4;
      return -1;
    case kStrEscape:
      switch (c) {
        case '"':
        case '\\':
        case 'b':
        case 'f':
        case 'n':
        case 'r':
        case 't':
          return kStrNormal;
        case '/':
          return canonical ? -1 : kStrNormal;
        case 'u':
          return canonical ? kStrK0 : kStrU0;
        default:
          return -1;
      }
    case kStrU0:
      if (!IsHex(c)) return -1;
      return c == 'd' || c == 'D' ? kStrU1D : kStrU1;
    case kStrU1:
      return IsHex(c) ? kStrU2 : -1;
    case kStrU1D:  // D0-D7: plain; D8-DB: high surrogate; DC-DF: a lone low one
      if (In(c, '0', '7')) return kStrU2;
      if (In(c, '8', '9') || In(c, 'a', 'b') || In(c, 'A', 'B')) return kStrU2High;
      return -1;
    case kStrU2:
      return IsHex(c) ? kStrU3 : -1;
    case kStrU2High:
      return IsHex(c) ? kStrU3High : -1;
    case kStrU3:
      return IsHex(c) ? kStrNormal : -1;
    case kStrU3High:
      return IsHex(c) ? kStrLowBackslash : -1;
    case kStrLowBackslash:
      return c == '\\' ? kStrLowU : -1;
    case kStrLowU:
      return c == 'u' ? kStrL0 : -1;
    case kStrL0:
      return c == 'd' || c == 'D' ? kStrL1 : -1;
    case kStrL1:
      return In(c, 'c', 'f') || In(c, 'C', 'F') ? kStrL2 : -1;
    case kStrL2:
      return IsHex(c) ? kStrL3 : -1;
    case kStrL3:
      return IsHex(c) ? kStrNormal : -1;
    case kStrK0:
      return c == '0' ? kStrK1 : -1;
    case kStrK1:
      return c == '0' ? kStrK2 : -1;
    case kStrK2:
      return c == '0' ? kStrK3Zero : c == '1' ? kStrK3One : -1;
    case kStrK3Zero:  // \b \t \n \f \r have their short escapes
      return In(c, '0', '7') || c == 'b' || c == 'e' || c == 'f' ? kStrNormal : -1;
    case kStrK3One:
      return IsDigit(c) || In(c, 'a', 'f') ? kStrNormal : -1;
    case kStrC1:
      return In(c, 0x80, 0xBF) ? kStrNormal : -1;
    case kStrC2:
      return In(c, 0x80, 0xBF) ? kStrC1 : -1;
    case kStrC3:
      return In(c, 0x80, 0xBF) ? kStrC2 : -1;
    case kStrE0:
      return In(c, 0xA0, 0xBF) ? kStrC1 : -1;
    case kStrED:
      return In(c, 0x80, 0x9F) ? kStrC1 : -1;
    case kStrF0:
      return In(c, 0x90, 0xBF) ? kStrC2 : -1;
    case kStrF4:
      return In(c, 0x80, 0x8F) ? kStrC2 : -1;
    default:
      return -1;
  }
}

// Number frames' digit counts, packed in Frame::b.
uint64_t IntDigits(uint64_t b) { return b & 0xFF; }
uint64_t FracDigits(uint64_t b) { return (b >> 8) & 0xFF; }
uint64_t ExpDigits(uint64_t b) { return (b >> 16) & 0xFF; }
uint64_t PackDigits(uint64_t i, uint64_t f, uint64_t e) { return i | f << 8 | e << 16; }

using Wide = __int128;
constexpr Wide kTwo63 = static_cast<Wide>(1) << 63;

// Whether an integer prefix (sign, phase, magnitude) can still be completed
// to an integer in [minimum, maximum]: its completions are the magnitude
// itself and, for j >= 1 more digits, [m 10^j, m 10^j + 10^j - 1].
bool IntegerFeasible(const Node& n, uint8_t phase, bool negative, uint64_t magnitude) {
  const Wide lo = n.minimum, hi = n.maximum;
  if (phase == kNumSign) return lo <= 0;  // "-0" or any negative
  if (phase == kNumZero) return lo <= 0 && hi >= 0;
  Wide scale = 1;
  for (int j = 0; j <= 20; ++j, scale *= 10) {
    const Wide low = static_cast<Wide>(magnitude) * scale;
    if (low > kTwo63) break;
    const Wide high = low + scale - 1;
    const Wide a = negative ? -high : low, b = negative ? -low : high;
    if (a <= hi && b >= lo) return true;
  }
  return false;
}

}  // namespace

// One byte's step, for every parse. Parses are worked on in a Local copy
// and emitted into the output matcher, merging duplicates.
class JsonMatcher::Stepper {
 public:
  Stepper(const JsonGrammar& g, JsonMatcher* out)
      : nodes_(g.nodes()), tries_(g.tries()), out_(out) {}

  struct Local {
    Local() {}  // f[i] is written before it is read: no zeroing per byte
    union {
      Frame f[kMaxFrames];
    };
    int n = 0;
    uint8_t ws = 0;
    uint8_t depth = 0;
  };

  void Load(const JsonMatcher& m, const Stack& s, Local* st) const {
    std::copy_n(m.frames_.data() + s.begin, s.size, st->f);
    st->n = s.size;
    st->ws = s.ws;
    st->depth = s.depth;
  }

  // Emits the successors of `st` on `c` (none when no parse takes it).
  void Feed(Local& st, uint8_t c) {
    const bool ws = IsWhitespace(c);
    for (;;) {
      Frame& top = st.f[st.n - 1];
      switch (top.kind) {
        case kNumber: {
          if (NumberStep(&top, c)) return Taken(st);
          if (!NumberComplete(top)) return;
          --st.n;  // the number ends; its container takes c
          continue;
        }
        case kLiteral: {
          const TrieNode& t = tries_[top.a];
          const int32_t next = t.Child(c);
          if (next >= 0) {
            if (tries_[next].value >= 0 && tries_[next].next.empty()) {
              --st.n;  // nothing can extend it: done now
            } else {
              top.a = static_cast<uint64_t>(next);
            }
            return Taken(st);
          }
          if (t.value < 0) return;
          --st.n;  // a whole literal that c does not extend
          continue;
        }
        case kString: {
          bool starts, closes;
          const int next = LexString(top.sub, c, /*canonical=*/false, &starts, &closes);
          if (next < 0) return;
          const Node& n = nodes_[top.node];
          if (closes) {
            if (top.a < n.min_length) return;
            --st.n;
          } else {
            if (starts) {
              if (top.a >= n.max_length) return;
              ++top.a;
            }
            top.sub = static_cast<uint8_t>(next);
          }
          return Taken(st);
        }
        case kKey:
          return Key(st, c);
        case kRoot: {
          if (ws) return Whitespace(st, c);
          if (top.phase != kBefore) return;
          top.phase = kAfter;
          return StartValue(st, top.node, c);
        }
        case kObject:
          return ws ? Whitespace(st, c) : Object(st, c);
        case kArray:
          return ws ? Whitespace(st, c) : Array(st, c);
        default:
          return;
      }
    }
  }

 private:
  // A run of whitespace is one byte: a space or a line break (ws: the bytes
  // of the run taken, 0 or 1).
  void Whitespace(Local& st, uint8_t c) {
    if (st.ws != 0 || (c != ' ' && c != '\n')) return;
    st.ws = 1;
    Emit(st);
  }

  // A byte other than whitespace between tokens was taken.
  void Taken(Local& st) {
    st.ws = 0;
    Emit(st);
  }

  void Key(Local& st, uint8_t c) {
    Frame& key = st.f[st.n - 1];
    Frame& object = st.f[st.n - 2];
    bool starts, closes;
    const int next = LexString(key.sub, c, /*canonical=*/true, &starts, &closes);
    if (next < 0) return;
    const int64_t at = static_cast<int64_t>(key.b);
    if (closes) {
      const int32_t property = at >= 0 ? tries_[at].value : -1;
      if (property >= 0) {
        // A listed name is never an additional key, even when seen.
        if (!(object.b >> property & 1)) return;
        object.sub = static_cast<uint8_t>(property);
      } else {
        if (!(object.flags & kAdditionalOk)) return;
        object.sub = kPendingAdditional;
      }
      object.phase = kObjKey;
      --st.n;
      return Taken(st);
    }
    if (starts) {
      if (key.a >= static_cast<uint64_t>(kJsonMaxStringLength)) return;
      ++key.a;
    }
    key.sub = static_cast<uint8_t>(next);
    const int32_t child = at >= 0 ? tries_[at].Child(c) : -1;
    // Without other keys, the name must stay on the way to a property that
    // may still come.
    if (!(object.flags & kAdditionalOk) && (child < 0 || (tries_[child].mask & object.b) == 0)) {
      return;
    }
    key.b = static_cast<uint64_t>(static_cast<int64_t>(child));
    Taken(st);
  }

  static bool KeyPossible(const Frame& object) {
    return object.b != 0 || (object.flags & kAdditionalOk);
  }

  void Object(Local& st, uint8_t c) {
    Frame& top = st.f[st.n - 1];
    const Node& n = nodes_[top.node];
    const bool can_close = (n.required & ~top.a) == 0;
    switch (top.phase) {
      case kObjOpen:
      case kObjComma:
        if (c == '"' && KeyPossible(top)) {
          Frame key;
          key.kind = kKey;
          key.node = top.node;
          key.b = static_cast<uint64_t>(static_cast<int64_t>(n.key_trie));
          st.f[st.n++] = key;
          return Taken(st);
        }
        if (c == '}' && top.phase == kObjOpen && can_close) return Close(st);
        return;
      case kObjKey:
        if (c != ':') return;
        top.phase = kObjColon;
        return Taken(st);
      case kObjColon: {
        int32_t child = n.additional;
        if (top.sub != kPendingAdditional) {
          child = n.properties[top.sub];
          top.a |= uint64_t{1} << top.sub;
          top.b &= ~(uint64_t{1} << top.sub);
        }
        top.sub = 0;
        top.phase = kObjValue;
        return StartValue(st, child, c);
      }
      case kObjValue:
        if (c == ',' && KeyPossible(top)) {
          top.phase = kObjComma;
          return Taken(st);
        }
        if (c == '}' && can_close) return Close(st);
        return;
      default:
        return;
    }
  }

  void Array(Local& st, uint8_t c) {
    Frame& top = st.f[st.n - 1];
    const Node& n = nodes_[top.node];
    const bool more = top.a < n.max_items && nodes_[n.items].min_depth <= kJsonMaxDepth - st.depth;
    const bool can_close = top.a >= n.min_items;
    switch (top.phase) {
      case kArrOpen:
      case kArrComma:
        if (c == ']' && top.phase == kArrOpen) {
          if (can_close) Close(st);
          return;
        }
        if (!more) return;
        ++top.a;
        top.phase = kArrValue;
        return StartValue(st, n.items, c);
      case kArrValue:
        if (c == ',' && more) {
          top.phase = kArrComma;
          return Taken(st);
        }
        if (c == ']' && can_close) return Close(st);
        return;
      default:
        return;
    }
  }

  void Close(Local& st) {
    --st.n;
    --st.depth;
    Taken(st);
  }

  // The value of `node` begins with `c`: one successor per leaf that takes
  // it and fits in the depth left.
  void StartValue(Local& st, int32_t node, uint8_t c) {
    const int left = kJsonMaxDepth - st.depth;
    st.ws = 0;
    for (int32_t leaf : nodes_[node].leaves) {
      const Node& n = nodes_[leaf];
      if (n.min_depth > left) continue;
      Frame f;
      f.node = leaf;
      int opens = 0;
      switch (n.kind) {
        case Node::kObject:
          if (c != '{') continue;
          f.kind = kObject;
          f.phase = kObjOpen;
          for (size_t i = 0; i < n.properties.size(); ++i) {
            if (nodes_[n.properties[i]].min_depth <= left - 1) f.b |= uint64_t{1} << i;
          }
          if (n.additional >= 0 && nodes_[n.additional].min_depth <= left - 1) {
            f.flags = kAdditionalOk;
          }
          opens = 1;
          break;
        case Node::kArray:
          if (c != '[') continue;
          f.kind = kArray;
          f.phase = kArrOpen;
          opens = 1;
          break;
        case Node::kString:
          if (c != '"') continue;
          f.kind = kString;
          break;
        case Node::kInteger:
        case Node::kNumber:
          if (!NumberStart(n, c, &f)) continue;
          break;
        case Node::kLiteral: {
          const int32_t next = tries_[n.literal_trie].Child(c);
          if (next < 0) continue;
          if (tries_[next].value >= 0 && tries_[next].next.empty()) {
            Emit(st);  // a one-byte literal: already whole
            continue;
          }
          f.kind = kLiteral;
          f.a = static_cast<uint64_t>(next);
          break;
        }
        default:
          continue;
      }
      st.f[st.n++] = f;
      st.depth += opens;
      Emit(st);
      st.depth -= opens;
      --st.n;
    }
  }

  bool NumberStart(const Node& n, uint8_t c, Frame* f) const {
    f->kind = kNumber;
    if (c == '-') {
      f->phase = kNumSign;
      f->flags = kNegative;
    } else if (c == '0') {
      f->phase = kNumZero;
      f->b = PackDigits(1, 0, 0);
    } else if (In(c, '1', '9')) {
      f->phase = kNumInt;
      f->b = PackDigits(1, 0, 0);
      if (n.kind == Node::kInteger) f->a = c - '0';
    } else {
      return false;
    }
    return n.kind != Node::kInteger || IntegerFeasible(n, f->phase, f->flags & kNegative, f->a);
  }

  bool NumberStep(Frame* f, uint8_t c) const {
    const Node& n = nodes_[f->node];
    const bool integer = n.kind == Node::kInteger;
    uint64_t i = IntDigits(f->b), fr = FracDigits(f->b), e = ExpDigits(f->b);
    uint64_t magnitude = f->a;
    uint8_t phase = f->phase;
    const bool digit = IsDigit(c);
    const bool exp = !integer && (c == 'e' || c == 'E');
    switch (f->phase) {
      case kNumSign:
        if (!digit) return false;
        phase = c == '0' ? kNumZero : kNumInt;
        i = 1;
        magnitude = integer ? c - '0' : 0;
        break;
      case kNumZero:
        if (!integer && c == '.') {
          phase = kNumDot;
        } else if (exp) {
          phase = kNumE;
        } else {
          return false;
        }
        break;
      case kNumInt:
        if (digit) {
          if (integer) {
            const Wide next = static_cast<Wide>(magnitude) * 10 + (c - '0');
            if (next > kTwo63) return false;
            magnitude = static_cast<uint64_t>(next);
          } else if (i >= static_cast<uint64_t>(kJsonMaxIntegerDigits)) {
            return false;
          }
          ++i;
        } else if (!integer && c == '.') {
          phase = kNumDot;
        } else if (exp) {
          phase = kNumE;
        } else {
          return false;
        }
        break;
      case kNumDot:
        if (!digit) return false;
        phase = kNumFrac;
        fr = 1;
        break;
      case kNumFrac:
        if (digit && fr < static_cast<uint64_t>(kJsonMaxFractionDigits)) {
          ++fr;
        } else if (exp) {
          phase = kNumE;
        } else {
          return false;
        }
        break;
      case kNumE:
        if (c == '+' || c == '-') {
          phase = kNumESign;
        } else if (digit) {
          phase = kNumExp;
          e = 1;
        } else {
          return false;
        }
        break;
      case kNumESign:
        if (!digit) return false;
        phase = kNumExp;
        e = 1;
        break;
      case kNumExp:
        if (!digit || e >= static_cast<uint64_t>(kJsonMaxExponentDigits)) return false;
        ++e;
        break;
      default:
        return false;
    }
    if (integer && !IntegerFeasible(n, phase, f->flags & kNegative, magnitude)) return false;
    f->phase = phase;
    f->a = magnitude;
    f->b = PackDigits(i, fr, e);
    return true;
  }

 public:
  bool NumberComplete(const Frame& f) const {
    const Node& n = nodes_[f.node];
    if (n.kind == Node::kInteger) {
      if (f.phase != kNumZero && f.phase != kNumInt) return false;
      const Wide v = (f.flags & kNegative) ? -static_cast<Wide>(f.a) : static_cast<Wide>(f.a);
      return v >= n.minimum && v <= n.maximum;
    }
    return f.phase == kNumZero || f.phase == kNumInt || f.phase == kNumFrac || f.phase == kNumExp;
  }

  // Whether a parse has taken a whole top-level value.
  bool Complete(const JsonMatcher& m, const Stack& s) const {
    const Frame* f = m.frames_.data() + s.begin;
    if (f[0].phase != kAfter) return false;
    if (s.size == 1) return true;
    if (s.size != 2) return false;
    if (f[1].kind == kNumber) return NumberComplete(f[1]);
    return f[1].kind == kLiteral && tries_[f[1].a].value >= 0;
  }

 private:
  // Appends st as a parse of the output unless it is there already or the
  // output holds kJsonMaxParses parses.
  void Emit(const Local& st) {
    JsonMatcher& out = *out_;
    for (const Stack& s : out.stacks_) {
      if (s.size == st.n && s.ws == st.ws && s.depth == st.depth &&
          std::equal(st.f, st.f + st.n, out.frames_.data() + s.begin)) {
        return;
      }
    }
    if (out.stacks_.size() >= static_cast<size_t>(kJsonMaxParses)) return;
    Stack s;
    s.begin = static_cast<uint32_t>(out.frames_.size());
    s.size = static_cast<uint8_t>(st.n);
    s.ws = st.ws;
    s.depth = st.depth;
    out.frames_.insert(out.frames_.end(), st.f, st.f + st.n);
    out.stacks_.push_back(s);
  }

  const std::vector<Node>& nodes_;
  const std::vector<TrieNode>& tries_;
  JsonMatcher* out_;
};

JsonMatcher::JsonMatcher(const JsonGrammar& grammar) : grammar_(&grammar) {
  Frame root;
  root.kind = kRoot;
  root.phase = kBefore;
  root.node = grammar.root();
  frames_.push_back(root);
  stacks_.push_back(Stack{0, 1, 0, 0});
}

bool JsonMatcher::StepInto(uint8_t byte, JsonMatcher* out) const {
  out->grammar_ = grammar_;
  out->frames_.clear();
  out->stacks_.clear();
  Stepper step(*grammar_, out);
  Stepper::Local st;
  for (const Stack& s : stacks_) {
    step.Load(*this, s, &st);
    step.Feed(st, byte);
  }
  return !out->stacks_.empty();
}

bool JsonMatcher::Advance(std::string_view bytes) {
  if (bytes.empty()) return true;
  JsonMatcher a(*this), b(*this);
  const JsonMatcher* from = this;
  for (size_t i = 0; i < bytes.size(); ++i) {
    JsonMatcher* to = (i % 2 == 0) ? &a : &b;
    if (!from->StepInto(static_cast<uint8_t>(bytes[i]), to)) return false;
    from = to;
  }
  *this = *from;
  return true;
}

bool JsonMatcher::CanAdvance(std::string_view bytes) const {
  JsonMatcher copy(*this);
  return copy.Advance(bytes);
}

bool JsonMatcher::IsComplete() const {
  Stepper step(*grammar_, nullptr);
  for (const Stack& s : stacks_) {
    if (step.Complete(*this, s)) return true;
  }
  return false;
}

bool JsonMatcher::IsDone() const {
  if (!IsComplete()) return false;
  bool all_closed = true;
  for (const Stack& s : stacks_) all_closed &= s.size == 1;
  if (all_closed) return true;  // only whitespace is left to the top level
  JsonMatcher scratch(*this);
  for (int c = 0; c < 256; ++c) {
    if (!IsWhitespace(static_cast<uint8_t>(c)) && StepInto(static_cast<uint8_t>(c), &scratch)) {
      return false;
    }
  }
  return true;
}

int64_t JsonMatcher::PlainRoom() const {
  if (stacks_.size() != 1) return -1;
  const Frame& top = frames_[stacks_[0].begin + stacks_[0].size - 1];
  if (top.kind != kString || top.sub != kStrNormal) return -1;
  const uint64_t max = grammar_->nodes()[top.node].max_length;
  return top.a < max ? static_cast<int64_t>(max - top.a) : 0;
}

}  // namespace moe::serving

// Structured output, part 1: a JSON schema compiled into a JsonGrammar, the
// immutable description that a JsonMatcher (json_constraint.h) follows byte
// by byte to constrain decoding (OpenAI's response_format json_schema and
// json_object, and the arguments of tool calls). The idea is llama.cpp's
// "JSON schema to grammar", kept as a small pushdown automaton instead of a
// text grammar.
//
//   absl::StatusOr<JsonGrammar> g = CompileJsonSchema(schema);
//   if (!g.ok()) return HTTP 400 with g.status().message();
//   JsonMatcher m(*g);   // one per sequence; *g must outlive it
//
// Supported keywords (the rest is refused, see Errors):
// - type: "object", "array", "string", "integer", "number", "boolean",
//   "null", or an array of them. Absent: any type, and each keyword below
//   applies to its own type only (as in JSON schema).
// - properties, required, additionalProperties (false: only the listed
//   properties; true or absent: other keys too, each with any JSON value; a
//   schema: other keys with values matching it). Properties may come in any
//   order, each at most once; `}` only once every required one is present.
// - items (one schema for every element), minItems, maxItems.
// - minLength, maxLength: in code points; an escape, even a surrogate pair
//   written as two \u escapes, counts as one.
// - minimum, maximum: with type "integer" only (enforced digit by digit: a
//   prefix is accepted only if some completion of it is in range). Bounds
//   that are not whole numbers are rounded inwards.
// - enum, const: any JSON values, matched as their compact serialization
//   (nlohmann's dump(): no whitespace, only the escapes it writes, floats as
//   it prints them). May be combined with `type`, which filters the values,
//   but with no other validation keyword.
// - anyOf; oneOf is treated as anyOf (exclusivity is not enforced). Neither
//   may be combined with validation keywords at the same level.
// - $ref to "#", "#/$defs/NAME" or "#/definitions/NAME" ($defs and
//   definitions at the root only); recursion is allowed, bounded by the
//   output nesting limit. No sibling validation keywords. A definition is
//   compiled (and checked) when first referenced; each $ref hop counts
//   towards kJsonSchemaMaxDepth.
// - Ignored annotations: title, description, default, examples, $schema,
//   $id, $comment, deprecated, readOnly, writeOnly, strict.
// - The schema `true` (and `{}`) accepts any JSON value.
//
// What the grammar accepts beyond the schema's own rules (stricter than
// JSON, so that a model cannot run on forever, and so that matching stays a
// small state):
// - Whitespace only where JSON allows it, and at most one byte of it in a
//   row, a space or a line break: compact and spaced JSON fit, indentation
//   does not. A model that is not trained on JSON otherwise pads every gap
//   with as much whitespace as it may (measured: the trained model, allowed
//   a line break and 16 spaces, used all 17 at every gap and ran out of
//   tokens before its value was complete).
// - Objects and arrays nest at most kJsonMaxDepth deep (the brackets inside
//   an enum/const literal do not count: a literal is matched as one unit).
// - Numbers: at most 20 integer digits, 16 fraction digits and 2 exponent
//   digits (so a number stays within double's range); no leading zeros.
//   "integer" has no fraction or exponent and lies in int64's range.
// - Strings: valid UTF-8 only, no raw control characters, the JSON escapes
//   (\" \\ \/ \b \f \n \r \t \uXXXX, surrogates in pairs), at most
//   kJsonMaxStringLength code points (maxLength is capped to it).
// - Object keys are written in canonical form (as dump() writes them: raw
//   UTF-8, escapes only for " \ and control characters, \u00xx in lower
//   case), so that a key is listed or not by its bytes alone. A listed
//   property appears at most once; repeats of other keys are not tracked.
//
// Errors: CompileJsonSchema returns INVALID_ARGUMENT, with a message naming
// the keyword and the JSON pointer of the schema node, e.g.
//   unsupported JSON-schema keyword "pattern" at /properties/name
// for unsupported keywords (pattern, format, multipleOf, exclusiveMinimum,
// patternProperties, not, allOf, if/then/else, minProperties, uniqueItems,
// tuple items, ...), malformed values, schema nodes that are neither an
// object nor `true`, `required` naming an unknown property when
// additionalProperties is false, empty ranges (minimum > maximum, ...),
// $ref that does not resolve or cycles without entering an object or array,
// a schema that accepts no value within the nesting limit, and inputs past
// the limits below (so bad input costs bounded time and memory).
//
// Invariant (what makes a token mask safe): every state the matcher reaches
// can still be completed to a whole value the grammar accepts, so a mask
// never leaves a sequence without an allowed token until IsComplete().
//
// Lifecycle and thread-safety: a JsonGrammar is immutable once built; share
// it (by const reference) among any number of matchers on any threads.
#ifndef MOECACHE_SERVICES_SERVING_JSON_SCHEMA_H_
#define MOECACHE_SERVICES_SERVING_JSON_SCHEMA_H_

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "nlohmann/json_fwd.hpp"

namespace moe::serving {

// Limits on the output (see above).
inline constexpr int kJsonMaxDepth = 32;
inline constexpr int kJsonMaxStringLength = 4096;
inline constexpr int kJsonMaxIntegerDigits = 20;
inline constexpr int kJsonMaxFractionDigits = 16;
inline constexpr int kJsonMaxExponentDigits = 2;
// Limits on the schema; past them CompileJsonSchema refuses it.
inline constexpr int kJsonSchemaMaxDepth = 64;              // nesting of schema objects
inline constexpr int kJsonSchemaMaxNodes = 2048;            // schema objects compiled
inline constexpr int kJsonSchemaMaxProperties = 64;         // per object
inline constexpr int kJsonSchemaMaxNameBytes = 256;         // per property name
inline constexpr int kJsonSchemaMaxEnumValues = 1024;       // per enum
inline constexpr int kJsonSchemaMaxLiteralBytes = 1 << 16;  // all enum/const text
inline constexpr int kJsonSchemaMaxAlternatives = 32;       // per anyOf, after expansion

namespace json_internal {

// A trie over bytes. Key tries: `value` is the property index a name ends
// at, `mask` the properties whose names pass through. Literal tries:
// `value` is 1 where a literal ends.
struct TrieNode {
  std::vector<std::pair<uint8_t, int32_t>> next;  // sorted by byte
  int32_t value = -1;
  uint64_t mask = 0;

  int32_t Child(uint8_t byte) const {
    for (const auto& [b, n] : next) {
      if (b == byte) return n;
    }
    return -1;
  }
};

struct Node {
  enum Kind : uint8_t { kUnion, kObject, kArray, kString, kInteger, kNumber, kLiteral };
  Kind kind = kUnion;
  // The fewest nested objects/arrays a value of this node needs; above
  // kJsonMaxDepth when none fits (the matcher never enters such a node).
  int32_t min_depth = 0;
  // Every node: the non-union nodes a value may take (a leaf: itself).
  std::vector<int32_t> leaves;
  // kUnion: its members, before expansion into `leaves`.
  std::vector<int32_t> members;
  // kObject.
  std::vector<int32_t> properties;  // property index -> node
  uint64_t required = 0;            // property indices
  int32_t additional = -1;          // node for other keys' values; -1: none
  int32_t key_trie = -1;            // canonical names, without quotes
  // kArray.
  int32_t items = -1;
  uint64_t min_items = 0, max_items = UINT64_MAX;
  // kString.
  uint32_t min_length = 0, max_length = kJsonMaxStringLength;
  // kInteger.
  int64_t minimum = INT64_MIN, maximum = INT64_MAX;
  // kLiteral: the root of its trie of compact serializations.
  int32_t literal_trie = -1;
};

}  // namespace json_internal

// Built only by CompileJsonSchema and AnyJsonObject (never empty); copyable
// and movable.
class JsonGrammar {
 public:
  int num_nodes() const { return static_cast<int>(nodes_.size()); }

  // Internal representation, read by JsonMatcher.
  const std::vector<json_internal::Node>& nodes() const { return nodes_; }
  const std::vector<json_internal::TrieNode>& tries() const { return tries_; }
  int32_t root() const { return root_; }

 private:
  friend class JsonGrammarBuilder;
  JsonGrammar() = default;
  std::vector<json_internal::Node> nodes_;
  std::vector<json_internal::TrieNode> tries_;
  int32_t root_ = -1;
};

// Compiles `schema` (the value of response_format.json_schema.schema, or a
// tool's parameters). INVALID_ARGUMENT as described in the header comment.
absl::StatusOr<JsonGrammar> CompileJsonSchema(const nlohmann::json& schema);

// For response_format json_object: any JSON value whose top level is an
// object (within the same output limits).
JsonGrammar AnyJsonObject();

}  // namespace moe::serving

#endif  // MOECACHE_SERVICES_SERVING_JSON_SCHEMA_H_

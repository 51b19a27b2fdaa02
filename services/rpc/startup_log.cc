#include "services/rpc/startup_log.h"

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/quant.h"

namespace moe::rpc {

std::string ShownAddress(const std::string& address, int bound_port) {
  if (bound_port == 0 || absl::StartsWith(address, "unix:") ||
      !absl::EndsWith(address, ":0")) {
    return address;
  }
  return absl::StrCat(address.substr(0, address.size() - 1), bound_port);
}

std::string HumanBytes(uint64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int unit = 0;
  while (v >= 1024 && unit < 4) {
    v /= 1024;
    ++unit;
  }
  if (unit == 0) return absl::StrCat(bytes, " B");
  return absl::StrFormat("%.*f %s", v < 10 ? 2 : 1, v, kUnits[unit]);
}

uint64_t AllExpertBytes(const ModelDescription& desc, const HeldExperts* held) {
  return held != nullptr ? held->total_bytes : desc.routed_expert_bytes();
}

std::string ModelSummary(const ModelDescription& desc,
                         const HeldExperts* held) {
  const ModelConfig& c = desc.config();
  absl::StatusOr<TensorView> embed = desc.Dense(TensorRole::kEmbed);
  // Lower case, as the flags spell them (--dtype bf16).
  auto name = [](DType d) { return absl::AsciiStrToLower(DTypeName(d)); };
  const std::string stored = absl::AsciiStrToLower(ExpertFormatsName(desc.all_expert_dtypes()));
  const std::string shown = held != nullptr ? absl::AsciiStrToLower(held->format) : stored;
  const std::string experts =
      shown == stored ? stored : absl::StrCat(shown, " (stored ", stored, ")");
  return absl::StrCat(ModelFamilyName(c.family), ", dense ",
                      embed.ok() ? name(embed->dtype) : "?", ", experts ",
                      experts, ", ", c.num_moe_layers(), " MoE layers x ",
                      c.num_experts, " experts of ",
                      desc.mixed_expert_dtypes() ? "up to " : "",
                      HumanBytes(held != nullptr ? held->block_bytes
                                                 : desc.bytes_per_expert()));
}

}  // namespace moe::rpc

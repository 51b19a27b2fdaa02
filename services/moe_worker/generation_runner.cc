#include "services/moe_worker/generation_runner.h"

#include <utility>

#include "services/moe_worker/generate_responses.h"
#include "services/serving/request_proto.h"

namespace moe::worker {
namespace {

// A transport's sink behind the serving core's: each Output as a
// GenerateResponse.
class ResponseAdapter : public serving::OutputSink {
 public:
  explicit ResponseAdapter(std::shared_ptr<ResponseSink> sink) : sink_(std::move(sink)) {}
  void Write(serving::Output output) override { sink_->Write(ToResponse(std::move(output))); }
  void Finish(const absl::Status& status) override { sink_->Finish(status); }
  bool Cancelled() const override { return sink_->Cancelled(); }

 private:
  std::shared_ptr<ResponseSink> sink_;
};

}  // namespace

absl::Status GenerationRunner::Submit(serving::Request request, absl::Time deadline,
                                      std::shared_ptr<ResponseSink> sink) {
  return runner_.Submit(std::move(request), deadline,
                        std::make_shared<ResponseAdapter>(std::move(sink)));
}

absl::Status GenerationRunner::Submit(const v1::GenerateRequest& request, absl::Time deadline,
                                      std::shared_ptr<ResponseSink> sink) {
  return Submit(serving::FromProto(request, serving::Transport::kGrpc), deadline,
                std::move(sink));
}

}  // namespace moe::worker

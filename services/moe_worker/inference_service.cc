#include "services/moe_worker/inference_service.h"

#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>

#include "services/rpc/rpc_util.h"

namespace moe::worker {
namespace {

using v1::GenerateResponse;

class GenerateCall;

// The half of a call the runner holds. It outlives the reactor if need be:
// the reactor deletes itself in OnDone, which comes only after Finish, and
// Finish is only ever started from here, after every write.
class CallStream : public ResponseSink {
 public:
  explicit CallStream(grpc::ServerWriteReactor<GenerateResponse>* reactor)
      : reactor_(reactor) {}

  void Write(GenerateResponse response) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (finish_started_ || cancelled_) return;
    pending_.push_back(std::move(response));
    Pump(lock);
  }

  void Finish(const absl::Status& status) override {
    std::unique_lock<std::mutex> lock(mu_);
    if (finish_requested_) return;
    finish_requested_ = true;
    finish_status_ = rpc::ToGrpcStatus(status);
    Pump(lock);
  }

  bool Cancelled() const override { return cancelled_.load(); }

  // Reactions, forwarded by the reactor.
  void OnWriteDone(bool ok) {
    std::unique_lock<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {  // the stream is broken: nothing more can be written
      cancelled_ = true;
      pending_.clear();
    }
    Pump(lock);
  }
  void OnCancel() { cancelled_ = true; }

 private:
  // Starts the next write, or Finish once nothing is left to write. The
  // gRPC call happens outside the lock (a reaction may run inline).
  void Pump(std::unique_lock<std::mutex>& lock) {
    if (writing_ || finish_started_) return;
    if (!pending_.empty()) {
      writing_ = true;
      current_ = std::move(pending_.front());
      pending_.pop_front();
      lock.unlock();
      reactor_->StartWrite(&current_);
      return;
    }
    if (finish_requested_) {
      finish_started_ = true;
      grpc::Status status = finish_status_;
      lock.unlock();
      reactor_->Finish(status);
    }
  }

  grpc::ServerWriteReactor<GenerateResponse>* const reactor_;
  std::mutex mu_;
  std::deque<GenerateResponse> pending_;
  GenerateResponse current_;  // being written; gRPC holds a pointer to it
  bool writing_ = false;
  bool finish_requested_ = false;
  bool finish_started_ = false;
  grpc::Status finish_status_;
  std::atomic<bool> cancelled_{false};
};

class GenerateCall : public grpc::ServerWriteReactor<GenerateResponse> {
 public:
  GenerateCall() : stream_(std::make_shared<CallStream>(this)) {}
  const std::shared_ptr<CallStream>& stream() { return stream_; }

  void OnWriteDone(bool ok) override { stream_->OnWriteDone(ok); }
  void OnCancel() override { stream_->OnCancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<CallStream> stream_;
};

}  // namespace

grpc::ServerWriteReactor<GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto* call = new GenerateCall();
  absl::Time deadline = absl::InfiniteFuture();
  if (context->deadline() != std::chrono::system_clock::time_point::max()) {
    deadline = absl::FromChrono(context->deadline());
  }
  absl::Status status = runner_->Submit(*request, deadline, call->stream());
  if (!status.ok()) call->Finish(rpc::ToGrpcStatus(status));
  return call;
}

grpc::ServerUnaryReactor* InferenceService::GetMetrics(
    grpc::CallbackServerContext* context, const v1::GetMetricsRequest* /*request*/,
    v1::GetMetricsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status;
  if (metrics_ != nullptr) {
    response->set_text(metrics_->Text());
  } else {
    status = absl::UnavailableError("this worker keeps no metrics");
  }
  reactor->Finish(rpc::ToGrpcStatus(status));
  return reactor;
}

}  // namespace moe::worker

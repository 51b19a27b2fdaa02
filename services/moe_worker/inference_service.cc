#include "services/moe_worker/inference_service.h"

#include <atomic>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/threads.h"
#include "services/rpc/rpc_util.h"

namespace moe::worker {

using v1::GenerateResponse;

// The half of a call the runner holds. It outlives the reactor if need be:
// the reactor deletes itself in OnDone, which comes only after Finish, and
// Finish is only ever started from here, after every write.
//
// The engine thread only queues: a write or finish it asks for is started
// by the service's StreamStarter thread (a gRPC write started from a thread
// runs its send inline there, a sendmsg that wakes the client and may wait
// on the transport's locks: 16 of them per batched step held the engine
// thread). The next write after each one is started from OnWriteDone, on
// gRPC's own thread.
class CallStream : public ResponseSink, public std::enable_shared_from_this<CallStream> {
 public:
  CallStream(grpc::ServerWriteReactor<GenerateResponse>* reactor, StreamStarter* starter)
      : reactor_(reactor), starter_(starter) {}

  void Write(GenerateResponse response) override {
    mu_.Lock();
    if (finish_started_ || cancelled_) {
      mu_.Unlock();
      return;
    }
    pending_.push_back(std::move(response));
    ScheduleLocked();
  }

  void Finish(const absl::Status& status) override {
    mu_.Lock();
    if (finish_requested_) {
      mu_.Unlock();
      return;
    }
    finish_requested_ = true;
    finish_status_ = rpc::ToGrpcStatus(status);
    ScheduleLocked();
  }

  bool Cancelled() const override { return cancelled_.load(); }

  // On the starter's thread.
  void Start() {
    mu_.Lock();
    scheduled_ = false;
    Pump();
  }

  // Reactions, forwarded by the reactor.
  void OnWriteDone(bool ok) {
    mu_.Lock();
    writing_ = false;
    if (!ok) {  // the stream is broken: nothing more can be written
      cancelled_ = true;
      pending_.clear();
    }
    Pump();
  }
  void OnCancel() { cancelled_ = true; }

 private:
  // Hands the stream to the starter unless a write is in flight (its
  // OnWriteDone starts the next) or it is handed already; releases mu_.
  void ScheduleLocked() ABSL_UNLOCK_FUNCTION(mu_) {
    const bool schedule = !writing_ && !scheduled_ && !finish_started_;
    scheduled_ = scheduled_ || schedule;
    mu_.Unlock();
    if (schedule) starter_->Schedule(shared_from_this());
  }

  // Starts the next write, or Finish once nothing is left to write; releases
  // mu_ on every path. The gRPC call happens outside the lock (a reaction
  // may run inline).
  void Pump() ABSL_UNLOCK_FUNCTION(mu_) {
    if (writing_ || finish_started_) {
      mu_.Unlock();
      return;
    }
    if (!pending_.empty()) {
      writing_ = true;
      current_ = std::move(pending_.front());
      pending_.pop_front();
      mu_.Unlock();
      reactor_->StartWrite(&current_);
      return;
    }
    if (!finish_requested_) {
      mu_.Unlock();
      return;
    }
    finish_started_ = true;
    grpc::Status status = finish_status_;
    mu_.Unlock();
    reactor_->Finish(status);
  }

  grpc::ServerWriteReactor<GenerateResponse>* const reactor_;
  StreamStarter* const starter_;
  absl::Mutex mu_;
  std::deque<GenerateResponse> pending_ ABSL_GUARDED_BY(mu_);
  // Being written; gRPC holds a pointer to it (written under mu_, read by
  // gRPC until OnWriteDone).
  GenerateResponse current_;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool scheduled_ ABSL_GUARDED_BY(mu_) = false;  // queued on the starter
  bool finish_requested_ ABSL_GUARDED_BY(mu_) = false;
  bool finish_started_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancelled_{false};
};

namespace {

class GenerateCall : public grpc::ServerWriteReactor<GenerateResponse> {
 public:
  explicit GenerateCall(StreamStarter* starter)
      : stream_(std::make_shared<CallStream>(this, starter)) {}
  const std::shared_ptr<CallStream>& stream() { return stream_; }

  void OnWriteDone(bool ok) override { stream_->OnWriteDone(ok); }
  void OnCancel() override { stream_->OnCancel(); }
  void OnDone() override { delete this; }

 private:
  std::shared_ptr<CallStream> stream_;
};

}  // namespace

StreamStarter::StreamStarter() : thread_([this] { Loop(); }) {}

StreamStarter::~StreamStarter() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

void StreamStarter::Schedule(std::shared_ptr<CallStream> stream) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(stream));
}

void StreamStarter::Loop() {
  NameThisThread("moe-streams");
  std::vector<std::shared_ptr<CallStream>> batch;
  while (true) {
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](StreamStarter* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
            return s->stop_ || !s->queue_.empty();
          },
          this));
      // Stops only with nothing queued: every finish asked for is started.
      if (queue_.empty()) return;
      batch.assign(std::make_move_iterator(queue_.begin()),
                   std::make_move_iterator(queue_.end()));
      queue_.clear();
    }
    for (const std::shared_ptr<CallStream>& s : batch) s->Start();
    batch.clear();
  }
}

grpc::ServerWriteReactor<GenerateResponse>* InferenceService::Generate(
    grpc::CallbackServerContext* context, const v1::GenerateRequest* request) {
  auto* call = new GenerateCall(&starter_);
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
